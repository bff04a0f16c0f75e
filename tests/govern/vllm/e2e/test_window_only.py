"""A model whose every layer has a window, on a real engine: one sliding-window KV group.

vLLM's CPU runner zeroes the KV tensors of full-attention layers only, so on the CPU build
a model with no full-attention layer would have its freed blocks ordered zeroed and never
cleared: kvgov's plugin replaces that zeroer with one that clears every attention layer
(``fence.install_cpu_zeroer``), and the governed engine starts. The tiny Gemma-2-shaped
model of ``test_hybrid.py`` with the 64-token window on all four layers
(``vllm_cpu_tiny_model.write_hybrid(window_only=True)``), stock and governed
``LLM(...)`` side by side, checkpoints every 128 tokens as there:

* a second tenant's request of the same prompt is served 0 cached tokens (stock: its KV);
* after a request whose window slid and after ``purge_tenant`` every block holding KV is
  one a request holds or the cache keeps;
* after vLLM's ``reset_prefix_cache`` governed reads all zero; stock keeps the KV (the
  control: vLLM's own CPU zeroer would have left it too).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from vllm_cpu_env import BLOCK_SIZE, prompt

from .conftest import GroupEngines, engine_pair, start_llm

pytestmark = [pytest.mark.vllm, pytest.mark.vllm_e2e]

NUM_BLOCKS = 61
RETENTION = 128  # tokens between the sliding-window checkpoints vLLM keeps cached
KINDS = ["SlidingWindowSpec"]  # one group: no full-attention layer


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GroupEngines]:
    import vllm_cpu_tiny_model

    model = tmp_path_factory.mktemp("tiny-gemma2-windows")
    vllm_cpu_tiny_model.write_hybrid(str(model), window_only=True)
    audit_url = f"sqlite:///{tmp_path_factory.mktemp('windows') / 'audit.db'}"

    def start(governed: bool) -> Any:
        return start_llm(
            model,
            governed,
            {"audit_url": audit_url, "model_revision": "r1"},
            prefix_cache_retention_interval=RETENTION,
            num_gpu_blocks_override=NUM_BLOCKS,
        )

    with engine_pair(start) as pair:
        yield GroupEngines(*pair, KINDS)


def test_one_window_group_and_no_full_attention(engines: GroupEngines) -> None:
    for name in engines.by_name:
        state = engines.kv(name)
        assert [g["kind"] for g in state["groups"]] == KINDS, state["groups"]


def test_no_kv_crosses_tenants_and_a_slid_window_leaves_none(engines: GroupEngines) -> None:
    text = prompt("windows shared", 200)
    hits = {
        name: [
            engines.generate(name, text, "acme"),
            engines.generate(name, text, "globex"),
            engines.generate(name, text, "acme"),
        ]
        for name in engines.by_name
    }
    print(f"\ncached tokens acme, globex, acme: {hits}")
    assert hits["stock"][1] > 2 * BLOCK_SIZE, "control: stock serves globex acme's KV"
    assert hits["governed"][1] == 0
    assert hits["governed"][2] == hits["stock"][2] > 0
    for name in engines.by_name:  # 350 tokens: the window drops blocks mid-request
        engines.generate(name, prompt("windows slide", 100), "slider", max_tokens=250)
    assert engines.remnants() == {kind: [] for kind in KINDS}
    engines.check_reset()


def test_purged_tenant_blocks_read_zero(engines: GroupEngines) -> None:
    text = prompt("windows purge", 200)
    before = set(engines.pool()["cached"])
    engines.generate("governed", text, "umbrella")
    cached = set(engines.pool()["cached"]) - before
    assert cached, "the window's checkpoint blocks are cached"
    report = engines.core.call_utility("kvgov_call", "purge_tenant", "umbrella")
    assert report["blocks_zeroized"] >= len(cached), report
    assert engines.remnants() == {kind: [] for kind in KINDS}
    (ids,) = engines.per_group("governed").values()
    assert not cached & ids, "purged blocks read zero"
    assert engines.generate("governed", text, "umbrella") == 0, "nothing of umbrella is left"
