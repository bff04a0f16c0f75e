"""What ``verified`` rests on: every block a tenant (or a scope) wrote is FREE and zero after.

A purge, an invalidation, a rotation and a sweep claim their blocks are erased.
The claim is read off who wrote each block (the governor's owners) and the
pool's states, never off whether a block still carried a cache key: a held
block without a key (restricted data, a partial block, a tenant that caches
nothing, a key an earlier invalidation or rotation dropped) still holds the
tenant's bytes until its holder releases it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvgov.allocator import BlockState
from kvgov.audit import AuditQueries
from kvgov.govern import CacheScope, ErasureReport, GovernedKVCache

from .conftest import FakeClock, fill, make_scope, share_group, tenant_config

Factory = Callable[..., GovernedKVCache]
#: 3 full blocks of 4 tokens and a partial one.
PROMPT = list(range(100, 113))
#: Exactly 3 full blocks: every block of a running request carries a key.
FULL = list(range(300, 312))


def _running(cache: GovernedKVCache, seq_id: str, scope: CacheScope, tokens: list[int]) -> Any:
    adm = cache.admit(seq_id, scope, tokens)
    fill(cache, adm.block_ids)
    return adm


def _erasure_details(cache: GovernedKVCache, audit_url: str, report: ErasureReport) -> Any:
    cache.audit.flush()
    (event,) = [
        e
        for e in AuditQueries(audit_url).events(type="erasure", tenant=report.tenant)
        if e.event_id == report.event_id
    ]
    return event.details


def _check_unverified(
    cache: GovernedKVCache, audit_url: str, held: tuple[int, ...], report: ErasureReport
) -> None:
    """The report and the erasure event both say the purge is not verified, and how many held."""
    assert report.verified is False
    assert report.held_blocks == len(held)
    details = _erasure_details(cache, audit_url, report)
    assert details["verified"] is False
    assert details["held_blocks"] == len(held)
    assert all(cache.block(b).any() for b in held)  # the tenant's bytes are really still there
    assert cache.pool.states(list(held)) == [BlockState.OWNED] * len(held)


def _check_verified_after(cache: GovernedKVCache, audit_url: str, *seq_ids: str) -> None:
    """Once the holders are released, a second purge is verified and everything reads zero."""
    for seq_id in seq_ids:
        cache.release(seq_id)
    again = cache.purge_tenant("acme")
    assert again.verified is True and again.held_blocks == 0
    details = _erasure_details(cache, audit_url, again)
    assert details["verified"] is True and details["held_blocks"] == 0


def test_purge_with_a_running_restricted_request_is_not_verified(
    make_cache: Factory, audit_url: str
) -> None:
    """Restricted data is never keyed; the blocks a running request holds are still the tenant's."""
    cache = make_cache()
    adm = _running(cache, "r", make_scope(classification="restricted"), PROMPT)
    assert adm.cacheable is False
    report = cache.purge_tenant("acme")
    _check_unverified(cache, audit_url, adm.block_ids, report)
    _check_verified_after(cache, audit_url, "r")
    assert not any(cache.block(b).any() for b in adm.block_ids)


def test_purge_with_a_prompt_shorter_than_a_block_is_not_verified(
    make_cache: Factory, audit_url: str
) -> None:
    """A one-partial-block prompt has no key: its held block is still the tenant's."""
    cache = make_cache()
    adm = _running(cache, "s", make_scope(), [1, 2, 3])
    assert len(adm.block_ids) == 1
    report = cache.purge_tenant("acme")
    _check_unverified(cache, audit_url, adm.block_ids, report)
    _check_verified_after(cache, audit_url, "s")


def test_purge_of_a_tenant_that_caches_nothing_is_not_verified_while_it_runs(
    make_cache: Factory, audit_url: str
) -> None:
    """A tenant whose policy says ``cache: false`` keys nothing; its running request holds KV."""
    cache = make_cache(policy_data=tenant_config("acme", cache=False))
    adm = _running(cache, "c", make_scope(), PROMPT)
    assert adm.cacheable is False
    report = cache.purge_tenant("acme")
    _check_unverified(cache, audit_url, adm.block_ids, report)
    _check_verified_after(cache, audit_url, "c")


def test_purge_after_invalidate_dropped_the_keys_is_not_verified(
    make_cache: Factory, audit_url: str
) -> None:
    """An invalidation detached the running request's keyed blocks; they still hold its KV."""
    cache = make_cache()
    adm = _running(cache, "a", make_scope(), FULL)
    assert cache.invalidate(model_revision="r1").detached_blocks == len(adm.block_ids)
    report = cache.purge_tenant("acme")
    _check_unverified(cache, audit_url, adm.block_ids, report)
    _check_verified_after(cache, audit_url, "a")


