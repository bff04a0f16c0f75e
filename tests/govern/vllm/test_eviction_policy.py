"""Eviction as policy in vLLM's own pool: priorities, durations, floors and caps order
vLLM's free queue (the native cache's scenarios of tests/govern/test_quotas.py)."""

from __future__ import annotations

from typing import Any

import pytest

from kvgov.exceptions import InvalidQuota

pytestmark = pytest.mark.vllm

#: 4 full blocks of 16 tokens; a resend reuses 3 (vLLM recomputes the last block).
BLOCKS = 4
FULL_HIT = (BLOCKS - 1) * 16


def tenants(**config: dict[str, Any]) -> dict[str, Any]:
    return {"policy_data": {"kvgov": {"config": {"tenants": config}}}}


def prompt(seed: int, blocks: int = BLOCKS) -> list[int]:
    return [seed, *range(1, blocks * 16)]  # the first token tells prompts apart


_n = 0


def send(vllm: Any, sched: Any, tenant: str, seed: int, **kw: Any) -> int:
    """Run one request to its end (one token generated: it holds only its prompt's
    blocks, allocated at once); the tokens it reused."""
    global _n
    _n += 1
    blocks = kw.pop("blocks", BLOCKS)
    kw.setdefault("max_tokens", 1)
    req = vllm.request(f"{tenant}-{seed}-{_n}", prompt(seed, blocks), tenant=tenant, **kw)
    hit: int = vllm.hit(sched, req)
    check(sched)
    return hit


def check(sched: Any) -> None:
    queue = sched.kvgov.pool.kvgov_governed
    if queue is not None:
        queue.kvgov_check()


def flood(vllm: Any, sched: Any, tenant: str, n: int, **kw: Any) -> None:
    for i in range(n):
        send(vllm, sched, tenant, 100 + i, **kw)


def victim_survives(vllm: Any, sched: Any, **victim: Any) -> bool:
    send(vllm, sched, "victim", 1, **victim)
    flood(vllm, sched, "noisy", 12)
    return send(vllm, sched, "victim", 1, **victim) == FULL_HIT


def evictions(vllm: Any, sched: Any, tenant: str) -> dict[str, int]:
    sched.kvgov.drain()
    out: dict[str, int] = {}
    for e in vllm.events(sched, type="eviction", tenant=tenant):
        out[e.details["reason"]] = out.get(e.details["reason"], 0) + len(e.block_ids)
    return out


def cached(sched: Any, tenant: str) -> int:
    n: int = sched.kvgov.stats(0).tenants[tenant].blocks_by_state.get("cached", 0)
    return n


def test_the_default_policy_leaves_vllms_queue_and_its_lru_order(vllm: Any) -> None:
    """The baseline: every priority 50, no quota: vLLM's own queue, and a flood evicts."""
    sched = vllm.scheduler(num_blocks=16)
    assert victim_survives(vllm, sched) is False
    pool = sched.kvgov.pool
    assert pool.kvgov_governed is None
    assert type(pool.free_block_queue).__name__ == "FreeKVCacheBlockQueue"
    assert evictions(vllm, sched, "victim") == {"capacity": BLOCKS}


def test_a_durable_high_priority_prefix_survives_a_low_priority_flood(vllm: Any) -> None:
    sched = vllm.scheduler(
        num_blocks=16, kvgov=tenants(victim={"priority": 90}, noisy={"priority": 10})
    )
    assert victim_survives(vllm, sched) is True
    assert evictions(vllm, sched, "victim") == {}
    assert set(evictions(vllm, sched, "noisy")) == {"priority"}


def test_a_requests_priority_hint_is_applied_within_its_tenants_cap(vllm: Any) -> None:
    """``kvgov_priority`` asks; the policy grants it up to the tenant's max_priority."""
    sched = vllm.scheduler(num_blocks=16)
    assert victim_survives(vllm, sched, xargs={"kvgov_priority": 90}) is True
    (adm, *_) = vllm.events(sched, type="admission", tenant="victim")
    assert adm.details["requested_priority"] == 90
    assert adm.details["priority"] == 90
    capped = vllm.scheduler(num_blocks=16, kvgov=tenants(victim={"max_priority": 50}))
    assert victim_survives(vllm, capped, xargs={"kvgov_priority": 90}) is False


