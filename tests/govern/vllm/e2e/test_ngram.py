"""Speculative decoding on a real engine: vLLM's n-gram proposer (3 draft tokens), governed.

The n-gram proposer runs on the CPU build (no drafter model, and no lookahead block
hashing, which is EAGLE's and MTP's: the draft tokens are scheduled as the request's next
tokens, their KV written into its blocks, a rejected draft's slots written again), so the
governed engine must keep the same guarantees with it on. Stock and governed
``LLM(...)`` on the tiny OPT model, one engine each for the module:

* the drafter really drafts: the governed engine's ``vllm:spec_decode_num_draft_tokens``
  grows over repetitive prompts (the proposer matches their n-grams);
* a second tenant's request of a prompt is served 0 cached tokens (stock, the control:
  192), the first tenant's second request hits its own;
* after requests with drafts every block holding KV is one the cache keeps, and after
  vLLM's ``reset_prefix_cache`` governed reads all zero (stock keeps the KV).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from vllm_cpu_env import BLOCK_SIZE, GOVERNED_SCHEDULER, KV_PROBE, MAX_MODEL_LEN, engine_env, prompt

from .conftest import SECRET

pytestmark = [pytest.mark.vllm, pytest.mark.vllm_e2e]

NUM_BLOCKS = 61
SPECULATIVE = {
    "method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_min": 2,
    "prompt_lookup_max": 3,
}


def _start(model: Path, governed: bool, audit_url: str) -> Any:
    from vllm import LLM

    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(engine_env(governed, {"KVGOV_KEY_SECRET": SECRET}))
    try:
        kwargs: dict[str, Any] = {}
        if governed:
            kwargs = {
                "scheduler_cls": GOVERNED_SCHEDULER,
                "additional_config": {"kvgov": {"audit_url": audit_url, "model_revision": "r1"}},
            }
        return LLM(
            model=str(model),
            served_model_name="governed" if governed else "stock",  # the metrics' label
            load_format="dummy",
            dtype="float32",
            block_size=BLOCK_SIZE,
            max_model_len=MAX_MODEL_LEN,
            enforce_eager=True,
            enable_prefix_caching=True,
            num_gpu_blocks_override=NUM_BLOCKS,
            worker_extension_cls=KV_PROBE,
            speculative_config=dict(SPECULATIVE),
            disable_log_stats=False,  # the draft counters
            **kwargs,
        )
    finally:
        os.environ.clear()
        os.environ.update(saved)


class Engines:
    def __init__(self, stock: Any, governed: Any) -> None:
        self.by_name = {"stock": stock, "governed": governed}
        self.core = governed.llm_engine.engine_core

    def generate(self, name: str, text: str, tenant: str, max_tokens: int = 4) -> int:
        from vllm import SamplingParams

        params = SamplingParams(
            max_tokens=max_tokens,
            temperature=0.0,
            ignore_eos=True,
            extra_args={
                "kvgov_tenant": tenant,
                "kvgov_classification": "internal",
                "kvgov_template": "sys-v1",
            },
        )
        (out,) = self.by_name[name].generate([text], params, use_tqdm=False)
        assert out.outputs[0].finish_reason != "error", out
        return int(out.num_cached_tokens or 0)

    def drafts(self) -> int:
        """The governed engine's draft tokens so far."""
        return sum(
            int(getattr(m, "value", 0))
            for m in self.by_name["governed"].get_metrics()
            if m.name == "vllm:spec_decode_num_draft_tokens"
            and m.labels.get("model_name") == "governed"
        )

    def nonzero(self, name: str) -> set[int]:
        (state,) = self.by_name[name].collective_rpc("kvgov_kv_state")
        return set(state["nonzero"])

    def remnants(self, settle: float = 5.0) -> list[int]:
        deadline = time.monotonic() + settle
        while True:
            pool = dict(self.core.call_utility("kvgov_call", "state"))
            left = sorted(self.nonzero("governed") - set(pool["owned"]) - set(pool["cached"]))
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.5)

    def after_reset(self, name: str, settle: float = 5.0) -> list[int]:
        assert self.by_name[name].reset_prefix_cache(), "nothing is running"
        deadline = time.monotonic() + (settle if name == "governed" else 1.0)
        while True:
            left = sorted(self.nonzero(name))
            if not left or time.monotonic() > deadline:
                return left
            time.sleep(0.5)


@pytest.fixture(scope="module")
def engines(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engines]:
    audit_url = f"sqlite:///{tmp_path_factory.mktemp('ngram') / 'audit.db'}"
    started = time.monotonic()
    stock = _start(tiny_model, False, audit_url)
    governed = None
    try:
        governed = _start(tiny_model, True, audit_url)
        print(f"\nLLM starts (both): {time.monotonic() - started:.0f} s")
        yield Engines(stock, governed)
    finally:
        for llm in (governed, stock):
            if llm is not None:
                llm.llm_engine.engine_core.shutdown()


def test_governed_ngram_speculation_keeps_isolation_and_zeroing(engines: Engines) -> None:
    drafts0 = engines.drafts()
    # a repetitive prompt: the proposer finds its n-grams and drafts 3 tokens a step
    text = " ".join(["loan risk model cache"] * 50)  # 200 tokens
    hits = {
        name: [
            engines.generate(name, text, "acme", max_tokens=40),
            engines.generate(name, text, "globex", max_tokens=40),
            engines.generate(name, text, "acme", max_tokens=40),
        ]
        for name in engines.by_name
    }
    for i in range(3):  # tails and drafts over distinct prompts too
        for name in engines.by_name:
            engines.generate(name, prompt(f"ngram {i}", 150) + " " + text[:100], "initech", 60)
    drafted = engines.drafts() - drafts0
    print(f"\ncached tokens acme, globex, acme: {hits}; governed draft tokens {drafted}")
    assert drafted > 0, "the n-gram proposer drafted on the governed engine"
    assert hits["stock"][1] > 0, "control: stock serves globex acme's KV"
    assert hits["governed"][1] == 0
    assert hits["governed"][2] > 0
    assert engines.remnants() == []
    stock, governed = engines.after_reset("stock"), engines.after_reset("governed")
    print(f"after reset_prefix_cache, blocks holding KV: stock {len(stock)}, governed {governed}")
    assert stock, "control: stock leaves the KV of blocks that left their owner"
    assert governed == []
