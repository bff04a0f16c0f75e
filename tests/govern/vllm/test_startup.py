"""What the governed scheduler refuses at start, and what it adopts from vLLM."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvgov.exceptions import UnsupportedEngine

pytestmark = pytest.mark.vllm

PROMPT = list(range(500, 660))


def _layout(managers: list[str], block_sizes: list[int]) -> tuple[Any, Any]:
    """A KV cache config and a hybrid coordinator as vLLM builds them (only what is read)."""
    from types import SimpleNamespace

    from vllm.v1.core import single_type_kv_cache_manager as managers_module
    from vllm.v1.core.kv_cache_coordinator import HybridKVCacheCoordinator

    coordinator = object.__new__(HybridKVCacheCoordinator)
    coordinator.single_type_managers = tuple(
        object.__new__(getattr(managers_module, name)) for name in managers
    )
    config = SimpleNamespace(
        kv_cache_groups=[
            SimpleNamespace(kv_cache_spec=SimpleNamespace(block_size=size)) for size in block_sizes
        ]
    )
    return config, coordinator


@pytest.mark.parametrize(
    ("managers", "sizes", "what"),
    [
        (["FullAttentionManager", "SinkFullAttentionManager"], [16, 16], "SinkFullAttention"),
        (["FullAttentionManager", "RSWAManager"], [16, 16], "RSWAManager"),
        (["FullAttentionManager", "SlidingWindowManager"], [16, 32], "blocks of 32 tokens"),
    ],
    ids=["sink-attention", "r-swa", "two-block-sizes"],
)
def test_a_cache_layout_kvgov_does_not_govern_is_refused(
    managers: list[str], sizes: list[int], what: str
) -> None:
    """Groups kvgov does not govern (attention sinks, R-SWA, partial-block caching across
    block sizes): refused at start, never run ungoverned (a Mamba group without kvgov's
    state zeroer: test_mamba.py)."""
    from kvgov.govern.vllm.groups import check_groups

    config, coordinator = _layout(managers, sizes)
    with pytest.raises(UnsupportedEngine, match=what):
        check_groups(config, coordinator, 16)


def test_the_governed_layouts_pass_the_check() -> None:
    """Full, sliding-window, chunked local and cross attention and Mamba state, in one
    hybrid cache."""
    from kvgov.govern.vllm.groups import GOVERNED_MANAGERS, check_groups

    names = [m.__name__ for m in GOVERNED_MANAGERS]
    config, coordinator = _layout(names, [16] * len(names))
    check_groups(config, coordinator, 16)


def test_a_kv_connector_keyed_by_tokens_is_refused(vllm: Any, tmp_path: Path) -> None:
    """A connector keyed by token ids alone would bypass the scoped keys: refused at start."""
    from vllm.config import KVTransferConfig

    connector = KVTransferConfig(
        kv_connector="ExampleConnector",
        kv_role="kv_both",
        kv_connector_extra_config={"shared_storage_path": str(tmp_path)},
    )
    with pytest.raises(UnsupportedEngine, match=r"KV connector .*ExampleConnector"):
        vllm.scheduler(kv_transfer_config=connector)


def test_lookahead_hashing_keys_the_tokens_after_each_block(
    vllm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EAGLE/MTP lookahead hashing (vLLM 0.33) is governed: a block's key also covers the
    token after it, in the request's scope, so a block is reused only by a request that
    continues it the same way (and never by another tenant)."""
    from kvgov.govern.vllm import fence

    if fence.VLLM_VERSION.startswith("0.32."):
        pytest.skip("vLLM 0.32 hashes no lookahead tokens (num_hash_lookahead_tokens is 0.33's)")
    monkeypatch.setattr(fence, "hash_lookahead_tokens", lambda config: 1)
    sched = vllm.scheduler()
    assert sched.kvgov.lookahead == 1
    first = vllm.request("first", PROMPT)  # 160 tokens: 10 blocks, 9 keyed (the 10th has no next)
    sched.add_request(first)
    assert len(first.block_hashes) == 9
    vllm.run(sched)
    same = [*PROMPT[:32], 7, *PROMPT[33:]]  # block 2 starts with another token
    assert vllm.hit(sched, vllm.request("other-next", same)) == 16  # block 1 no longer matches
    assert vllm.hit(sched, vllm.request("again", PROMPT)) == 144
    assert vllm.hit(sched, vllm.request("globex", PROMPT, tenant="globex")) == 0