@pytest.mark.parametrize("hint", [101, -1, "90", 9.5, True])
def test_a_malformed_priority_hint_is_refused(vllm: Any, hint: object) -> None:
    sched = vllm.scheduler(num_blocks=16)
    req = vllm.request("bad", prompt(1), xargs={"kvgov_priority": hint})
    final = vllm.run(sched, req).finals["bad"]
    assert "kvgov_priority must be an integer 0..100" in final.stop_reason


def test_a_tenant_at_its_cap_evicts_its_own_blocks_never_the_victims(vllm: Any) -> None:
    sched = vllm.scheduler(num_blocks=16, kvgov=tenants(noisy={"kv_cap": {"blocks": 8}}))
    assert victim_survives(vllm, sched) is True
    assert evictions(vllm, sched, "victim") == {}
    assert evictions(vllm, sched, "noisy").get("cap", 0) > 0
    assert cached(sched, "noisy") <= 8


def test_a_tenant_over_its_cap_loses_its_excess_at_once(vllm: Any) -> None:
    """Freed blocks beyond the cap are evicted when they are freed, oldest first."""
    sched = vllm.scheduler(num_blocks=32, kvgov=tenants(noisy={"kv_cap": {"blocks": 6}}))
    send(vllm, sched, "noisy", 1)
    send(vllm, sched, "noisy", 2)
    assert cached(sched, "noisy") == 6
    assert evictions(vllm, sched, "noisy") == {"cap": 2}
    assert send(vllm, sched, "noisy", 2) == FULL_HIT  # the newer prompt stays whole


def test_a_floor_keeps_the_victims_blocks_while_anything_else_can_go(vllm: Any) -> None:
    data = tenants(victim={"kv_floor": {"fraction": 0.25}}, noisy={"priority": 90})
    sched = vllm.scheduler(num_blocks=16, kvgov=data)
    assert victim_survives(vllm, sched) is True
    assert evictions(vllm, sched, "victim") == {}
    assert evictions(vllm, sched, "noisy").get("capacity", 0) > 0


def test_floor_pressure_is_the_reason_when_nothing_else_is_left(vllm: Any) -> None:
    sched = vllm.scheduler(num_blocks=9, kvgov=tenants(victim={"kv_floor": {"blocks": 4}}))
    send(vllm, sched, "victim", 1)
    send(vllm, sched, "noisy", 2, blocks=8)  # every block of the pool
    assert evictions(vllm, sched, "victim") == {"floor_pressure": BLOCKS}


def test_a_priority_decays_after_its_duration(vllm: Any, clock: Any) -> None:
    data = tenants(victim={"priority": 90, "priority_duration": 60})
    sched = vllm.scheduler(num_blocks=16, kvgov=data)
    assert victim_survives(vllm, sched) is True
    clock.advance(61)
    assert victim_survives(vllm, sched) is False  # the re-hit blocks kept their deadline


def test_a_hit_keeps_the_priority_the_blocks_were_cached_at(vllm: Any) -> None:
    """As in kvgov's own pool: the request that caches a block sets its priority."""
    sched = vllm.scheduler(num_blocks=16)
    send(vllm, sched, "victim", 1)  # cached at the default, 50
    assert send(vllm, sched, "victim", 1, xargs={"kvgov_priority": 90}) == FULL_HIT
    flood(vllm, sched, "noisy", 12)
    assert send(vllm, sched, "victim", 1, xargs={"kvgov_priority": 90}) < FULL_HIT


def test_floors_larger_than_the_pool_refuse_the_engine_at_start(vllm: Any) -> None:
    data = tenants(a={"kv_floor": {"blocks": 9}}, b={"kv_floor": {"fraction": 0.5}})
    with pytest.raises(InvalidQuota, match="add up to 17 blocks"):
        vllm.scheduler(num_blocks=16, kvgov=data)


def test_metrics_count_each_tenants_cached_blocks_and_quota_use(vllm: Any) -> None:
    data = tenants(a={"kv_floor": {"blocks": 8}, "kv_cap": {"blocks": 16}})
    sched = vllm.scheduler(num_blocks=32, kvgov=data)
    send(vllm, sched, "a", 1)
    stats = sched.kvgov.stats(0)
    assert stats.tenants["a"].blocks_by_state["cached"] == BLOCKS
    assert stats.quotas["a"].floor == 8 and stats.quotas["a"].cap == 16