def test_purge_after_rotate_secret_dropped_the_keys_is_not_verified(
    make_cache: Factory, audit_url: str
) -> None:
    """A secret rotation detached the running request's keyed blocks; they still hold its KV."""
    cache = make_cache()
    adm = _running(cache, "a", make_scope(), FULL)
    cache.rotate_secret(b"n" * 32)
    report = cache.purge_tenant("acme")
    _check_unverified(cache, audit_url, adm.block_ids, report)
    _check_verified_after(cache, audit_url, "a")


def test_purge_while_another_tenant_reuses_its_public_blocks_is_not_verified(
    make_cache: Factory, audit_url: str
) -> None:
    """acme's public blocks, hit by globex through a share group and unkeyed by an invalidation,
    are acme's bytes until globex releases them: the purge of acme is not verified until then."""
    cache = make_cache(policy_data=share_group("pub", "acme", "globex"))
    published = _running(cache, "p", make_scope(classification="public"), FULL)
    cache.release("p")
    reader = cache.admit("g", make_scope(tenant="globex", classification="public"), FULL)
    shared = tuple(b for b in reader.block_ids if b in published.block_ids)
    assert len(shared) == 2
    cache.invalidate(model_revision="r1")
    report = cache.purge_tenant("acme")
    _check_unverified(cache, audit_url, shared, report)
    _check_verified_after(cache, audit_url, "g")
    assert not any(cache.block(b).any() for b in published.block_ids)


def test_purge_with_nothing_held_is_verified(make_cache: Factory, audit_url: str) -> None:
    """Every block the tenant wrote is cached: the purge evicts all and reads them back zero."""
    cache = make_cache()
    adm = _running(cache, "a", make_scope(), PROMPT)
    cache.release("a")
    report = cache.purge_tenant("acme")
    assert report.verified is True and report.held_blocks == 0
    assert not any(cache.block(b).any() for b in adm.block_ids)
    details = _erasure_details(cache, audit_url, report)
    assert details["verified"] is True and details["held_blocks"] == 0


def test_purge_is_not_verified_when_a_block_reads_back_non_zero(make_cache: Factory) -> None:
    """The read-back of the erased blocks is part of the claim: a pool reading non-zero fails it."""
    cache = make_cache()
    _running(cache, "a", make_scope(), PROMPT)
    cache.release("a")
    cache.pool.read_back_zero = lambda block_ids: False  # type: ignore[method-assign]
    assert cache.purge_tenant("acme").verified is False


def _invalidation(cache: GovernedKVCache, audit_url: str, event_id: str) -> Any:
    cache.audit.flush()
    (event,) = [
        e for e in AuditQueries(audit_url).events(type="invalidation") if e.event_id == event_id
    ]
    return event.details


def test_invalidate_counts_the_matching_blocks_still_held(
    make_cache: Factory, audit_url: str
) -> None:
    """A running restricted request of the invalidated revision keeps its (unkeyed) blocks: the
    invalidation names them held and is not verified; once released, another one is."""
    cache = make_cache()
    cached = _running(cache, "a", make_scope(), PROMPT)
    cache.release("a")
    held = _running(cache, "r", make_scope(classification="restricted"), PROMPT)
    report = cache.invalidate(model_revision="r1")
    assert report.blocks_zeroized == 3
    assert report.held_blocks == len(held.block_ids) and report.verified is False
    details = _invalidation(cache, audit_url, report.event_id)
    assert details["held_blocks"] == len(held.block_ids) and details["verified"] is False
    assert not any(cache.block(b).any() for b in cached.block_ids[:3])
    cache.release("r")
    again = cache.invalidate(model_revision="r1")
    assert again.held_blocks == 0 and again.verified is True
    assert _invalidation(cache, audit_url, again.event_id)["verified"] is True


def test_invalidate_spares_and_ignores_other_scopes(make_cache: Factory) -> None:
    """Blocks of a scope that does not match are neither erased nor counted as held."""
    cache = make_cache()
    _running(cache, "r2", make_scope(model_revision="r2", classification="restricted"), PROMPT)
    _running(cache, "a", make_scope(), PROMPT)
    cache.release("a")
    report = cache.invalidate(model_revision="r1")
    assert report.held_blocks == 0 and report.verified is True


def test_sweep_event_says_the_expired_blocks_read_back_zero(
    make_cache: Factory, clock: FakeClock, audit_url: str
) -> None:
    """The retention sweep's event claims verification only from the blocks' states and bytes."""
    cache = make_cache(policy_data=tenant_config("acme", retention_seconds={"internal": 10}))
    adm = _running(cache, "a", make_scope(), PROMPT)
    cache.release("a")
    clock.advance(10)
    assert cache.sweep() == 3
    assert not any(cache.block(b).any() for b in adm.block_ids)
    _running(cache, "b", make_scope(), PROMPT)
    cache.release("b")
    clock.advance(10)
    cache.pool.read_back_zero = lambda block_ids: False  # type: ignore[method-assign]
    assert cache.sweep() == 3
    cache.audit.flush()
    sweeps = list(AuditQueries(audit_url).events(type="retention_sweep"))
    assert [e.details["verified"] for e in sorted(sweeps, key=lambda e: e.time)] == [True, False]
