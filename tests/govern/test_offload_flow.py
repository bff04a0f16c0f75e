"""Offload wired into the governed cache: capture on capacity eviction, restore on admission."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from kvgov.allocator import BlockState
from kvgov.audit import AuditQueries, Deferred
from kvgov.exceptions import AuditUnavailable, InvalidArgument
from kvgov.govern import GovernedKVCache, Offloading
from kvgov.offload import OffloadStore
from tests.support.offload import MemoryKeyStore, Raw

from .conftest import (
    FILLER,
    KEK,
    block_keys,
    fill,
    host_tier,
    make_scope,
    offload_tiers,
    push_out,
    share_group,
    tenant_config,
    the_tier,
    tier_stats,
)

Factory = Callable[..., GovernedKVCache]
PROMPT = list(range(100, 113))  # 13 tokens: 3 full blocks of 4 and one partial


def _write(
    cache: GovernedKVCache, seq_id: str, scope: Any, tokens: list[int]
) -> list[torch.Tensor]:
    """Admit, write distinct KV into every block, release; the full blocks' KV, in order."""
    adm = cache.admit(seq_id, scope, tokens)
    for i, b in enumerate(adm.block_ids):
        cache.block(b).copy_(
            torch.arange(cache.block(b).numel()).view_as(cache.block(b)) + i * 1000
        )
    kv = [cache.block(b).clone() for b in adm.block_ids[: len(tokens) // 4]]
    cache.release(seq_id)
    return kv


def _events(cache: GovernedKVCache, url: str, type: str) -> list[Any]:
    cache.audit.flush()
    with AuditQueries(url) as q:
        return list(q.events(type=type))


def test_an_evicted_prefix_is_restored_with_its_exact_bytes(
    make_offload_cache: Factory, audit_url: str
) -> None:
    """Evicted for capacity, sealed into the host tier, restored into new blocks as hits."""
    cache = make_offload_cache()
    scope = make_scope()
    kv = _write(cache, "a", scope, PROMPT)
    push_out(cache)
    assert cache.stats().total.blocks_by_state["cached"] == 0
    adm = cache.admit("b", scope, PROMPT)
    assert adm.cached_tokens == 12
    for b, want in zip(adm.block_ids[:3], kv, strict=True):
        assert torch.equal(cache.block(b), want)
    assert not cache.block(adm.block_ids[3]).any()  # the tail block is new: zero
    cache._check_invariants()
    stats = cache.stats()
    assert stats.tenants["acme"].blocks_offloaded == 3
    assert stats.tenants["acme"].blocks_restored == 3
    assert stats.tenants["acme"].hit_tokens == 12
    assert tier_stats(cache).puts == 3 and tier_stats(cache).hits == 3
    offloaded = _events(cache, audit_url, "offload")
    assert [(e.tenant, e.details["tier"], len(e.block_ids)) for e in offloaded] == [
        ("acme", "host", 3)
    ]
    restored = _events(cache, audit_url, "offload_restore")
    assert len(restored) == 1
    ev = restored[0]
    assert (ev.tenant, ev.requester_tenant, ev.details["tier"]) == ("acme", "acme", "host")
    assert ev.sequence_id == "b" and ev.reused_tokens == 12
    assert ev.details["key_ids"] == [offloaded[0].details["key_id"]]


def test_restored_blocks_are_cached_again_and_hit_on_the_device(
    make_offload_cache: Factory,
) -> None:
    """After a restore the blocks are keyed: the next identical prompt hits them on the device."""
    cache = make_offload_cache()
    scope = make_scope()
    _write(cache, "a", scope, PROMPT)
    push_out(cache)
    cache.admit("b", scope, PROMPT)
    cache.release("b")
    hits_before = tier_stats(cache).hits
    assert cache.admit("c", scope, PROMPT).cached_tokens == 12
    assert tier_stats(cache).hits == hits_before


def test_a_restore_stops_at_the_first_block_no_tier_holds(make_offload_cache: Factory) -> None:
    """A longer prompt reuses the restored prefix and computes the rest."""
    cache = make_offload_cache(num_blocks=8)
    scope = make_scope()
    _write(cache, "a", scope, PROMPT[:8])  # 2 full blocks
    push_out(cache)
    adm = cache.admit("b", scope, PROMPT)
    assert adm.cached_tokens == 8
    assert not cache.block(adm.block_ids[2]).any()


@pytest.mark.parametrize(
    "erase",
    [
        lambda c, clock: (clock.advance(3601), c.sweep()),
        lambda c, clock: c.purge_tenant("acme"),
        lambda c, clock: c.invalidate(model="llama-3-8b"),
        lambda c, clock: c.rotate_secret(b"n" * 32),
    ],
    ids=["expired", "purged", "invalidated", "secret_rotated"],
)
def test_only_capacity_evictions_are_offloaded(
    make_offload_cache: Factory, clock: Any, erase: Callable[..., Any]
) -> None:
    """Expiry, purge, invalidation and rotation destroy the KV on purpose: nothing is sealed."""
    cache = make_offload_cache()
    _write(cache, "a", make_scope(), PROMPT)
    erase(cache, clock)
    assert cache.stats().total.blocks_by_state["cached"] == 0
    assert tier_stats(cache).puts == 0


def test_closing_offloads_nothing(make_offload_cache: Factory) -> None:
    """close() zeroizes the whole pool without sealing anything."""
    cache = make_offload_cache()
    store = cache.governor.offload
    assert store is not None
    _write(cache, "a", make_scope(), PROMPT)
    cache.close()
    assert store.snapshot().tiers["host"].puts == 0


def test_without_offload_there_is_no_observer_and_no_offload_stats(make_cache: Factory) -> None:
    """The default cache does no offload work at all."""
    cache = make_cache()
    assert cache.governor.offload is None
    assert cache.pool._observer is None
    assert cache.stats().offload is None


def test_restricted_data_never_reaches_a_tier(make_offload_cache: Factory) -> None:
    """Even with data.json listing a tier for restricted, nothing of it is ever sealed."""
    cache = make_offload_cache(policy_data=offload_tiers(restricted=["host"]))
    scope = make_scope(classification="restricted")
    _write(cache, "a", scope, PROMPT)
    push_out(cache)
    assert tier_stats(cache).puts == 0
    assert cache.admit("b", scope, PROMPT).cached_tokens == 0
    assert cache.stats().tenants["acme"].blocks_offloaded == 0
    # and the policy says so, should restricted blocks ever be cached
    assert not cache.policy.offload(scope.as_dict(), "host").allow


def test_a_tenant_that_disabled_offload_has_none(make_offload_cache: Factory) -> None:
    """``offload: false`` for a tenant: its blocks are only zeroized; the others' are sealed."""
    cache = make_offload_cache(num_blocks=8, policy_data=tenant_config("acme", offload=False))
    _write(cache, "a", make_scope(), PROMPT)
    _write(cache, "g", make_scope(tenant="globex"), PROMPT)
    push_out(cache)
    stats = cache.stats()
    assert stats.tenants["acme"].blocks_offloaded == 0
    assert stats.tenants["globex"].blocks_offloaded == 3
    snap = stats.offload
    assert snap is not None and snap.policy_denied["host"] == 3
    assert cache.admit("b", make_scope(), PROMPT).cached_tokens == 0


def test_the_policy_decides_per_tier(make_offload_cache: Factory, tmp_path: Any) -> None:
    """internal data goes to the host tier only; public data to the disk tier as well."""
    from kvgov.offload import DiskTier

    disk = DiskTier(tmp_path / "disk", 1 << 20, fsync=False)
    cache = make_offload_cache(host_tier(), disk, num_blocks=8)
    _write(cache, "a", make_scope(), PROMPT)
    _write(cache, "p", make_scope(classification="public"), PROMPT)
    push_out(cache)
    assert tier_stats(cache, "host").puts == 6
    assert tier_stats(cache, "disk").puts == 3
    snap = cache.stats().offload
    assert snap is not None and snap.policy_denied == {"host": 0, "disk": 3}


def test_blocks_published_in_a_share_group_are_not_offloaded(make_offload_cache: Factory) -> None:
    """A group's blocks may be another tenant's: they stay device-only (shared there as before)."""
    cache = make_offload_cache(policy_data=share_group("public-prompts", "bank", "clinic"))
    bank = make_scope(tenant="bank", classification="public")
    _write(cache, "a", bank, PROMPT)
    push_out(cache)
    snap = cache.stats().offload
    assert snap is not None and snap.not_offloaded == {"shared_namespace": 3}
    assert tier_stats(cache).puts == 0


def test_a_public_prefix_in_the_tenants_own_namespace_is_restored(
    make_offload_cache: Factory,
) -> None:
    """Without a share group a public prefix is the tenant's own: restored with the rest."""
    cache = make_offload_cache(
        num_blocks=8, policy_data=offload_tiers(public=["host"], internal=["host"])
    )
    scope = make_scope()
    adm = cache.admit("a", scope, PROMPT, public_prefix_tokens=8)
    fill(cache, adm.block_ids)
    cache.release("a")
    push_out(cache)
    again = cache.admit("b", scope, PROMPT, public_prefix_tokens=8)
    assert again.cached_tokens == 12
    assert all(bool(cache.block(b).eq(7.0).all()) for b in again.block_ids[:3])
    assert cache.stats().tenants["acme"].blocks_restored == 3


def test_a_failed_admission_after_a_restore_gives_every_block_back(
    make_offload_cache: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """All or nothing: restored blocks are new blocks, zeroized and FREE again on failure."""
    cache = make_offload_cache(num_blocks=8)
    scope = make_scope()
    _write(cache, "a", scope, PROMPT)
    push_out(cache)
    before = cache.pool.counts()

    def refuse(*_: Any, **__: Any) -> None:
        raise AuditUnavailable("down")

    with monkeypatch.context() as mp:
        mp.setattr(cache.governor, "record_admission", refuse)
        with pytest.raises(AuditUnavailable):
            cache.admit("b", scope, PROMPT)
    assert cache.pool.counts() == before
    assert cache.stats().live_sequences == 0
    cache._check_invariants()
    cache.pool._check_invariants(check_zero=True)
    assert cache.admit("b", scope, PROMPT).cached_tokens == 12  # still in the tier


def test_an_unauditable_refusal_refuses_the_admission(
    make_offload_cache: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A refusal is a critical event: if it cannot be written the admission is undone."""
    cache = make_offload_cache(num_blocks=8)
    scope = make_scope()
    _write(cache, "a", scope, PROMPT)
    push_out(cache)
    raw = Raw(the_tier(cache))
    first = block_keys(cache, scope, PROMPT)[0]
    data = bytearray(raw.read(first))
    data[-1] ^= 1
    raw.write(first, bytes(data))
    original = cache.audit.defer

    def defer(event: Any) -> Deferred:
        pending = original(event)
        if event.type != "offload_refused":
            return pending
        return Deferred(pending.event_id, lambda: _raise(AuditUnavailable("down")))

    monkeypatch.setattr(cache.audit, "defer", defer)
    before = cache.pool.counts()
    with pytest.raises(AuditUnavailable):
        cache.admit("b", scope, PROMPT)
    assert cache.pool.counts() == before
    assert cache.stats().live_sequences == 0
    cache.pool._check_invariants(check_zero=True)


def test_an_observer_that_fails_only_zeroizes(
    make_offload_cache: Factory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sealing failure is counted and logged; the eviction and the admission go on."""
    cache = make_offload_cache()
    offload = cache.governor.offload
    assert offload is not None

    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("tier bug")

    monkeypatch.setattr(offload.store, "offload", broken)
    _write(cache, "a", make_scope(), PROMPT)
    push_out(cache)
    snap = cache.stats().offload
    assert snap is not None and snap.not_offloaded == {"error": 3}
    assert all(s is BlockState.FREE for s in cache.pool.states(list(range(4))))
    cache.pool._check_invariants(check_zero=True)


def test_attach_refuses_a_pool_that_cannot_show_evicted_bytes(make_cache: Factory) -> None:
    """A binding whose pool has no eviction observer cannot have offload tiers."""
    cache = make_cache()

    class Bare:
        num_blocks = 4

    offload = Offloading(OffloadStore([host_tier()], MemoryKeyStore(), KEK))
    with pytest.raises(InvalidArgument, match="set_eviction_observer"):
        gov = cache.governor
        offload.attach(gov.ledger, gov.policy, gov.audit, Bare(), 4)
    assert cache.governor.offload is None


def test_offloading_is_attached_once(make_offload_cache: Factory) -> None:
    """The same tiers cannot serve two governors (their observer and counters are one)."""
    cache = make_offload_cache()
    offload = cache.governor.offload
    assert offload is not None
    with pytest.raises(InvalidArgument, match="attached"):
        gov = cache.governor
        offload.attach(gov.ledger, gov.policy, gov.audit, cache.pool, cache.spec.block_size)


def test_offload_counters_are_per_tenant_and_in_the_total(make_offload_cache: Factory) -> None:
    """blocks_offloaded and blocks_restored add up in the total; the filler offloads nothing."""
    cache = make_offload_cache(num_blocks=8)
    _write(cache, "a", make_scope(), PROMPT)
    _write(cache, "g", make_scope(tenant="globex"), PROMPT)
    push_out(cache)
    cache.admit("b", make_scope(), PROMPT)
    stats = cache.stats()
    assert stats.total.blocks_offloaded == 6 and stats.total.blocks_restored == 3
    assert stats.tenants[FILLER].blocks_offloaded == 0


@pytest.mark.gpu
def test_the_flow_on_a_gpu(make_offload_cache: Factory) -> None:
    """On CUDA an evicted block is copied to the host to be sealed, and restored through a
    pinned staging buffer into the new device block, byte for byte."""
    cache = make_offload_cache(device="cuda")
    scope = make_scope()
    kv = _write(cache, "a", scope, PROMPT)
    push_out(cache)
    adm = cache.admit("b", scope, PROMPT)
    assert adm.cached_tokens == 12
    for b, want in zip(adm.block_ids[:3], kv, strict=True):
        assert torch.equal(cache.block(b), want)
    cache.pool._check_invariants(check_zero=True)


def _raise(exc: BaseException) -> Any:
    raise exc
