"""Fixtures of the offload tests: a fake clock, keys, tiers of every kind, Redis servers.

Redis: the shared server at 127.0.0.1:6379 (``KVGOV_TEST_REDIS_URL``) is used only
under a unique key prefix per test, and every key under it is deleted afterwards
(never FLUSHDB); where it is down, its tests skip with the reason printed, except
under ``CI=true``: CI here has Redis, as it has PostgreSQL, so a skip there would hide
a broken tier. Tests that kill Redis start their own ``redis-server`` on a free port
and kill only that one.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from kvgov.offload import (
    DiskTier,
    HostMemoryTier,
    LocalKEK,
    OffloadStore,
    RedisTier,
    SealedBlock,
    Tier,
)
from kvgov.offload.objects import decode, encode

SHARED_REDIS = os.environ.get("KVGOV_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
KEK = LocalKEK(bytes(range(32)))
START = 1_700_000_000.0
TIER_KINDS = ("host", "disk", "redis")


class FakeClock:
    """A clock tests move by hand: deadlines are exact, nothing sleeps."""

    def __init__(self, start: float = START) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@dataclass
class MemoryKeyStore:
    """A WrappedKeyStore in a dict (the SQL one is tested in tests/audit)."""

    rows: dict[str, Any] = dataclasses.field(default_factory=dict)

    def live(self, tenant: str) -> Any:
        return next(
            (r for r in self.rows.values() if r.tenant == tenant and r.destroyed_us is None), None
        )

    def get(self, key_id: str) -> Any:
        return self.rows.get(key_id)

    def create(
        self, *, key_id: str, tenant: str, kek_id: str, wrapped: bytes, created_us: int
    ) -> Any:
        existing = self.live(tenant)
        if existing is not None:
            return existing
        self.rows[key_id] = _Row(key_id, tenant, kek_id, wrapped, created_us, None)
        return self.rows[key_id]

    def destroy(self, tenant: str, destroyed_us: int) -> list[str]:
        ids = [k for k, r in self.rows.items() if r.tenant == tenant and r.destroyed_us is None]
        for k in ids:
            self.rows[k] = dataclasses.replace(
                self.rows[k], wrapped=None, destroyed_us=destroyed_us
            )
        return ids

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class _Row:
    key_id: str
    tenant: str
    kek_id: str
    wrapped: bytes | None
    created_us: int
    destroyed_us: int | None


@pytest.fixture()
def clock() -> FakeClock:
    """A hand-moved clock."""
    return FakeClock()


@pytest.fixture()
def key_store() -> MemoryKeyStore:
    """An in-memory wrapped-key store."""
    return MemoryKeyStore()


def _redis_reason(url: str) -> str | None:
    try:
        redis.Redis.from_url(url, socket_connect_timeout=1, socket_timeout=1).ping()
        return None
    except redis.RedisError as exc:
        return f"Redis not reachable at {url}: {exc}"


@pytest.fixture()
def redis_prefix() -> Iterator[str]:
    """A unique key prefix on the shared Redis; every key under it is deleted afterwards."""
    reason = _redis_reason(SHARED_REDIS)
    if reason is not None:  # printed by -ra
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI has Redis: this must not be skipped)")
        pytest.skip(reason)
    prefix = f"kvgov-test:{uuid.uuid4().hex}"
    yield prefix
    client = redis.Redis.from_url(SHARED_REDIS)
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class OwnRedis:
    """A redis-server this test started (no persistence), which it may kill and restart."""

    def __init__(self, workdir: Path) -> None:
        self.port = _free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._workdir = workdir
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self._proc = subprocess.Popen(
            ["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self._workdir)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        deadline = time.monotonic() + 10
        while _redis_reason(self.url) is not None:
            if time.monotonic() > deadline or self._proc.poll() is not None:
                raise RuntimeError(f"redis-server on port {self.port} did not start")
            time.sleep(0.02)

    def kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=10)
        self._proc = None


@pytest.fixture()
def own_redis(tmp_path: Path) -> Iterator[OwnRedis]:
    """A private redis-server on a free port, killed at the end."""
    if shutil.which("redis-server") is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed (CI has it: this must not be skipped)")
        pytest.skip("redis-server is not installed")
    server = OwnRedis(tmp_path)
    server.start()
    yield server
    server.kill()


@pytest.fixture()
def make_tier(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Callable[..., Tier]]:
    """Build a tier of a kind ("host", "disk", "redis"); closed at the end."""
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


class Raw:
    """An attacker's byte-level access to the object stored at a location of a tier."""

    def __init__(self, tier: Tier) -> None:
        self.tier = tier

    def read(self, location: bytes) -> bytes:
        """The encoded object at ``location``."""
        if isinstance(self.tier, DiskTier):
            return self.tier.path_of(location).read_bytes()
        if isinstance(self.tier, RedisTier):
            data = self.tier._client.get(self.tier.object_key(location))
            assert data is not None
            return bytes(data)
        obj = self.tier.get(location)
        assert obj is not None
        return encode(obj)

    def write(self, location: bytes, data: bytes) -> None:
        """Put ``data`` at ``location`` as the tier's own bytes (the index keeps its entry).

        The host tier holds objects, not bytes: ``data`` must decode there.
        """
        if isinstance(self.tier, DiskTier):
            self.tier.path_of(location).write_bytes(data)
        elif isinstance(self.tier, RedisTier):
            self.tier._client.set(self.tier.object_key(location), data)
        else:
            self.put_object(location, decode(data, tier="host", block_key=location))

    def put_object(self, location: bytes, obj: SealedBlock) -> None:
        """Put an object at ``location`` whatever block key its header names (host tier)."""
        index = self.tier._index  # type: ignore[attr-defined]
        info = dataclasses.replace(obj.info(), block_key=location)
        index.pop(location)
        index.add(info, obj)

    def truncate(self, location: bytes, n: int) -> None:
        """Cut ``n`` bytes off the end of the object (for the host tier: of its ciphertext)."""
        if isinstance(self.tier, DiskTier | RedisTier):
            self.write(location, self.read(location)[:-n])
        else:
            obj = self.tier.get(location)
            assert obj is not None
            self.put_object(location, dataclasses.replace(obj, ciphertext=obj.ciphertext[:-n]))
