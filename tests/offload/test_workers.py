"""Two workers (two stores) sharing one Redis tier and one SQL key store.

A block worker A offloads is restored by worker B for the same block key, scope
digest and tenant, and never for another scope or tenant. The key store is SQLite
here, and PostgreSQL in the last test (the key store's own tests run on both).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from kvgov.audit import SqlWrappedKeyStore
from kvgov.offload import MissReason, OffloadStore, Tier
from tests.support.clock import START, FakeClock

from .conftest import KEK, REDIS_KINDS

SCOPE, OTHER = b"S" * 32, b"T" * 32
KV = b"worker A's KV " * 100


def _workers(
    url: str, make_tier: Callable[..., Tier], kind: str, clock: FakeClock
) -> Iterator[tuple[OffloadStore, OffloadStore]]:
    stores, keys = [], []
    for _ in "AB":
        ks = SqlWrappedKeyStore(url, auto_upgrade=True)
        keys.append(ks)
        tiers = [make_tier("host"), make_tier(kind)]  # the test's one prefix: one tier
        stores.append(OffloadStore(tiers, ks, KEK, clock=clock))
    yield stores[0], stores[1]
    for ks in keys:
        ks.close()


@pytest.fixture(params=REDIS_KINDS)
def workers(
    request: pytest.FixtureRequest,
    sqlite_url: str,
    make_tier: Callable[..., Tier],
    clock: FakeClock,
) -> Iterator[tuple[OffloadStore, OffloadStore]]:
    """Workers A and B: each its own host tier, key-store connection and ring; one Redis
    (a server, then a cluster)."""
    yield from _workers(sqlite_url, make_tier, request.param, clock)


def test_b_restores_what_a_offloaded_for_the_same_scope(
    workers: tuple[OffloadStore, OffloadStore],
) -> None:
    """A offloads; B, whose host tier is empty, restores it from Redis under the same key."""
    a, b = workers
    key_id = a.offload(b"k" * 32, SCOPE, "acme", START + 60, KV).key_id
    hit = b.restore(b"k" * 32, SCOPE, "acme")
    assert hit.hit and hit.tier == b.tier_names[1] and hit.payload == KV and hit.key_id == key_id


@pytest.mark.parametrize(
    ("scope", "tenant"), [(OTHER, "acme"), (SCOPE, "beta")], ids=["other-scope", "other-tenant"]
)
def test_b_never_restores_it_for_another_scope(
    workers: tuple[OffloadStore, OffloadStore], scope: bytes, tenant: str
) -> None:
    """Asked for by another scope or tenant on B, A's block is refused, and kept for acme."""
    a, b = workers
    a.offload(b"k" * 32, SCOPE, "acme", START + 60, KV)
    miss = b.restore(b"k" * 32, scope, tenant)
    assert not miss.hit and miss.reason is MissReason.MISBOUND
    assert b.restore(b"k" * 32, SCOPE, "acme").hit


def test_both_workers_seal_under_one_tenant_key(
    workers: tuple[OffloadStore, OffloadStore],
) -> None:
    """The first key either worker creates is the one both use (one live key per tenant)."""
    a, b = workers
    ka = a.offload(b"1" * 32, SCOPE, "acme", START + 60, KV).key_id
    kb = b.offload(b"2" * 32, SCOPE, "acme", START + 60, KV).key_id
    assert ka == kb
    assert a.restore(b"2" * 32, SCOPE, "acme").hit and b.restore(b"1" * 32, SCOPE, "acme").hit


def test_a_shred_on_one_worker_reaches_the_others_copies(
    workers: tuple[OffloadStore, OffloadStore], clock: FakeClock
) -> None:
    """A shreds acme: the shared copies are deleted, and B's restores miss."""
    a, b = workers
    a.offload(b"k" * 32, SCOPE, "acme", START + 60, KV)
    assert b.restore(b"k" * 32, SCOPE, "acme").hit
    report = a.shred("acme")
    assert report.deleted[a.tier_names[1]] == 1
    clock.advance(10)  # past B's key recheck
    assert not b.restore(b"k" * 32, SCOPE, "acme").hit


@pytest.mark.postgres
def test_workers_share_keys_through_postgresql(
    pg_url: str, make_tier: Callable[..., Tier], clock: FakeClock
) -> None:
    """With the key store on PostgreSQL, B restores A's block, for its scope only."""
    gen = _workers(pg_url, make_tier, "redis", clock)
    a, b = next(gen)
    try:
        a.offload(b"k" * 32, SCOPE, "acme", START + 60, KV)
        assert b.restore(b"k" * 32, SCOPE, "acme").payload == KV  # type: ignore[union-attr]
        assert not b.restore(b"k" * 32, OTHER, "acme").hit
    finally:
        gen.close()
