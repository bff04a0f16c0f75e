"""The shared Redis tier under the governed cache: Redis going down, two workers sharing it.

Redis here is a private ``redis-server`` this test kills (for the outage), or, for the
two workers, the shared server under a unique key prefix and then a private three-node
Redis Cluster; under ``CI=true`` a missing Redis fails instead of skipping
(tests/offload/conftest.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import redis
import torch

from kvgov.audit import AuditQueries
from kvgov.govern import GovernedKVCache
from kvgov.offload import RedisTier
from tests.support.redis import OwnRedis, RedisTarget

from .conftest import (
    block_keys,
    host_tier,
    make_scope,
    offload_tiers,
    push_out,
    tier_stats,
)

Factory = Callable[..., GovernedKVCache]
PROMPT = list(range(100, 113))  # 13 tokens: 3 full blocks of 4 and one partial
HOST_AND_REDIS = offload_tiers(internal=["host", "redis"])


def _write(cache: GovernedKVCache, seq_id: str, scope: Any) -> list[bytes]:
    """Admit, write recognizable KV, release; the plaintext bytes of the full blocks."""
    adm = cache.admit(seq_id, scope, PROMPT)
    plain = []
    for i, b in enumerate(adm.block_ids):
        view = cache.block(b)
        view.copy_(torch.arange(view.numel(), dtype=view.dtype).view_as(view) + 1000 * (i + 1))
        plain.append(view.contiguous().view(torch.uint8).numpy().tobytes())
    cache.release(seq_id)
    return plain[:3]


def test_redis_down_mid_run_degrades_to_the_host_tier_never_to_plaintext(
    make_offload_cache: Factory, own_redis: OwnRedis
) -> None:
    """Redis dies: the host tier goes on alone, the outage is counted, nothing crashes, and
    what Redis held before was ciphertext."""
    redis_tier = RedisTier(own_redis.url, 1 << 20, prefix="kvgov-test", timeout=0.2)
    cache = make_offload_cache(host_tier(), redis_tier, num_blocks=8, policy_data=HOST_AND_REDIS)
    acme, globex = make_scope(), make_scope(tenant="globex")
    plain = _write(cache, "a", acme)
    push_out(cache)
    assert tier_stats(cache, "redis").puts == 3
    client = redis.Redis.from_url(own_redis.url)
    for key, text in zip(block_keys(cache, acme, PROMPT), plain, strict=True):
        stored = client.get(redis_tier.object_key(key))
        assert stored is not None and text[:32] not in stored and text[-32:] not in stored
    client.close()

    own_redis.kill()
    _write(cache, "g", globex)
    push_out(cache)  # globex's blocks: sealed into the host tier only
    assert tier_stats(cache, "host").puts == 6
    assert tier_stats(cache, "redis").puts == 3
    redis_stats = tier_stats(cache, "redis")
    assert not redis_stats.available and redis_stats.unavailable >= 1
    for scope in (acme, globex):  # both restored from the host tier while Redis is down
        assert cache.admit(f"again-{scope.tenant}", scope, PROMPT).cached_tokens == 12
        cache.release(f"again-{scope.tenant}")
    cache._check_invariants()
    for tier in ("host", "redis"):  # plaintext went nowhere: every host object is sealed
        assert tier_stats(cache, tier).decrypt_failures == 0
    report = cache.purge_tenant("globex")  # the key dies even though Redis cannot be reached
    assert report.destroyed_key_ids and report.offload_unreachable == ("redis",)


def _worker(make_offload_cache: Factory, target: RedisTarget, worker_id: str) -> GovernedKVCache:
    """A worker: its own pool and host tier; the fleet's Redis tier, key store, secret and KEK."""
    shared = RedisTier(target.url, 1 << 20, prefix=target.prefix)
    return make_offload_cache(host_tier(), shared, policy_data=HOST_AND_REDIS, worker_id=worker_id)


def test_two_workers_share_one_redis_tier_for_the_same_scope_only(
    make_offload_cache: Factory, redis_target: RedisTarget, audit_url: str
) -> None:
    """What worker A offloaded, worker B restores from Redis for the same scope (audited in
    B's stream), and never for another scope."""
    a = _worker(make_offload_cache, redis_target, "worker-a")
    b = _worker(make_offload_cache, redis_target, "worker-b")
    scope = make_scope()
    plain = _write(a, "on-a", scope)
    push_out(a)
    for other in (make_scope(tenant="globex"), make_scope(model_revision="r2")):
        assert b.admit("other", other, PROMPT).cached_tokens == 0
        b.release("other")
    adm = b.admit("on-b", scope, PROMPT)
    assert adm.cached_tokens == 12
    for blk, text in zip(adm.block_ids[:3], plain, strict=True):
        assert b.block(blk).contiguous().view(torch.uint8).numpy().tobytes() == text
    assert tier_stats(b, "redis").hits == 3 and tier_stats(b, "host").hits == 0
    b.audit.flush()
    a.audit.flush()
    with AuditQueries(audit_url) as q:
        restores = list(q.events(type="offload_restore"))
        offloads = [e for e in q.events(type="offload", tenant="acme") if e.model_revision == "r1"]
    assert [(e.stream, e.tenant, e.requester_tenant, e.details["tier"]) for e in restores] == [
        ("worker-b", "acme", "acme", "redis")
    ]
    assert {(e.stream, e.details["tier"]) for e in offloads} == {
        ("worker-a", "host"),
        ("worker-a", "redis"),
    }
    assert restores[0].details["key_ids"] == [offloads[0].details["key_id"]]
