"""Retention, priority, erasure, invalidation and the sequence life cycle (with a fake clock)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from kvgov.audit import AuditQueries
from kvgov.exceptions import InvalidArgument, TenantPurging
from kvgov.govern import GovernedKVCache
from tests.support.clock import FakeClock

from .conftest import fill, make_scope, share_group, tenant_config

Factory = Callable[..., GovernedKVCache]
PROMPT = list(range(100, 113))  # 3 full blocks of 4 tokens and a partial one


def _cache_prompt(cache: GovernedKVCache, seq_id: str, scope: Any, tokens: list[int]) -> Any:
    adm = cache.admit(seq_id, scope, tokens)
    fill(cache, adm.block_ids)
    cache.release(seq_id)
    return adm


@pytest.mark.parametrize(
    ("classification", "ttl"), [("public", 86400), ("internal", 3600), ("confidential", 600)]
)
def test_blocks_expire_exactly_at_their_deadline(
    make_cache: Factory, clock: FakeClock, classification: str, ttl: int
) -> None:
    """A cached block lives its classification's retention, measured from when it became CACHED."""
    cache = make_cache()
    scope = make_scope(classification=classification)
    clock.advance(5)  # admission time must not matter, only release time
    adm = _cache_prompt(cache, "a", scope, PROMPT)
    clock.advance(ttl - 0.001)
    assert cache.sweep() == 0
    clock.advance(0.001)
    assert cache.sweep() == 3
    for b in adm.block_ids:
        assert not cache.block(b).any()
    assert cache.admit("b", scope, PROMPT).cached_tokens == 0
    assert cache.stats().tenants["acme"].evictions["expired"] == 3


def test_per_tenant_retention_override(make_cache: Factory, clock: FakeClock) -> None:
    """data.json's per-tenant retention overrides the classification default."""
    cache = make_cache(policy_data=tenant_config("acme", retention_seconds={"internal": 10}))
    _cache_prompt(cache, "a", make_scope(), PROMPT)
    _cache_prompt(cache, "b", make_scope(tenant="globex"), PROMPT)
    clock.advance(10)
    assert cache.sweep() == 3
    assert cache.stats().tenants["acme"].blocks_by_state["cached"] == 0
    assert cache.stats().tenants["globex"].blocks_by_state["cached"] == 3


def test_a_hit_restarts_the_retention_clock(make_cache: Factory, clock: FakeClock) -> None:
    """The deadline counts from the latest time a block became CACHED."""
    cache = make_cache(policy_data=tenant_config("acme", retention_seconds={"internal": 100}))
    scope = make_scope()
    _cache_prompt(cache, "a", scope, PROMPT)
    clock.advance(60)
    assert cache.admit("b", scope, PROMPT).cached_tokens == 12
    cache.release("b")
    clock.advance(60)
    assert cache.sweep() == 0
    clock.advance(40)
    assert cache.sweep() == 3


def test_eviction_order_is_priority_then_lru(make_cache: Factory) -> None:
    """Lower priority goes first; within a priority the least recently released goes first."""
    cache = make_cache(num_blocks=4)
    low_old = cache.admit("low-old", make_scope(), [1, 1, 1, 1, 0], priority=10)
    high = cache.admit("high", make_scope(), [2, 2, 2, 2, 0], priority=90)
    cache.release("low-old")
    cache.release("high")
    low_new = cache.admit("low-new", make_scope(), [3, 3, 3, 3, 0], priority=10)
    cache.release("low-new")
    evicted: list[int] = []
    for i in range(4):
        adm = cache.admit(f"x{i}", make_scope(tenant="globex"), [9, 9, 9, i])
        evicted.extend(adm.block_ids)
    cached = {low_old.block_ids[0], low_new.block_ids[0], high.block_ids[0]}
    order = [b for b in evicted if b in cached]
    assert order == [low_old.block_ids[0], low_new.block_ids[0], high.block_ids[0]]


def test_purge_erases_every_trace_of_the_tenant(make_cache: Factory, audit_url: str) -> None:
    """After purge nobody finds the tenant's blocks, they read zero, the report matches audit."""
    cache = make_cache(policy_data=share_group("pub", "acme", "globex"))
    own = _cache_prompt(cache, "a", make_scope(), PROMPT)
    published = _cache_prompt(cache, "p", make_scope(classification="public"), PROMPT)
    other = _cache_prompt(
        cache, "g", make_scope(tenant="globex", classification="confidential"), PROMPT
    )
    report = cache.purge_tenant("acme")
    assert report.blocks_zeroized == 6
    assert report.bytes_zeroized == 6 * cache.spec.bytes_per_block
    assert report.verified is True
    for b in (*own.block_ids[:3], *published.block_ids[:3]):
        assert not cache.block(b).any()
    assert cache.admit("a2", make_scope(), PROMPT).cached_tokens == 0
    public_globex = make_scope(tenant="globex", classification="public")
    assert cache.admit("g2", public_globex, PROMPT).cached_tokens == 0
    assert cache.block(other.block_ids[0]).any()  # another tenant's cache is untouched
    cache.audit.flush()
    queries = AuditQueries(audit_url)
    erasure = list(queries.events(type="erasure", tenant="acme"))
    assert [e.event_id for e in erasure] == [report.event_id]
    evictions = [e for e in queries.events(type="eviction", tenant="acme")]
    purged = sum(len(e.block_ids) for e in evictions if e.details["reason"] == "purged")
    assert purged == report.blocks_zeroized


