"""A hybrid model on a real engine: full and sliding-window attention, two KV cache groups.

The tiny Gemma-2-shaped model (``vllm_cpu_tiny_model.write_hybrid``: four layers,
sliding-window (64 tokens, two blocks) and full attention alternating) served by
``LLM(...)`` in-process on the CPU, stock (kvgov's plugin excluded) and governed, one
engine each for the module. vLLM builds two KV cache groups (``HybridKVCacheCoordinator``:
a ``SlidingWindowManager`` and a ``FullAttentionManager``) over one pool of block ids; the
worker allocates each KV tensor once and lets a layer of each group view it.

vLLM 0.32 keeps a sliding-window group's blocks cached only at checkpoints
(``prefix_cache_retention_interval``; its default, 0, keeps almost none, and no prompt
longer than the window hits): the engines keep one every 128 tokens, so a shared prefix
hits (128 + 64 tokens) and the window's other blocks leave their request while it runs,
uncached. Checks, each on both engines (stock is the control that shows the test sees
the leak):

* a second tenant's request of the same prompt is served 0 cached tokens (stock: 192);
* after a request whose window slid, after capacity evictions and after
  ``purge_tenant``, every block holding KV is one a request holds or the cache keeps,
  in every group's tensors (``benchmarks/vllm_kv_probe.py`` reads them per group);
* after vLLM's own ``reset_prefix_cache`` no block has an owner: governed, every group's
  tensors read all zero; stock keeps the KV.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from vllm_cpu_env import BLOCK_SIZE, prompt

from .conftest import WINDOW_BLOCKS, windowed_engines
from .conftest import GroupEngines as Engines

pytestmark = [pytest.mark.vllm, pytest.mark.vllm_e2e]

KINDS = ["SlidingWindowSpec", "FullAttentionSpec"]  # the model's groups, in vLLM's order


@pytest.fixture(scope="module")
def hybrid_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    import vllm_cpu_tiny_model

    out = tmp_path_factory.mktemp("tiny-gemma2")
    vllm_cpu_tiny_model.write_hybrid(str(out))
    return out


@pytest.fixture(scope="module")
def engines(hybrid_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engines]:
    audit_url = f"sqlite:///{tmp_path_factory.mktemp('hybrid') / 'audit.db'}"
    with windowed_engines(hybrid_model, audit_url, KINDS) as engines:
        yield engines


def test_two_groups_one_pool(engines: Engines) -> None:
    """vLLM built a sliding-window and a full-attention group; each KV tensor is viewed by a
    layer of both, so a block id is one group's at a time."""
    for name in engines.by_name:
        state = engines.kv(name)
        assert state["num_blocks"] == WINDOW_BLOCKS
        assert [g["kind"] for g in state["groups"]] == KINDS, state["groups"]
        sliding, full = state["groups"]
        assert len(sliding["layers"]) == len(full["layers"]) == 2
        assert sliding["tensors"] == full["tensors"]


def test_no_kv_crosses_tenants_in_any_group(engines: Engines) -> None:
    """The same prompt, longer than the window, from two tenants: stock serves the second
    one the first one's KV (both groups' blocks), governed serves it nothing; the first
    tenant's second request hits its own."""
    engines.check_no_kv_crosses_tenants(prompt("hybrid shared", 200))


def test_window_slide_leaves_no_kv_behind(engines: Engines) -> None:
    """A request of 350 tokens slides its 64-token window over 11 blocks: the window's
    blocks it drops between the checkpoints leave their owner while it runs, uncached, and
    read zero after it (besides each group's partial tail)."""
    before = engines.stats()["tenants"].get("slider", {}).get("blocks_zeroized", 0)
    cached_before = set(engines.pool()["cached"])
    for name in engines.by_name:
        engines.generate(name, prompt("hybrid slide", 100), "slider", max_tokens=250)
    assert engines.remnants() == {kind: [] for kind in KINDS}
    kept = set(engines.pool()["cached"]) - cached_before
    zeroized = engines.stats()["tenants"]["slider"]["blocks_zeroized"] - before
    used = 2 * -(-350 // BLOCK_SIZE)  # both groups' blocks: 11 each
    print(f"\nslider: {used} blocks used, {len(kept)} kept cached, {zeroized} zeroized")
    assert zeroized == used - len(kept), "every block that left the request is kept or zeroed"
    assert zeroized > 2, "more than each group's tail: the window dropped blocks mid-request"
    engines.check_reset()


def test_evicted_blocks_read_zero_in_every_group(engines: Engines) -> None:
    """Distinct prompts need more than the 61 blocks (two groups' blocks a prompt)."""
    for i in range(8):  # 8 prompts of 16 blocks over both groups: 128 > 60
        for name in engines.by_name:
            engines.generate(name, prompt(f"hybrid evict {i}", 230), "initech")
    evictions = engines.stats()["total"]["evictions"]
    print(f"\ngoverned evictions {evictions}")
    assert evictions.get("capacity", 0) > 0, "the prompts evicted cached blocks"
    assert engines.remnants() == {kind: [] for kind in KINDS}
    engines.check_reset()


def test_purged_tenant_blocks_read_zero_in_every_group(engines: Engines) -> None:
    """``purge_tenant`` drops the tenant's cached blocks of both groups and orders them
    zeroed; the idle engine's next step zeroes them in the worker."""
    text = prompt("hybrid purge", 200)
    before = set(engines.pool()["cached"])
    engines.generate("governed", text, "umbrella")
    cached = set(engines.pool()["cached"]) - before
    assert len(cached) > 200 // BLOCK_SIZE, "blocks of both groups cached"
    report = engines.core.call_utility("kvgov_call", "purge_tenant", "umbrella")
    assert report["blocks_zeroized"] >= len(cached), report
    assert engines.remnants() == {kind: [] for kind in KINDS}
    pool = engines.pool()
    assert not cached & (set(pool["cached"]) | set(pool["owned"])), "purged from the cache"
    for kind, ids in engines.per_group("governed").items():
        assert not cached & ids, f"purged blocks read zero in the {kind} group's tensors"
    assert engines.generate("governed", text, "umbrella") == 0, "nothing of umbrella is left"
