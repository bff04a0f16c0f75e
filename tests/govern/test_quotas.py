"""Eviction as policy in the native cache: caps, floors, priority durations, their
validation, the eviction reasons in the audit trail and the per-tenant metrics."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from kvgov.allocator import Quota
from kvgov.audit import AuditQueries
from kvgov.exceptions import InvalidQuota
from kvgov.govern import GovernedKVCache
from kvgov.govern.metrics import CacheCollector
from tests.support.clock import FakeClock

from .conftest import make_scope

Factory = Callable[..., GovernedKVCache]

#: 4 tokens a block: 16 tokens are 4 full blocks.
BLOCKS = 4


def tenants(**config: dict[str, Any]) -> dict[str, Any]:
    return {"kvgov": {"config": {"tenants": config}}}


def prompt(seed: int) -> list[int]:
    return [seed * 1000 + i for i in range(BLOCKS * 4)]


def cache_prompt(cache: GovernedKVCache, seq: str, tenant: str, seed: int) -> int:
    """Admit, release, return the tokens that hit."""
    hit = cache.admit(seq, make_scope(tenant=tenant), prompt(seed)).cached_tokens
    cache.release(seq)
    return hit


def flood(cache: GovernedKVCache, tenant: str, n: int) -> None:
    for i in range(n):
        cache_prompt(cache, f"{tenant}-{i}", tenant, 100 + i)


def victim_survives(cache: GovernedKVCache) -> bool:
    cache_prompt(cache, "victim-0", "victim", 1)
    flood(cache, "noisy", 12)
    # the last block is recomputed (a hit never covers the whole prompt)
    return cache_prompt(cache, "victim-1", "victim", 1) == (BLOCKS - 1) * 4


def evictions(audit_url: str, cache: GovernedKVCache, tenant: str) -> dict[str, int]:
    cache.audit.flush()
    out: dict[str, int] = {}
    for e in AuditQueries(audit_url).events(type="eviction", tenant=tenant):
        out[e.details["reason"]] = out.get(e.details["reason"], 0) + len(e.block_ids)
    return out


def test_without_quotas_a_flood_evicts_the_victims_prefix(make_cache: Factory) -> None:
    """The baseline the quota tests improve on: plain LRU loses the victim's blocks."""
    assert victim_survives(make_cache(num_blocks=16)) is False


def test_a_tenant_at_its_cap_evicts_its_own_blocks_never_the_victims(
    make_cache: Factory, audit_url: str
) -> None:
    cache = make_cache(num_blocks=16, policy_data=tenants(noisy={"kv_cap": {"blocks": 8}}))
    assert victim_survives(cache) is True
    assert evictions(audit_url, cache, "victim") == {}
    noisy = evictions(audit_url, cache, "noisy")
    assert noisy.get("cap", 0) > 0
    assert cache.stats().tenants["noisy"].blocks_by_state.get("cached", 0) <= 8


def test_a_floor_keeps_the_victims_blocks_while_anything_else_can_go(
    make_cache: Factory, audit_url: str
) -> None:
    data = tenants(victim={"kv_floor": {"fraction": 0.25}}, noisy={"priority": 90})
    cache = make_cache(num_blocks=16, policy_data=data)
    assert victim_survives(cache) is True
    assert evictions(audit_url, cache, "victim") == {}
    assert evictions(audit_url, cache, "noisy").get("capacity", 0) > 0


def test_floor_pressure_is_the_reason_when_nothing_else_is_left(
    make_cache: Factory, audit_url: str
) -> None:
    cache = make_cache(num_blocks=8, policy_data=tenants(victim={"kv_floor": {"blocks": 4}}))
    cache_prompt(cache, "v", "victim", 1)
    held = cache.admit("big", make_scope(tenant="noisy"), list(range(32)))  # all 8 blocks
    cache.release("big")
    assert len(held.block_ids) == 8
    assert evictions(audit_url, cache, "victim") == {"floor_pressure": BLOCKS}


def test_low_priority_flood_leaves_high_priority_prompts_with_reason_priority(
    make_cache: Factory, audit_url: str
) -> None:
    cache = make_cache(
        num_blocks=16, policy_data=tenants(victim={"priority": 90}, noisy={"priority": 10})
    )
    assert victim_survives(cache) is True
    assert set(evictions(audit_url, cache, "noisy")) == {"priority"}


def test_a_priority_decays_after_its_duration(make_cache: Factory, clock: FakeClock) -> None:
    data = tenants(victim={"priority": 90, "priority_duration": 60})
    cache = make_cache(num_blocks=16, policy_data=data)
    assert victim_survives(cache) is True
    clock.advance(61)
    assert victim_survives(cache) is False  # the re-hit blocks kept their old deadline


def test_floors_larger_than_the_pool_refuse_the_cache_at_start(make_cache: Factory) -> None:
    data = tenants(a={"kv_floor": {"blocks": 5}}, b={"kv_floor": {"fraction": 0.5}})
    with pytest.raises(InvalidQuota, match="add up to 9 blocks"):
        make_cache(num_blocks=8, policy_data=data)


def test_malformed_quota_data_refuses_the_cache_at_start(make_cache: Factory) -> None:
    with pytest.raises(InvalidQuota, match="kv_cap must be"):
        make_cache(num_blocks=8, policy_data=tenants(a={"kv_cap": 3}))


def test_a_policy_change_is_validated_and_a_refused_one_keeps_the_quotas(
    make_cache: Factory,
) -> None:
    cache = make_cache(num_blocks=8, policy_data=tenants(a={"kv_floor": {"blocks": 2}}))
    assert cache.stats().quotas == {"a": Quota(floor=2)}
    with pytest.raises(InvalidQuota):
        cache.reload_policy(
            policy_data=tenants(a={"kv_floor": {"blocks": 6}}, b={"kv_floor": {"blocks": 6}})
        )
    assert cache.stats().quotas == {"a": Quota(floor=2)}
    assert cache_prompt(cache, "s", "a", 1) == 0  # admissions go on
    assert cache.stats().quotas == {"a": Quota(floor=2)}
    cache.reload_policy(policy_data=tenants(b={"kv_cap": {"blocks": 3}}))
    assert cache.stats().quotas == {"b": Quota(cap=3)}


def test_a_reload_outside_the_cache_applies_at_the_next_admission(make_cache: Factory) -> None:
    cache = make_cache(num_blocks=8)
    cache.policy.reload(policy_data=tenants(a={"kv_cap": {"blocks": 1}}))
    cache_prompt(cache, "s", "a", 1)
    assert cache.stats().quotas == {"a": Quota(cap=1)}
    assert cache.stats().tenants["a"].blocks_by_state.get("cached", 0) == 1


def test_per_tenant_cached_blocks_and_quota_utilisation_metrics(make_cache: Factory) -> None:
    data = tenants(a={"kv_floor": {"blocks": 8}, "kv_cap": {"blocks": 16}})
    cache = make_cache(num_blocks=32, policy_data=data)
    cache_prompt(cache, "s", "a", 1)
    families = {f.name: f for f in CacheCollector(cache).collect()}
    samples = {
        name: {s.labels["tenant"]: s.value for s in families[name].samples}
        for name in (
            "kvgov_cached_blocks",
            "kvgov_cache_floor_utilisation_ratio",
            "kvgov_cache_cap_utilisation_ratio",
        )
    }
    assert samples["kvgov_cached_blocks"] == {"a": 4.0}
    assert samples["kvgov_cache_floor_utilisation_ratio"] == {"a": 0.5}
    assert samples["kvgov_cache_cap_utilisation_ratio"] == {"a": 0.25}
