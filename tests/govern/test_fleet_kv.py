"""The fleet tier behind GovernedKVConnector, without vLLM: names, cost rule, sealed save/load.

Real Redis, a unique prefix per test: the shared server (127.0.0.1:6379), then a private
three-node Redis Cluster (tests/support/redis.py); two stores sharing it and one key
store, as two engines of a fleet do.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvgov.exceptions import BindingConfigError
from kvgov.govern.fleet_kv import (
    ConnectorOffloading,
    CostModel,
    FleetNames,
    FleetSettings,
    FleetStore,
)
from kvgov.govern.keys import KeyDeriver
from kvgov.govern.scope import CacheScope
from kvgov.offload import LocalKEK, MissReason, PutOutcome, RedisTier
from tests.support.clock import FakeClock
from tests.support.offload import MemoryKeyStore
from tests.support.redis import RedisTarget

KEK = LocalKEK(b"k" * 32)
NAMES = FleetNames(KeyDeriver(b"s" * 32))
TENANT = "acme-private-bank"
SCOPE = NAMES.scope(b"r" * 32, b"d" * 32)
PAYLOAD = bytes(range(256)) * 64
DEADLINE = 4e9


def _scope(classification: str) -> CacheScope:
    return CacheScope(
        tenant=TENANT,
        classification=classification,
        model="m",
        model_revision="r",
        tokenizer="t",
        tokenizer_revision="r",
        template_version="v",
    )


def _store(prefix: str, keys: MemoryKeyStore, url: str) -> FleetStore:
    tier = RedisTier(url, 1 << 24, name="fleet", prefix=prefix, timeout=0.2)
    return FleetStore(tier, keys, KEK, key_recheck_s=0.0)


@pytest.fixture()
def fleet(redis_target: RedisTarget) -> Any:
    keys = MemoryKeyStore()
    one, two = (_store(redis_target.prefix, keys, redis_target.url) for _ in "12")
    yield one, two
    one.store.close()
    two.store.close()


def test_names_are_keyed_and_reveal_no_tenant() -> None:
    name = NAMES.tenant(TENANT)
    assert name == NAMES.tenant(TENANT) != NAMES.tenant("other")
    assert TENANT not in name and TENANT.encode().hex() not in name
    assert name != FleetNames(KeyDeriver(b"x" * 32)).tenant(TENANT)  # keyed by the secret
    assert NAMES.scope(b"r" * 32, b"d" * 32) != NAMES.scope(b"q" * 32, b"d" * 32)


def test_a_block_saved_by_one_engine_loads_on_another_for_its_tenant_only(fleet: Any) -> None:
    one, two = fleet
    tenant = NAMES.tenant(TENANT)
    assert one.save(b"k1", SCOPE, tenant, DEADLINE, PAYLOAD).puts[0].outcome is PutOutcome.STORED
    assert two.present([b"k1", b"k2"]) == 1
    got = two.load(b"k1", SCOPE, tenant)
    assert got.hit and bytes(got.payload) == PAYLOAD
    other = two.load(b"k1", SCOPE, NAMES.tenant("other"))
    assert not other.hit and {r.reason for r in other.refusals} == {MissReason.MISBOUND}


def test_the_redis_keys_and_values_name_no_tenant(fleet: Any, redis_target: RedisTarget) -> None:
    one, _two = fleet
    one.save(b"k1", SCOPE, NAMES.tenant(TENANT), DEADLINE, PAYLOAD)
    client = redis_target.client()
    keys = list(client.scan_iter(match=f"{redis_target.prefix}:*"))  # a cluster: every node
    assert keys
    for key in keys:
        blob = (key or b"") + (client.dump(key) or b"")
        assert TENANT.encode() not in blob and TENANT.encode().hex().encode() not in blob


def test_a_purge_through_the_governor_hook_shreds_for_every_engine(fleet: Any) -> None:
    one, two = fleet
    tenant = NAMES.tenant(TENANT)
    one.save(b"k1", SCOPE, tenant, DEADLINE, PAYLOAD)
    assert two.load(b"k1", SCOPE, tenant).hit  # engine 2 holds the key unwrapped
    backup = one.tier.get(b"k1")
    scope = _scope("internal")
    hook = ConnectorOffloading(one, lambda: NAMES, lambda: {b"d" * 32: (b"r" * 32, scope)})
    report = hook.shred(TENANT)
    assert report.destroyed_key_ids and report.deleted == {"fleet": 1}
    assert two.present([b"k1"]) == 0
    one.tier.put(backup, 0)  # a copy of Redis restored: it no longer opens anywhere
    got = two.load(b"k1", SCOPE, tenant)
    assert not got.hit and {r.reason for r in got.refusals} == {MissReason.KEY_DESTROYED}


def test_invalidate_deletes_the_matching_scopes_objects(fleet: Any) -> None:
    one, two = fleet
    tenant = NAMES.tenant(TENANT)
    one.save(b"k1", SCOPE, tenant, DEADLINE, PAYLOAD)
    other = NAMES.scope(b"r" * 32, b"e" * 32)
    one.save(b"k2", other, tenant, DEADLINE, PAYLOAD)
    known = {
        b"d" * 32: (b"r" * 32, _scope("internal")),
        b"e" * 32: (b"r" * 32, _scope("public")),
    }
    hook = ConnectorOffloading(one, lambda: NAMES, lambda: known)
    assert hook.invalidate(lambda s: s.classification == "internal").deleted == {"fleet": 1}
    assert two.present([b"k1"]) == 0 and two.present([b"k2"]) == 1


def test_an_object_cut_short_by_a_killed_server_is_refused(
    fleet: Any, redis_target: RedisTarget
) -> None:
    one, two = fleet
    tenant = NAMES.tenant(TENANT)
    one.save(b"k1", SCOPE, tenant, DEADLINE, PAYLOAD)
    client = redis_target.client()
    key = one.tier.object_key(b"k1")
    client.set(key, (client.get(key) or b"")[:-100])
    got = two.load(b"k1", SCOPE, tenant)
    assert not got.hit and {r.reason for r in got.refusals} == {MissReason.CORRUPT}


def test_an_older_object_replayed_over_a_newer_one_is_refused(fleet: Any) -> None:
    one, _two = fleet
    tenant = NAMES.tenant(TENANT)
    one.save(b"k1", SCOPE, tenant, DEADLINE, PAYLOAD)
    old = one.tier.get(b"k1")
    one.save(b"k1", SCOPE, tenant, DEADLINE, PAYLOAD[::-1])
    one.tier.put(old, 0)
    got = one.load(b"k1", SCOPE, tenant)
    assert not got.hit and {r.reason for r in got.refusals} == {MissReason.REPLAYED}


@pytest.mark.parametrize("url", ["redis://127.0.0.1:1/0", "redis+cluster://127.0.0.1:1/0"])
def test_redis_down_is_a_miss_and_a_refused_save(url: str) -> None:
    down = _store("kvgov-test-down", MemoryKeyStore(), url)
    assert down.present([b"k1"]) is None
    assert down.present([b"k1"]) is None  # backing off: not asked again
    result = down.save(b"k1", SCOPE, NAMES.tenant(TENANT), DEADLINE, PAYLOAD)
    assert result.puts[0].outcome is PutOutcome.UNAVAILABLE
    assert down.load(b"k1", SCOPE, NAMES.tenant(TENANT)).reason is MissReason.UNAVAILABLE


def test_the_cost_rule_skips_when_recomputing_is_cheaper() -> None:
    cost = CostModel()
    assert cost.pays(16)  # nothing measured yet: try
    cost.restored(nbytes=1_000_000, seconds=1.0, blocks=10)  # 100 kB blocks at 1 MB/s
    cost.prefilled(tokens=16_000, seconds=1.0)  # 16 tokens in 1 ms
    assert not cost.pays(16)  # 100 ms to restore a block, 1 ms to recompute it
    cost.restored(nbytes=10**12, seconds=1.0, blocks=10_000_000)
    for _ in range(30):
        cost.restored(nbytes=10**10, seconds=1.0, blocks=100_000)
    assert cost.pays(16)
    metrics = cost.metrics(16)
    assert metrics["offload_pays"] is True and metrics["block_bytes"] == 100_000


def test_the_cost_rule_weighs_each_step_by_its_size() -> None:
    """A short step that ran fast does not outweigh a long one: the rates are throughputs
    (decayed sums of tokens and seconds), not averages of per-step rates. Measured on the
    real engine: a 32-token step, then a 480-token prefill at 45 tokens/s; restoring a
    32-token block took 0.17 s, recomputing it 0.7 s -- the rule must load it."""
    cost = CostModel()
    cost.restored(nbytes=15 * 2_359_296, seconds=15 * 0.17, blocks=15)
    cost.prefilled(tokens=32, seconds=0.01)  # 3,200 tokens/s: a short step, lightly loaded
    cost.prefilled(tokens=480, seconds=10.7)  # 45 tokens/s: the long prefill
    rate = cost.prefill_tokens_per_s
    assert rate is not None and 45 < rate < 60, rate
    assert cost.pays(32)


def test_a_stale_figure_no_longer_decides_and_is_replaced_by_the_next_measurement() -> None:
    """The trap: restore throughput changes only when a load happens, and a rule that
    says "recompute" skips every load, so one slow sample (a server's first load: 34 MB/s
    against a 3,598 tokens/s prefill) switched the tier off for the engine's life. A
    figure older than ``max_age_s`` no longer decides: the tier is used, and measured."""
    clock = FakeClock()
    cost = CostModel(max_age_s=60.0, clock=clock)
    block = 2_359_296  # the tiny model's 32-token block
    cost.restored(nbytes=15 * block, seconds=15 * block / 33_989_430, blocks=15)
    cost.prefilled(tokens=480, seconds=480 / 3_598)
    assert not cost.pays(32)  # 69 ms to restore a block, 8.9 ms to recompute it
    assert cost.metrics(32)["measuring"] is False
    for _ in range(10):  # forward passes keep the prefill figure fresh; no load happens
        clock.advance(6.1)
        cost.prefilled(tokens=480, seconds=480 / 3_598)
    assert cost.pays(32)  # restore measured 61 s ago: no longer decides
    metrics = cost.metrics(32)
    assert metrics["measuring"] is True and metrics["offload_pays"] is True
    assert metrics["restore_age_s"] == pytest.approx(61.0) and metrics["prefill_age_s"] == 0.0
    # the load that goes ahead measures 900 MB/s: it replaces the stale figure (averaged
    # into it, the decayed sums would still say ~40 MB/s and decline)
    cost.restored(nbytes=15 * block, seconds=15 * block / 900e6, blocks=15)
    assert cost.restore_bytes_per_s == pytest.approx(900e6)
    assert cost.pays(32) and cost.metrics(32)["measuring"] is False
    # a fresh sample is still averaged with the recent past
    cost.restored(nbytes=15 * block, seconds=15 * block / 300e6, blocks=15)
    assert 300e6 < (cost.restore_bytes_per_s or 0) < 900e6


def test_a_slow_tier_is_tried_again_once_per_max_age() -> None:
    clock = FakeClock()
    cost = CostModel(max_age_s=30.0, clock=clock)
    cost.restored(nbytes=1_000, seconds=1.0, blocks=1)  # 1 kB/s
    for _ in range(3):
        cost.prefilled(tokens=1_000, seconds=1.0)
        assert not cost.pays(16)
        clock.advance(31.0)
        cost.prefilled(tokens=1_000, seconds=1.0)
        assert cost.pays(16)  # tried again...
        cost.restored(nbytes=1_000, seconds=1.0, blocks=1)
        assert not cost.pays(16)  # ...still slow: declined for another max_age


def test_starting_figures_and_an_idle_engines_prefill_go_stale_too() -> None:
    clock = FakeClock()
    cost = CostModel(restore_bytes_per_s=1.0, prefill_tokens_per_s=1e9, clock=clock)
    cost.block_bytes = 1024
    assert not cost.pays(16)  # a starting figure decides while it is young
    clock.advance(61.0)
    assert cost.pays(16)
    cost.restored(nbytes=1024, seconds=1.0, blocks=1)
    assert cost.restore_bytes_per_s == 1024.0  # replaced, not averaged with the setting
    assert cost.pays(16)  # the prefill figure (a setting never measured) is still stale
    cost.prefilled(tokens=1_000_000, seconds=0.001)
    assert not cost.pays(16)  # both fresh: 1 s to restore a block, 16 ns to recompute it
    clock.advance(61.0)  # an idle engine: no load, no forward pass
    assert cost.pays(16) and cost.metrics(16)["measuring"] is True


def test_settings_are_checked() -> None:
    with pytest.raises(BindingConfigError, match="redis_url"):
        FleetSettings.from_extra({"kvgov": {"key_store_url": "sqlite://"}})
    with pytest.raises(BindingConfigError, match="timeout_s"):
        FleetSettings.from_extra(
            {"kvgov": {"redis_url": "redis://x", "key_store_url": "sqlite://", "timeout_s": 0}}
        )
    with pytest.raises(BindingConfigError, match="cost_rule"):
        FleetSettings.from_extra(
            {"kvgov": {"redis_url": "redis://x", "key_store_url": "sqlite://", "cost_rule": "no"}}
        )
    with pytest.raises(BindingConfigError, match="cost_max_age_s"):
        FleetSettings.from_extra(
            {"kvgov": {"redis_url": "redis://x", "key_store_url": "sqlite://", "cost_max_age_s": 0}}
        )
    assert FleetSettings.from_extra(
        {"kvgov": {"redis_url": "redis://x", "key_store_url": "sqlite://"}}
    ).cost_max_age_s == pytest.approx(60.0)
    off = {"redis_url": "redis://x", "key_store_url": "sqlite://", "cost_rule": False}
    assert FleetSettings.from_extra({"kvgov": off}).cost_rule is False
    with pytest.raises(BindingConfigError, match="settings among"):
        FleetSettings.from_extra({"kvgov": {"redis_url": "redis://x", "bogus": 1}})
