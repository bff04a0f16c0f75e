"""An encoder-decoder model on a real engine, prefix caching off: cross attention zeroed.

The tiny Whisper (``vllm_cpu_tiny_model.write_whisper``: one encoder and one decoder
layer) runs on the CPU build only without prefix caching (vLLM's
``CrossAttentionManager`` supports no caching) and with ``max_num_batched_tokens`` of at
least the encoder's 1,500 positions. vLLM builds a decoder self-attention group and a
cross-attention group; a request holds the cross-attention blocks of all 1,500 encoder
positions (47 blocks of 32) while it runs. Stock (kvgov's plugin excluded) and governed
``LLM(...)``, one engine each; the worker's tensors read back
(``benchmarks/vllm_kv_probe.py``):

* two tenants' requests (the same audio) finish: on governed every block of both groups
  reads zero once its request let it go, and each tenant's blocks were ordered zeroed;
  stock (the control) keeps the decoder KV and the cross-attention KV.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from . import conftest
from .conftest import engine_pair, start_llm

pytestmark = [pytest.mark.vllm, pytest.mark.vllm_e2e]

KINDS = ["FullAttentionSpec", "CrossAttentionSpec"]  # the model's groups, in vLLM's order
NUM_BLOCKS = 120  # a request holds 47 cross-attention blocks and its decoder's


class Engines(conftest.GroupEngines):
    def transcribe(self, name: str, tenant: str, seed: int = 0) -> int:
        """One request: a second of noise (16 kHz), the ``<|startoftranscript|>`` decoder
        prompt; the prompt tokens it was served from a cache."""
        import numpy as np
        from vllm import SamplingParams

        audio = np.random.default_rng(seed).standard_normal(16_000).astype(np.float32) / 10
        params = SamplingParams(
            max_tokens=8,
            temperature=0.0,
            ignore_eos=True,
            extra_args={
                "kvgov_tenant": tenant,
                "kvgov_classification": "internal",
                "kvgov_template": "sys-v1",
            },
        )
        request = {
            "encoder_prompt": {"prompt": "", "multi_modal_data": {"audio": (audio, 16_000)}},
            "decoder_prompt": "<|startoftranscript|>",
        }
        (out,) = self.by_name[name].generate([request], params, use_tqdm=False)
        assert out.outputs[0].finish_reason != "error", out
        return int(out.num_cached_tokens or 0)


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engines]:
    import vllm_cpu_tiny_model

    model = tmp_path_factory.mktemp("tiny-whisper")
    vllm_cpu_tiny_model.write_whisper(str(model))
    audit_url = f"sqlite:///{tmp_path_factory.mktemp('whisper') / 'audit.db'}"

    def start(governed: bool) -> Any:
        return start_llm(
            model,
            governed,
            {"audit_url": audit_url, "model_revision": "r1"},
            enable_prefix_caching=False,
            max_model_len=448,
            max_num_batched_tokens=2048,
            limit_mm_per_prompt={"audio": 1},
            num_gpu_blocks_override=NUM_BLOCKS,
        )

    with engine_pair(start) as pair:
        yield Engines(*pair, KINDS)


def test_cross_attention_blocks_read_zero_after_their_requests(engines: Engines) -> None:
    for name in engines.by_name:
        state = engines.kv(name)
        assert [g["kind"] for g in state["groups"]] == KINDS, state["groups"]
    hits = {
        name: [engines.transcribe(name, tenant) for tenant in ("acme", "globex")]
        for name in engines.by_name
    }
    assert hits == {"stock": [0, 0], "governed": [0, 0]}, hits
    stock = engines.per_group("stock")
    governed = engines.remnants()  # waits for the idle engine's zeroing step
    counts = {"stock": {k: len(v) for k, v in stock.items()},
              "governed": {k: len(v) for k, v in governed.items()}}  # fmt: skip
    print(f"\nblocks holding KV after the requests, per group: {counts}")
    assert all(stock[kind] for kind in KINDS), "control: stock leaves both groups' KV"
    assert len(stock["CrossAttentionSpec"]) >= 1500 // 32
    assert governed == {kind: [] for kind in KINDS}
    tenants = engines.stats()["tenants"]
    for tenant in ("acme", "globex"):  # each request's decoder and cross-attention blocks
        assert tenants[tenant]["blocks_zeroized"] > 1500 // 32, tenants
