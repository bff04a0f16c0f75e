"""Erasure and retention reach the offload tiers: purge (a crypto-shred), invalidate, sweep."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvgov.audit import AuditQueries
from kvgov.exceptions import KeyStoreUnavailable
from kvgov.govern import GovernedKVCache
from kvgov.offload import DiskTier, MissReason, RedisTier, Tier
from kvgov.offload.objects import decode
from tests.support.offload import Raw
from tests.support.redis import SHARED_REDIS

from .conftest import (
    block_keys,
    fill,
    host_tier,
    make_scope,
    offload_tiers,
    push_out,
    the_tier,
    tier_stats,
)

Factory = Callable[..., GovernedKVCache]
PROMPT = list(range(100, 113))  # 13 tokens: 3 full blocks of 4 and one partial
TIERS = ("host", "disk", "redis")
ACME = make_scope()


def _events(cache: GovernedKVCache, url: str, type: str) -> list[Any]:
    cache.audit.flush()
    with AuditQueries(url) as q:
        return list(q.events(type=type))


def _write(cache: GovernedKVCache, seq_id: str, scope: Any = ACME) -> None:
    adm = cache.admit(seq_id, scope, PROMPT)
    fill(cache, adm.block_ids)
    cache.release(seq_id)


@pytest.fixture()
def every_tier(make_offload_cache: Factory, tmp_path: Path, redis_prefix: str) -> GovernedKVCache:
    """A cache whose internal data goes to a host, a disk and a (shared, prefixed) Redis tier."""
    tiers: list[Tier] = [
        host_tier(),
        DiskTier(tmp_path / "disk", 1 << 20, fsync=False),
        RedisTier(SHARED_REDIS, 1 << 20, prefix=redis_prefix),
    ]
    return make_offload_cache(*tiers, policy_data=offload_tiers(internal=list(TIERS)))


def test_purge_shreds_the_key_first_and_copies_left_behind_do_not_decrypt(
    every_tier: GovernedKVCache, audit_url: str
) -> None:
    """Objects put back in every tier after the purge are refused: their key is destroyed."""
    cache = every_tier
    _write(cache, "a")
    push_out(cache)
    keys = block_keys(cache, ACME, PROMPT)
    kept = {t: {k: Raw(the_tier(cache, t)).read(k) for k in keys} for t in TIERS}
    report = cache.purge_tenant("acme")
    assert len(report.destroyed_key_ids) == 1
    assert dict(report.offload_deleted) == {"host": 3, "disk": 3, "redis": 3}
    assert report.offload_unreachable == ()
    (erasure,) = _events(cache, audit_url, "erasure")
    assert erasure.details["offload"] == {
        "shredded": True,
        "destroyed_key_ids": list(report.destroyed_key_ids),
        "deleted": {"host": 3, "disk": 3, "redis": 3},
        "unreachable": [],
    }
    for t in TIERS:  # left there on purpose: as an old backup or a replica would hold them
        tier = the_tier(cache, t)
        for k, data in kept[t].items():
            tier.put(decode(data, tier=t, block_key=k), 0)
    store = cache.governor.offload.store  # type: ignore[union-attr]
    for k in keys:
        got = store.restore(k, cache.governor.ledger.views.view(ACME).digest, "acme")
        assert not got.hit
        assert [(r.tier, r.reason) for r in got.refusals] == [
            (t, MissReason.KEY_DESTROYED) for t in TIERS
        ]


def test_after_a_purge_the_tenant_restores_nothing_and_gets_a_new_key(
    make_offload_cache: Factory, audit_url: str
) -> None:
    """The old objects are gone; new offloads are sealed under a new data key."""
    cache = make_offload_cache()
    _write(cache, "a")
    push_out(cache)
    (first,) = cache.purge_tenant("acme").destroyed_key_ids
    assert cache.admit("b", ACME, PROMPT).cached_tokens == 0
    cache.release("b")
    push_out(cache)
    offloads = _events(cache, audit_url, "offload")
    assert offloads[0].details["key_id"] == first
    assert offloads[-1].details["key_id"] != first


def test_a_purge_whose_key_cannot_be_destroyed_raises_and_is_audited(
    make_offload_cache: Factory, audit_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No erasure is claimed for the tiers: KeyStoreUnavailable, the device is zeroized all the
    same, the attempt is on record; a retry completes it."""
    cache = make_offload_cache()
    _write(cache, "a")
    push_out(cache)
    offload = cache.governor.offload
    assert offload is not None
    with monkeypatch.context() as mp:
        mp.setattr(
            offload.store, "shred", lambda t: (_ for _ in ()).throw(KeyStoreUnavailable("down"))
        )
        with pytest.raises(KeyStoreUnavailable):
            cache.purge_tenant("acme")
    (attempt,) = _events(cache, audit_url, "erasure")
    assert attempt.details["offload"]["shredded"] is False
    report = cache.purge_tenant("acme")
    assert report.destroyed_key_ids and report.offload_deleted == {"host": 3}