def test_purge_marks_running_sequences(make_cache: Factory) -> None:
    """A running sequence of the purged tenant caches nothing and is zeroized at release."""
    cache = make_cache()
    running = cache.admit("run", make_scope(), PROMPT)
    fill(cache, running.block_ids)
    report = cache.purge_tenant("acme")
    assert report.in_flight_sequences == ("run",)
    assert report.detached_blocks == 3
    cache.release("run")
    for b in running.block_ids:
        assert not cache.block(b).any()
    assert cache.admit("again", make_scope(), PROMPT).cached_tokens == 0


def test_admission_during_purge_is_refused(make_cache: Factory) -> None:
    """While a tenant is being purged, its new admissions raise TenantPurging."""
    cache = make_cache()
    _cache_prompt(cache, "a", make_scope(), PROMPT)
    seen: list[BaseException] = []
    original = cache.pool.revoke

    def revoke_and_try_to_admit(*args: Any, **kwargs: Any) -> Any:
        worker = threading.Thread(target=lambda: _try_admit(cache, seen))
        worker.start()
        worker.join()
        return original(*args, **kwargs)

    cache.pool.revoke = revoke_and_try_to_admit  # type: ignore[method-assign]
    cache.purge_tenant("acme")
    assert len(seen) == 1 and isinstance(seen[0], TenantPurging)


def _try_admit(cache: GovernedKVCache, seen: list[BaseException]) -> None:
    try:
        cache.admit("during", make_scope(), PROMPT)
    except BaseException as exc:
        seen.append(exc)


def test_invalidation_spares_other_revisions(make_cache: Factory, audit_url: str) -> None:
    """Invalidating r1 drops r1 blocks and keeps r2 blocks reusable."""
    cache = make_cache()
    r1, r2 = make_scope(model_revision="r1"), make_scope(model_revision="r2")
    old = _cache_prompt(cache, "a", r1, PROMPT)
    _cache_prompt(cache, "b", r2, PROMPT)
    report = cache.invalidate(model="llama-3-8b", model_revision="r1")
    assert report.blocks_zeroized == 3
    for b in old.block_ids[:3]:
        assert not cache.block(b).any()
    assert cache.admit("c", r1, PROMPT).cached_tokens == 0
    assert cache.admit("d", r2, PROMPT).cached_tokens == 12
    assert cache.stats().tenants["acme"].evictions["invalidated"] == 3


def test_invalidation_needs_a_filter(make_cache: Factory) -> None:
    """invalidate() with no field would drop everything by accident: refused."""
    with pytest.raises(InvalidArgument):
        make_cache().invalidate()


def test_cancel_releases_without_caching(make_cache: Factory) -> None:
    """A cancelled sequence's blocks are zeroized, not cached."""
    cache = make_cache()
    adm = cache.admit("a", make_scope(), PROMPT)
    fill(cache, adm.block_ids)
    assert cache.cancel("a") is True
    assert cache.cancel("a") is False
    for b in adm.block_ids:
        assert not cache.block(b).any()
    assert cache.admit("b", make_scope(), PROMPT).cached_tokens == 0


def test_reconcile_frees_exactly_the_orphans(make_cache: Factory, audit_url: str) -> None:
    """Sequences the caller no longer knows are released and counted; the rest stay."""
    cache = make_cache()
    for s in ("keep-1", "lost-1", "keep-2", "lost-2"):
        cache.admit(s, make_scope(), [hash(s) % 1000, 1, 2, 3, 4])
    report = cache.reconcile(["keep-1", "keep-2", "unknown-to-us"])
    assert sorted(report.orphaned) == ["lost-1", "lost-2"]
    assert report.blocks_released == 4
    stats = cache.stats()
    assert stats.orphans_recovered == 2 and stats.live_sequences == 2
    cache.audit.flush()
    lifecycle = list(AuditQueries(audit_url).events(type="lifecycle"))
    assert sorted(e.sequence_id for e in lifecycle if e.details["reason"] == "orphaned") == [
        "lost-1",
        "lost-2",
    ]


def test_sweeper_thread_expires_blocks(make_cache: Factory, clock: FakeClock) -> None:
    """start_sweeper runs sweep on a daemon thread with the injected clock."""
    cache = make_cache(policy_data=tenant_config("acme", retention_seconds={"internal": 1}))
    _cache_prompt(cache, "a", make_scope(), PROMPT)
    clock.advance(2)
    cache.start_sweeper(0.01)
    with pytest.raises(InvalidArgument):
        cache.start_sweeper(0.01)
    deadline = threading.Event()
    for _ in range(500):
        if cache.stats().total.evictions.get("expired") == 3:
            break
        deadline.wait(0.01)
    assert cache.stats().total.evictions.get("expired") == 3


def test_a_failing_sweep_does_not_end_the_sweeper(
    make_cache: Factory, clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep that raises is counted and logged; the next interval sweeps again."""
    cache = make_cache(policy_data=tenant_config("acme", retention_seconds={"internal": 1}))
    _cache_prompt(cache, "a", make_scope(), PROMPT)
    clock.advance(2)
    real = cache.sweep
    calls: list[int] = []

    def flaky() -> int:
        calls.append(1)
        if len(calls) == 1:
            raise RuntimeError("audit store hiccup")
        return real()

    monkeypatch.setattr(cache, "sweep", flaky)
    cache.start_sweeper(0.01)
    wait = threading.Event()
    for _ in range(500):
        if cache.stats().total.evictions.get("expired") == 3:
            break
        wait.wait(0.01)
    assert cache.stats().total.evictions.get("expired") == 3
    assert cache._sweeper is not None and cache._sweeper.failures == 1
    assert cache._sweeper.is_alive()
