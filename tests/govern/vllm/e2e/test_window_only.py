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

import pytest
from vllm_cpu_env import prompt

from .conftest import GroupEngines, windowed_engines

pytestmark = [pytest.mark.vllm, pytest.mark.vllm_e2e]

KINDS = ["SlidingWindowSpec"]  # one group: no full-attention layer


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GroupEngines]:
    import vllm_cpu_tiny_model

    model = tmp_path_factory.mktemp("tiny-gemma2-windows")
    vllm_cpu_tiny_model.write_hybrid(str(model), window_only=True)
    audit_url = f"sqlite:///{tmp_path_factory.mktemp('windows') / 'audit.db'}"

    with windowed_engines(model, audit_url, KINDS) as engines:
        yield engines


def test_one_window_group_and_no_full_attention(engines: GroupEngines) -> None:
    for name in engines.by_name:
        state = engines.kv(name)
        assert [g["kind"] for g in state["groups"]] == KINDS, state["groups"]


def test_no_kv_crosses_tenants_and_a_slid_window_leaves_none(engines: GroupEngines) -> None:
    engines.check_no_kv_crosses_tenants(prompt("windows shared", 200))
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
