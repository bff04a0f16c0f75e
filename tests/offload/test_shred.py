"""Crypto-shredding: once a tenant's data key is destroyed, no copy anywhere decrypts."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from kvgov.audit import SqlWrappedKeyStore
from kvgov.offload import MissReason, OffloadStore, Tier
from tests.support.clock import START, FakeClock
from tests.support.offload import MemoryKeyStore, Raw

from .conftest import KEK, REDIS_KINDS, TIER_KINDS

SCOPE = b"S" * 32
KEYS = [bytes([i]) * 32 for i in range(1, 4)]


@pytest.fixture()
def every_tier(
    make_tier: Callable[..., Tier], make_store: Callable[..., OffloadStore]
) -> OffloadStore:
    """A store over host, disk, Redis and Redis Cluster tiers: three acme blocks, one beta."""
    store = make_store([make_tier(kind) for kind in TIER_KINDS])
    for k in KEYS:
        store.offload(k, SCOPE, "acme", START + 600, b"acme KV " * 128)
    store.offload(b"b" * 32, SCOPE, "beta", START + 600, b"beta KV " * 128)
    return store


def _leave_objects_in_place(store: OffloadStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every tier 'forget' to delete, as a replica, a disk remnant or a backup would."""
    for name in store.tier_names:
        monkeypatch.setattr(store._states[name].tier, "delete_by_tenant", lambda tenant: [])


def test_shred_names_the_destroyed_key_and_deletes_everywhere(every_tier: OffloadStore) -> None:
    """shred() returns the destroyed key id and the objects deleted per tier; beta is untouched."""
    key_id = every_tier.offload(b"x" * 32, SCOPE, "acme", START + 600, b"x").key_id
    report = every_tier.shred("acme")
    assert report.destroyed_key_ids == (key_id,) and report.unreachable == ()
    assert report.deleted == {kind: 4 for kind in TIER_KINDS}
    for k in KEYS:
        assert every_tier.restore(k, SCOPE, "acme").reason is MissReason.ABSENT  # type: ignore[union-attr]
    assert every_tier.restore(b"b" * 32, SCOPE, "beta").hit


def test_copies_left_in_every_tier_fail_to_decrypt_after_shred(
    every_tier: OffloadStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With every object left in place on purpose, each one is refused as KEY_DESTROYED."""
    _leave_objects_in_place(every_tier, monkeypatch)
    report = every_tier.shred("acme")
    assert len(report.destroyed_key_ids) == 1
    for k in KEYS:
        miss = every_tier.restore(k, SCOPE, "acme")
        assert not miss.hit and miss.reason is MissReason.KEY_DESTROYED
        assert [r.tier for r in miss.refusals] == list(TIER_KINDS)
    for name in every_tier.tier_names:
        assert every_tier.stats().tiers[name].refusals == {"key_destroyed": 3}
    assert every_tier.restore(b"b" * 32, SCOPE, "beta").hit


@pytest.mark.parametrize("kind", REDIS_KINDS)
def test_raw_copies_put_back_after_shred_fail_to_decrypt(
    kind: str,
    every_tier: OffloadStore,
    make_tier: Callable[..., Tier],
    make_store: Callable[..., OffloadStore],
    clock: FakeClock,
) -> None:
    """Bytes copied out of the shared tier before the shred (a backup) are refused after it."""
    redis_tier = every_tier._states[kind].tier
    backup = {k: Raw(redis_tier).read(k) for k in KEYS}
    every_tier.shred("acme")
    for k, data in backup.items():
        Raw(redis_tier).write(k, data)
    # a worker that never held the key, with the KEK and the key store, cannot open them
    fresh = make_store([make_tier(kind, prefix=redis_tier.prefix.split(":{")[0])])
    for k in KEYS:
        miss = fresh.restore(k, SCOPE, "acme")
        assert not miss.hit and miss.reason is MissReason.KEY_DESTROYED


@pytest.mark.parametrize("kind", REDIS_KINDS)
def test_a_worker_holding_the_key_stops_within_the_recheck_window(
    kind: str,
    every_tier: OffloadStore,
    make_tier: Callable[..., Tier],
    make_store: Callable[..., OffloadStore],
    clock: FakeClock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Worker B, which had unwrapped acme's key, refuses leftovers once its recheck is due."""
    redis_tier = every_tier._states[kind].tier
    prefix = redis_tier.prefix.split(":{")[0]
    b = make_store([make_tier(kind, prefix=prefix)], key_recheck_seconds=2)
    assert b.restore(KEYS[0], SCOPE, "acme").hit  # B now holds acme's key
    _leave_objects_in_place(every_tier, monkeypatch)
    every_tier.shred("acme")
    clock.advance(2)
    miss = b.restore(KEYS[1], SCOPE, "acme")
    assert not miss.hit and miss.reason is MissReason.KEY_DESTROYED


def test_after_a_shred_new_blocks_use_a_new_key(every_tier: OffloadStore) -> None:
    """The tenant's next offload creates a fresh data key; the old id stays destroyed."""
    old = every_tier.shred("acme").destroyed_key_ids[0]
    new = every_tier.offload(KEYS[0], SCOPE, "acme", START + 600, b"again").key_id
    assert new is not None and new != old
    assert every_tier.restore(KEYS[0], SCOPE, "acme").hit


def test_shred_with_the_sql_key_store(
    make_tier: Callable[..., Tier], clock: FakeClock, sqlite_url: str
) -> None:
    """End to end with the SQL key store: the destroyed row has no wrapped bytes left."""
    keys = SqlWrappedKeyStore(sqlite_url)
    try:
        store = OffloadStore([make_tier("host")], keys, KEK, clock=clock)
        key_id = store.offload(KEYS[0], SCOPE, "acme", START + 60, b"kv").key_id
        assert store.shred("acme").destroyed_key_ids == (key_id,)
        row = keys.get(key_id or "")
        assert row is not None and row.wrapped is None and row.destroyed_us is not None
    finally:
        keys.close()


def test_shredding_a_tenant_without_a_key(every_tier: OffloadStore) -> None:
    """A tenant that never offloaded has no key to destroy; the report says so."""
    report = every_tier.shred("nobody")
    assert report.destroyed_key_ids == () and sum(report.deleted.values()) == 0


def test_memory_key_store_fixture_is_the_protocol(key_store: MemoryKeyStore) -> None:
    """The test double keeps the protocol's one-live-key rule (guards the tests above)."""
    a = key_store.create(key_id="a", tenant="t", kek_id="k", wrapped=b"w", created_us=1)
    assert key_store.create(key_id="b", tenant="t", kek_id="k", wrapped=b"w", created_us=1) is a