def test_a_purging_tenants_evicted_blocks_are_not_offloaded(make_offload_cache: Factory) -> None:
    """While a tenant is erased its blocks evicted for capacity are only zeroized."""
    cache = make_offload_cache()
    _write(cache, "a")
    cache.governor.ledger.purging.add("acme")
    try:
        push_out(cache)
    finally:
        cache.governor.ledger.purging.discard("acme")
    snap = cache.stats().offload
    assert snap is not None and snap.not_offloaded == {"purging": 3}
    assert tier_stats(cache).puts == 0


def test_invalidation_deletes_the_matching_scopes_objects_only(
    make_offload_cache: Factory, audit_url: str
) -> None:
    """invalidate(model_revision="r1") empties the tiers of r1 and keeps r2's objects."""
    cache = make_offload_cache(num_blocks=8)
    _write(cache, "r1", make_scope(model_revision="r1"))
    _write(cache, "r2", make_scope(model_revision="r2"))
    push_out(cache)
    report = cache.invalidate(model_revision="r1")
    assert dict(report.offload_deleted) == {"host": 3}
    (event,) = _events(cache, audit_url, "invalidation")
    assert event.details["offload"] == {"deleted": {"host": 3}, "unreachable": []}
    assert cache.admit("r1b", make_scope(model_revision="r1"), PROMPT).cached_tokens == 0
    assert cache.admit("r2b", make_scope(model_revision="r2"), PROMPT).cached_tokens == 12


def test_invalidation_reaches_scopes_this_worker_only_admitted(
    make_offload_cache: Factory,
) -> None:
    """A scope known only from an admission (its objects sealed elsewhere) is reached too."""
    cache = make_offload_cache()
    offload = cache.governor.offload
    assert offload is not None
    _write(cache, "a")
    push_out(cache)
    offload._scopes.clear()  # as if another worker had sealed them
    assert dict(cache.invalidate(model="llama-3-8b").offload_deleted) == {"host": 3}


def test_rotating_the_secret_empties_every_tier(
    make_offload_cache: Factory, audit_url: str
) -> None:
    """Every object's key was derived with the old secret: all are deleted, and audited."""
    cache = make_offload_cache(num_blocks=8)
    _write(cache, "a")
    _write(cache, "g", make_scope(tenant="globex"))
    push_out(cache)
    cache.rotate_secret(b"n" * 32)
    assert tier_stats(cache).stored_blocks == 0
    (event,) = _events(cache, audit_url, "secret_rotation")
    assert event.details["offload"]["deleted"] == {"host": 6}


def test_the_retention_deadline_travels_with_the_block_and_sweep_removes_it(
    make_offload_cache: Factory, clock: Any, audit_url: str
) -> None:
    """A tier object expires when the device block would have: sweep deletes it, audited."""
    cache = make_offload_cache()
    released = clock()
    _write(cache, "a")
    clock.advance(60)
    push_out(cache)
    infos = the_tier(cache).list_expired(2**62)
    assert {i.deadline_us for i in infos} == {int((released + 3600) * 1e6)}
    clock.advance(3600 - 60 - 1)
    assert cache.sweep() == 0 and tier_stats(cache).stored_blocks == 3
    clock.advance(1)
    assert cache.sweep() == 0
    assert tier_stats(cache).stored_blocks == 0 and tier_stats(cache).expired == 3
    (event,) = _events(cache, audit_url, "retention_sweep")
    assert event.details == {"expired": 0, "offload": {"deleted": {"host": 3}, "unreachable": []}}
    assert cache.admit("b", ACME, PROMPT).cached_tokens == 0
