"""Fixtures of the offload tests: a fake clock, keys, tiers of every kind, Redis servers.

Redis (:mod:`tests.support.redis`): the shared server at 127.0.0.1:6379 under a unique
key prefix per test, or a private ``redis-server``; the tier kind ``redis-cluster`` is
the same tier on a private three-node Redis Cluster (started once per session). Where
Redis is down (or ``redis-server`` is not installed) its tests skip with the reason
printed, except under ``CI=true``: CI here has Redis, as it has PostgreSQL, so a skip
there would hide a broken tier.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kvgov.offload import (
    DiskTier,
    HostMemoryTier,
    LocalKEK,
    OffloadStore,
    RedisTier,
    Tier,
)
from tests.support.clock import FakeClock
from tests.support.offload import MemoryKeyStore
from tests.support.redis import (  # noqa: F401 - shared fixtures
    SHARED_REDIS,
    OwnRedisCluster,
    own_redis,
    redis_cluster,
    redis_cluster_prefix,
    redis_prefix,
)

KEK = LocalKEK(bytes(range(32)))
#: Every kind of tier ("redis-cluster": the Redis tier on a Redis Cluster).
TIER_KINDS = ("host", "disk", "redis", "redis-cluster")
#: The Redis deployments the Redis tier runs on: one server, and a cluster.
REDIS_KINDS = ("redis", "redis-cluster")


@pytest.fixture()
def clock() -> FakeClock:
    """A hand-moved clock."""
    return FakeClock()


@pytest.fixture()
def key_store() -> MemoryKeyStore:
    """An in-memory wrapped-key store."""
    return MemoryKeyStore()


@pytest.fixture()
def make_tier(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Tier]]:
    """Build a tier of a kind (one of TIER_KINDS, named after it); closed at the end."""
    made: list[Tier] = []

    def make(kind: str, capacity: int = 1 << 20, name: str | None = None, **kw: Any) -> Tier:
        tier: Tier
        if kind == "host":
            tier = HostMemoryTier(capacity, name=name or "host", pin_memory=False, **kw)
        elif kind == "disk":
            root = tmp_path / f"disk-{uuid.uuid4().hex[:8]}"
            tier = DiskTier(root, capacity, name=name or "disk", **kw)
        elif kind == "redis":
            prefix = kw.pop("prefix", None) or request.getfixturevalue("redis_prefix")
            tier = RedisTier(SHARED_REDIS, capacity, name=name or "redis", prefix=prefix, **kw)
        elif kind == "redis-cluster":
            cluster: OwnRedisCluster = request.getfixturevalue("redis_cluster")
            prefix = kw.pop("prefix", None) or request.getfixturevalue("redis_cluster_prefix")
            tier = RedisTier(cluster.url, capacity, name=name or kind, prefix=prefix, **kw)
        else:  # pragma: no cover - a typo in a test
            raise ValueError(kind)
        made.append(tier)
        return tier

    yield make
    for tier in made:
        with contextlib.suppress(Exception):  # a tier whose server a test killed
            tier.close()


@pytest.fixture()
def make_store(
    clock: FakeClock, key_store: MemoryKeyStore
) -> Iterator[Callable[..., OffloadStore]]:
    """Build an OffloadStore over given tiers with the fixture clock, keys and KEK."""
    made: list[OffloadStore] = []

    def make(tiers: list[Tier], **kw: Any) -> OffloadStore:
        kw.setdefault("clock", clock)
        kw.setdefault("key_store", key_store)
        kw.setdefault("kek", KEK)
        store = OffloadStore(tiers, **kw)
        made.append(store)
        return store

    yield make
