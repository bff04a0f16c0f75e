"""GovernedKVCache.admit is all or nothing: a failure at any step after the lookup undoes it."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest

from kvgov.allocator import BlockState
from kvgov.audit import Deferred
from kvgov.exceptions import AuditUnavailable
from kvgov.govern import GovernedKVCache

from .conftest import fill, make_scope, share_group

Factory = Callable[..., GovernedKVCache]
PROMPT = list(range(100, 113))  # 13 tokens: 3 full blocks of 4 and one partial
#: PROMPT's 3 full blocks (hits), one new full block (keyed) and a partial one
LONGER = PROMPT[:12] + list(range(200, 207))


class Injected(RuntimeError):
    """The failure a test injects."""


def _fail(*_: Any, **__: Any) -> Any:
    raise Injected("injected")


#: (what fails, how it is made to fail on a cache)
STEPS: dict[str, Callable[[GovernedKVCache, pytest.MonkeyPatch], None]] = {
    "allocate": lambda c, mp: mp.setattr(c.pool, "allocate", _fail),
    "key the new blocks": lambda c, mp: mp.setattr(c.pool, "set_keys", _fail),
    "owner bookkeeping": lambda c, mp: mp.setattr(c, "_key_admitted", _fail),
    "record": lambda c, mp: mp.setattr(c.governor, "record_admission", _fail),
    "audit refuses": lambda c, mp: mp.setattr(
        c.governor,
        "record_admission",
        lambda *a, **k: (_ for _ in ()).throw(AuditUnavailable("down")),
    ),
}


@pytest.mark.parametrize("step", list(STEPS))
def test_a_failure_after_the_lookup_gives_every_reference_back(
    make_cache: Factory, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """The hit blocks are CACHED again, new blocks FREE and zero, no sequence is live."""
    cache = make_cache(num_blocks=8)
    scope = make_scope()
    first = cache.admit("first", scope, PROMPT)
    fill(cache, first.block_ids)
    cache.release("first")
    cached = first.block_ids[:3]
    before = cache.pool.counts()
    with monkeypatch.context() as mp:
        STEPS[step](cache, mp)
        with pytest.raises((Injected, AuditUnavailable)):
            cache.admit("second", scope, LONGER)
    assert [cache.pool.ref_count(b) for b in cached] == [0, 0, 0]
    assert all(cache.pool.state(b) is BlockState.CACHED for b in cached)
    assert cache.pool.counts() == before
    assert cache.stats().live_sequences == 0
    cache._check_invariants()
    cache.pool._check_invariants(check_zero=True)
    # nothing leaked: the same admission works now, and a purge reaches every block
    assert cache.admit("second", scope, LONGER).cached_tokens == 12
    cache.release("second")
    report = cache.purge_tenant(scope.tenant)
    assert report.blocks_zeroized == 4 and report.detached_blocks == 0 and report.verified


def test_a_failure_of_the_lookup_itself_takes_no_reference(
    make_cache: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sharing check that raises leaves the hit blocks unreferenced."""
    cache = make_cache(num_blocks=8)
    scope = make_scope()
    first = cache.admit("first", scope, PROMPT)
    cache.release("first")
    with monkeypatch.context() as mp:
        mp.setattr(cache._hits, "_check_sharing", _fail)
        with pytest.raises(Injected):
            cache.admit("second", scope, PROMPT)
    assert [cache.pool.ref_count(b) for b in first.block_ids[:3]] == [0, 0, 0]
    cache._check_invariants()


def _cross_tenant_setup(make_cache: Factory) -> tuple[GovernedKVCache, Any, tuple[int, ...]]:
    """acme caches a public prompt in a share group globex may read; returns globex's scope."""
    cache = make_cache(policy_data=share_group("pub", "acme", "globex"))
    adm = cache.admit("a", make_scope(classification="public"), PROMPT)
    fill(cache, adm.block_ids)
    cache.release("a")
    return cache, make_scope(tenant="globex", classification="public"), adm.block_ids[:3]


def test_a_cross_tenant_reuse_that_cannot_be_audited_is_undone(
    make_cache: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reuse event written nowhere: the admission raises and gives every block back."""
    cache, globex, cached = _cross_tenant_setup(make_cache)
    real = cache.audit.defer

    def failing(event: Any) -> Deferred:
        pending = real(event)
        return Deferred(pending.event_id, lambda: _raise(AuditUnavailable("disk full")))

    monkeypatch.setattr(cache.audit, "defer", failing)
    with pytest.raises(AuditUnavailable):
        cache.admit("b", globex, PROMPT)
    assert [cache.pool.ref_count(b) for b in cached] == [0, 0, 0]
    assert cache.stats().live_sequences == 0
    cache._check_invariants()


def test_the_reuse_audit_is_awaited_outside_the_lock(
    make_cache: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a cross-tenant reuse waits for its event to be durable, the lock is free."""
    cache, globex, _ = _cross_tenant_setup(make_cache)
    real = cache.audit.defer
    got_lock = threading.Event()

    def slow(event: Any) -> Deferred:
        pending = real(event)

        def wait() -> Any:
            t = threading.Thread(target=lambda: (cache.stats(), got_lock.set()))
            t.start()
            t.join(timeout=10)
            return pending.wait()

        return Deferred(pending.event_id, wait)

    monkeypatch.setattr(cache.audit, "defer", slow)
    assert cache.admit("b", globex, PROMPT).cached_tokens == 12
    assert got_lock.is_set(), "another thread waited for the lock while the audit event did"


def _raise(exc: BaseException) -> Any:
    raise exc
