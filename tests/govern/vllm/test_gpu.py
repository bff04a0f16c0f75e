"""A real engine on a GPU: freed blocks in the workers' KV tensors read zero under the binding.

Needs a CUDA device and a CUDA build of vLLM (0.32 or 0.33) with kvgov installed in its
environment (its general plugin must run in the worker): skipped elsewhere, with the
reason printed. A tiny OPT model with dummy weights and no tokenizer; prompts are token ids.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.gpu]

NUM_BLOCKS = 97  # prime: the KV tensors' block axis is the one of this size


def _nonzero_blocks(worker: Any) -> dict[str, Any]:
    """In the worker: ids of KV blocks holding any non-zero byte in any layer."""
    import torch

    found: set[int] = set()
    for kv in worker.model_runner.kv_caches:
        axis = list(kv.shape).index(NUM_BLOCKS)
        flat = kv.movedim(axis, 0).reshape(NUM_BLOCKS, -1)
        found.update(torch.nonzero((flat != 0).any(dim=1)).flatten().tolist())
    return {"nonzero": sorted(found)}


def _cuda_vllm_reason() -> str | None:
    try:
        import torch
        import vllm
    except ImportError as exc:
        return f"vLLM is not installed ({exc})"
    if not torch.cuda.is_available():
        return "no CUDA device (torch.cuda.is_available() is False)"
    try:
        import vllm._C  # noqa: F401  # the CUDA kernels
    except ImportError:
        return "this vLLM is not a CUDA build (vllm._C does not import)"
    return None


@pytest.fixture(scope="module")
def llm(model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Any:
    reason = _cuda_vllm_reason()
    if reason is not None:
        pytest.skip(reason)
    os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] = "1"  # collective_rpc of a plain function
    os.environ.setdefault("KVGOV_KEY_SECRET", "g" * 40)
    from vllm import LLM

    audit = tmp_path_factory.mktemp("audit") / "audit.db"
    engine = LLM(
        model=str(model_dir),
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype="float16",
        block_size=16,
        max_model_len=512,
        enforce_eager=True,
        enable_prefix_caching=True,
        num_gpu_blocks_override=NUM_BLOCKS,
        gpu_memory_utilization=0.3,
        scheduler_cls="kvgov.govern.vllm.GovernedScheduler",
        additional_config={"kvgov": {"audit_url": f"sqlite:///{audit}", "model_revision": "r1"}},
    )
    yield engine
    engine.llm_engine.engine_core.shutdown()


def _generate(llm: Any, tokens: list[int], tenant: str) -> Any:
    from vllm import SamplingParams

    params = SamplingParams(
        max_tokens=4,
        temperature=0.0,
        ignore_eos=True,
        detokenize=False,
        extra_args={
            "kvgov_tenant": tenant,
            "kvgov_classification": "internal",
            "kvgov_template": "t",
        },
    )
    (out,) = llm.generate([{"prompt_token_ids": tokens}], params, use_tqdm=False)
    return out


def _remnants(llm: Any) -> list[int]:
    import time

    time.sleep(0.5)  # the idle engine runs the step that carries the zeroing on its own
    core = llm.llm_engine.engine_core
    state = core.call_utility("kvgov_call", "state")
    nonzero = set(llm.collective_rpc(_nonzero_blocks)[0]["nonzero"])
    return sorted(nonzero - set(state["cached"]) - set(state["owned"]) - {0})


def test_freed_blocks_read_zero_in_the_workers(llm: Any) -> None:
    """After requests finish (tails freed), under eviction pressure and after a purge, every
    block holding KV bytes is a cached or owned one: nothing freed keeps a tenant's KV."""
    prompt = [(j * 37) % 1000 + 1 for j in range(170)]
    assert _generate(llm, prompt, "acme").num_cached_tokens == 0
    assert _generate(llm, prompt, "globex").num_cached_tokens == 0  # no cross-tenant hit
    assert _generate(llm, prompt, "acme").num_cached_tokens > 0
    assert _remnants(llm) == []
    for i in range(8):  # 97 blocks: distinct prompts evict cached blocks
        _generate(llm, [(i * 101 + j) % 1000 + 1 for j in range(230)], "initech")
    assert _remnants(llm) == []
    core = llm.llm_engine.engine_core
    report = core.call_utility("kvgov_call", "purge_tenant", "initech")
    assert report["blocks_zeroized"] > 0
    assert _remnants(llm) == []
    nonzero = set(llm.collective_rpc(_nonzero_blocks)[0]["nonzero"])
    assert not nonzero & set(core.call_utility("kvgov_call", "state")["pending_zero"])
