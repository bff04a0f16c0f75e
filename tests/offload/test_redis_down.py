"""Redis down mid-run: offload degrades to the local tiers (or none), logged and counted.

Each test starts its own redis-server on a free port and kills that one; the shared
server is never touched.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import structlog
from structlog.testing import capture_logs

from kvgov.offload import MissReason, OffloadStore, PutOutcome, RedisTier, SealedBlock, Tier
from kvgov.offload import store as store_mod
from tests.support.clock import START, FakeClock
from tests.support.redis import OwnRedis

SCOPE = b"S" * 32
SECRET = b"PLAINTEXT-PROMPT-KV " * 64


class Spy:
    """Wraps a tier and keeps every object it was handed."""

    def __init__(self, tier: Tier) -> None:
        self.inner = tier
        self.seen: list[SealedBlock] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self.inner, name)

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def capacity_bytes(self) -> int:
        return self.inner.capacity_bytes

    def put(self, obj: SealedBlock, now_us: int) -> list[object]:
        self.seen.append(obj)
        return self.inner.put(obj, now_us)  # type: ignore[return-value]


@pytest.fixture()
def setup(
    monkeypatch: pytest.MonkeyPatch,
    own_redis: OwnRedis,
    make_tier: Callable[..., Tier],
    make_store: Callable[..., OffloadStore],
) -> tuple[OffloadStore, OwnRedis, Spy]:
    """A store over host and a Redis tier on the test's own server (timeouts short)."""
    # a fresh logger: one cached by an earlier test (configure_logging caches on first
    # use) keeps that test's processors, and capture_logs would not see its events
    monkeypatch.setattr(store_mod, "_log", structlog.get_logger("kvgov.offload"))
    redis_tier = Spy(RedisTier(own_redis.url, 1 << 20, prefix="kvgov-test", timeout=0.2))
    store = make_store([make_tier("host"), redis_tier], retry_seconds=5)
    return store, own_redis, redis_tier


def test_offload_degrades_to_the_local_tier_with_a_log_and_a_counter(
    setup: tuple[OffloadStore, OwnRedis, Spy],
) -> None:
    """After Redis dies, puts go to host only; one warning names the tier; counters rise."""
    store, server, _spy = setup
    assert store.offload(b"1" * 32, SCOPE, "acme", START + 60, SECRET).stored_in == (
        "host",
        "redis",
    )
    server.kill()
    with capture_logs() as logs:
        for i in range(2, 5):
            result = store.offload(bytes([i]) * 32, SCOPE, "acme", START + 60, SECRET)
            assert [p.outcome for p in result.puts] == [PutOutcome.STORED, PutOutcome.UNAVAILABLE]
    down = [e for e in logs if e["event"] == "offload tier unavailable"]
    assert len(down) == 1 and down[0]["tier"] == "redis" and down[0]["continuing_with"] == ["host"]
    stats = store.stats().tiers["redis"]
    assert not stats.available and stats.unavailable >= 3 and stats.stored_bytes is None
    got = store.restore(bytes([3]) * 32, SCOPE, "acme")
    assert got.hit and got.tier == "host", got


def test_restore_skips_a_dead_tier_and_misses_cleanly(
    setup: tuple[OffloadStore, OwnRedis, Spy],
) -> None:
    """A block only Redis held is a miss (UNAVAILABLE) when Redis is down; nothing raises."""
    store, server, _spy = setup
    store.offload(b"1" * 32, SCOPE, "acme", START + 60, SECRET, tiers={"redis"})
    server.kill()
    miss = store.restore(b"1" * 32, SCOPE, "acme")
    assert not miss.hit and miss.reason is MissReason.UNAVAILABLE
    report = store.delete_by_tenant("acme")
    assert report.unreachable == ("redis",)
    shred = store.shred("acme")  # the key dies even though Redis keeps its copies
    assert shred.destroyed_key_ids and shred.unreachable == ("redis",)
    assert store.sweep().unreachable == ("redis",)


def test_no_tier_left_stores_nothing_and_never_plaintext(
    own_redis: OwnRedis, make_store: Callable[..., OffloadStore]
) -> None:
    """With Redis the only tier and down, nothing is stored; the tier only ever saw ciphertext."""
    spy = Spy(RedisTier(own_redis.url, 1 << 20, prefix="kvgov-test", timeout=0.2))
    store = make_store([spy])
    store.offload(b"1" * 32, SCOPE, "acme", START + 60, SECRET)
    own_redis.kill()
    result = store.offload(b"2" * 32, SCOPE, "acme", START + 60, SECRET)
    assert [p.outcome for p in result.puts] == [PutOutcome.UNAVAILABLE]
    assert spy.seen and all(SECRET[:20] not in bytes(o.ciphertext) for o in spy.seen)


def test_the_tier_is_used_again_after_redis_returns(
    setup: tuple[OffloadStore, OwnRedis, Spy], clock: FakeClock
) -> None:
    """Once the skip (retry_seconds, jitter) passes and Redis is back, puts reach it again."""
    store, server, _spy = setup
    server.kill()
    store.offload(b"1" * 32, SCOPE, "acme", START + 60, SECRET)
    server.start()
    clock.advance(1)
    assert store.offload(b"2" * 32, SCOPE, "acme", START + 60, SECRET).stored_in == ("host",)
    clock.advance(6.5)  # the first skip is 5 s plus up to half as much again (jitter)
    with capture_logs() as logs:
        result = store.offload(b"3" * 32, SCOPE, "acme", START + 60, SECRET)
    assert result.stored_in == ("host", "redis")
    assert any(e["event"] == "offload tier available again" for e in logs)
    assert store.stats().tiers["redis"].available