@pytest.mark.parametrize(
    ("version", "ok"),
    [("0.32.0", True), ("0.33.1", True), ("0.31.2", False), ("0.34.0", False), ("1.0.0", False)],
)
def test_only_the_tested_vllm_minors_are_accepted(version: str, ok: bool) -> None:
    """0.32.x and 0.33.x run; any other version is refused with what to install."""
    from kvgov.govern.vllm import fence

    if ok:
        fence.check_version(version)
    else:
        with pytest.raises(UnsupportedEngine, match="kvgov\\[vllm\\]"):
            fence.check_version(version)


def test_without_the_plugin_the_scheduler_refuses_to_start(
    vllm: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """If kvgov's general plugin did not run, the workers would not zero: refuse to start."""
    from vllm.v1.kv_cache_interface import KVCacheConfig

    monkeypatch.setattr(
        KVCacheConfig, "needs_kv_cache_zeroing", property(lambda self: False), raising=True
    )
    with pytest.raises(UnsupportedEngine, match="plugin did not run"):
        vllm.scheduler()


def test_the_plugin_is_idempotent_and_forces_zeroing(vllm: Any) -> None:
    """Registering twice changes nothing; every KV cache config then asks for zeroing."""
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.kv_cache_interface import KVCacheConfig

    from kvgov.govern.vllm import plugin

    hook = EngineCore.preprocess_add_request
    plugin.register()
    assert EngineCore.preprocess_add_request is hook
    assert KVCacheConfig(
        num_blocks=1, kv_cache_tensors=[], kv_cache_groups=[]
    ).needs_kv_cache_zeroing


def test_the_governed_classes_adopt_vllms_objects(vllm: Any) -> None:
    """vLLM's pool and manager are re-classed in place: every reference stays the same object."""
    sched = vllm.scheduler()
    manager = sched.kv_cache_manager
    assert type(manager).__name__ == "GovernedKVCacheManager"
    assert type(manager.block_pool).__name__ == "GovernedBlockPool"
    assert manager.coordinator.block_pool is manager.block_pool
    assert all(b.pool is manager.block_pool for b in manager.block_pool.blocks)
    assert sched.kvgov_defers_hashing


def test_async_scheduling_gets_the_async_variant(vllm: Any) -> None:
    """Users name one class; with async scheduling on it hands back the governed async one."""
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler

    from kvgov.govern.vllm import GovernedAsyncScheduler

    sched = vllm.scheduler(async_scheduling=True)
    assert isinstance(sched, GovernedAsyncScheduler) and isinstance(sched, AsyncScheduler)
    vllm.run(sched, vllm.request("a", PROMPT))
    assert vllm.hit(sched, vllm.request("g", PROMPT, tenant="globex")) == 0
    assert vllm.hit(sched, vllm.request("a2", PROMPT)) == 144
    vllm.run(sched)
    assert vllm.worker(sched).remnants(sched) == []
    sched.kvgov.gov._check_invariants()


def test_kvgov_call_refuses_unknown_operations(vllm: Any) -> None:
    """The engine utility runs only the binding's operations, with their arguments."""
    from kvgov.exceptions import InvalidArgument

    sched = vllm.scheduler()
    with pytest.raises(InvalidArgument):
        sched.kvgov_call("shutdown")
    with pytest.raises(InvalidArgument):
        sched.kvgov_call("purge_tenant")
    with pytest.raises(InvalidArgument):
        sched.kvgov_call("invalidate", {"tenant": "acme"})
    assert sched.kvgov_call("sweep") == 0


def test_prefix_caching_off_still_governs_admission_and_zeroing(vllm: Any) -> None:
    """Without prefix caching nothing is hashed or reused, refusals and zeroing still hold."""
    sched = vllm.scheduler(caching=False)
    vllm.run(sched, vllm.request("a", PROMPT), vllm.request("b", PROMPT))
    assert vllm.run(sched, vllm.request("x", PROMPT, tenant=None)).finals["x"].stop_reason
    assert vllm.worker(sched).remnants(sched) == []
    assert len(vllm.events(sched, type="admission")) == 2


def test_a_governed_engine_does_not_hash_requests_twice(vllm: Any) -> None:
    """The plugin's engine hook gives a governed engine the deferred hasher (the scheduler
    hashes each request once, in its namespace); a stock engine keeps vLLM's."""
    from types import SimpleNamespace

    from vllm.v1.engine.core import EngineCore

    from kvgov.govern.vllm.requests import deferred_block_hasher

    vllm_hasher = object()
    for sched, expected in ((vllm.scheduler(), deferred_block_hasher), (vllm.stock(), vllm_hasher)):
        engine = SimpleNamespace(request_block_hasher=vllm_hasher, scheduler=sched)
        with pytest.raises((AttributeError, TypeError)):  # the rest needs a real engine
            EngineCore.preprocess_add_request(engine, None)
        assert engine.request_block_hasher is expected
