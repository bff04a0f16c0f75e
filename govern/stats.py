"""Counters of the governed cache, and the frozen snapshots ``stats()`` returns."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

from kvgov.allocator import BlockState, Quota
from kvgov.policy.latency import LatencyHistogram, LatencySnapshot

if TYPE_CHECKING:
    from kvgov.offload import TierStats
    from kvgov.policy import PolicyClient

    from .ownership import Owners
    from .protocol import ObservedPool

__all__ = ["CacheStats", "OffloadSnapshot", "TenantCounters", "TenantStats"]


@dataclass(frozen=True, slots=True)
class TenantStats:
    """Counters for one tenant (or, in ``CacheStats.total``, for all of them).

    Attributes:
        requests: sequences admitted.
        queried_tokens: prompt tokens of admitted sequences.
        hit_tokens: prompt tokens served from cache.
        prefill_tokens_avoided: prefill the caller could skip; equal to
            ``hit_tokens`` (kept separate so dashboards can name it).
        cross_tenant_reuses: reuses of another tenant's blocks by this tenant,
            granted by a share group.
        cross_tenant_denied: reuses of another tenant's blocks the sharing
            policy refused.
        denials: admissions refused, by reason.
        evictions: this tenant's blocks evicted, by reason (capacity, expired,
            purged, invalidated, secret_rotated).
        blocks_zeroized: this tenant's blocks zeroized.
        bytes_zeroized: their bytes.
        blocks_by_state: this tenant's blocks now OWNED or CACHED (keys
            ``owned``, ``cached``); for the total also ``free`` and ``dirty``.
        blocks_offloaded: this tenant's evicted blocks sealed into at least one
            offload tier.
        blocks_restored: blocks restored from an offload tier into this tenant's
            admissions (their tokens are in ``hit_tokens``).
        offload_refusals: offloaded objects refused when this tenant's admissions
            tried to restore them (tampered, truncated, moved, replayed, shredded).
    """

    requests: int = 0
    queried_tokens: int = 0
    hit_tokens: int = 0
    prefill_tokens_avoided: int = 0
    cross_tenant_reuses: int = 0
    cross_tenant_denied: int = 0
    denials: Mapping[str, int] = field(default_factory=dict)
    evictions: Mapping[str, int] = field(default_factory=dict)
    blocks_zeroized: int = 0
    bytes_zeroized: int = 0
    blocks_by_state: Mapping[str, int] = field(default_factory=dict)
    blocks_offloaded: int = 0
    blocks_restored: int = 0
    offload_refusals: int = 0

    @property
    def hit_rate(self) -> float:
        """Share of queried prompt tokens served from cache (0.0 with no queries)."""
        return self.hit_tokens / self.queried_tokens if self.queried_tokens else 0.0


@dataclass(frozen=True, slots=True)
class CacheStats:
    """A consistent snapshot of the governed cache's counters.

    Attributes:
        total: counters summed over every tenant, plus pool-wide block states.
        tenants: counters per tenant, by tenant name.
        num_blocks: blocks in the pool.
        bytes_per_block: bytes of one block.
        orphans_recovered: sequences released by :meth:`GovernedKVCache.reconcile`.
        live_sequences: sequences admitted and not yet released.
        decision_cache_hits: policy decisions served from the decision cache.
        decision_cache_misses: policy decisions that went to the engine.
        policy_revision: the active policy bundle revision.
        offload: the offload tiers' counters; None when the cache has none.
        admission_latency: how long ``admit`` took, by outcome (``admitted``,
            ``denied``: the policy refused, ``error``: any other exception).
        policy_latency: how long the policy engine took per rule path, for the
            decisions the decision cache did not serve.
        quotas: each tenant's cache floor and cap in force, in blocks (tenants
            with neither are absent).
    """

    total: TenantStats
    tenants: Mapping[str, TenantStats]
    num_blocks: int
    bytes_per_block: int
    orphans_recovered: int
    live_sequences: int
    decision_cache_hits: int
    decision_cache_misses: int
    policy_revision: str
    offload: OffloadSnapshot | None = None
    admission_latency: Mapping[str, LatencySnapshot] = field(default_factory=dict)
    policy_latency: Mapping[str, LatencySnapshot] = field(default_factory=dict)
    quotas: Mapping[str, Quota] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class OffloadSnapshot:
    """The offload part of a governed cache's stats.

    Attributes:
        tiers: per tier, in lookup order, the store's counters and fill.
        policy_denied: evicted blocks the offload policy kept from each tier.
        not_offloaded: capacity-evicted blocks kept from every tier by the governor
            itself, by reason: ``shared_namespace`` (published in a share group),
            ``purging`` (their tenant is being erased), ``no_deadline``, ``error``
            (sealing or a tier raised; logged).
        restore_errors: restores abandoned as a miss because an authentic object
            could not be used (another KV layout, a KEK mismatch; logged).
    """

    tiers: Mapping[str, TierStats]
    policy_denied: Mapping[str, int]
    not_offloaded: Mapping[str, int]
    restore_errors: int


class TenantCounters:
    """Mutable counters of one tenant; only the cache, under its lock, changes them."""

    __slots__ = (
        "blocks_offloaded",
        "blocks_restored",
        "blocks_zeroized",
        "bytes_zeroized",
        "cross_tenant_denied",
        "cross_tenant_reuses",
        "denials",
        "evictions",
        "hit_tokens",
        "offload_refusals",
        "queried_tokens",
        "requests",
    )

    def __init__(self) -> None:
        self.requests = 0
        self.queried_tokens = 0
        self.hit_tokens = 0
        self.cross_tenant_reuses = 0
        self.cross_tenant_denied = 0
        self.denials: Counter[str] = Counter()
        self.evictions: Counter[str] = Counter()
        self.blocks_zeroized = 0
        self.bytes_zeroized = 0
        self.blocks_offloaded = 0
        self.blocks_restored = 0
        self.offload_refusals = 0

    def freeze(self, blocks_by_state: Mapping[str, int]) -> TenantStats:
        return TenantStats(
            requests=self.requests,
            queried_tokens=self.queried_tokens,
            hit_tokens=self.hit_tokens,
            prefill_tokens_avoided=self.hit_tokens,
            cross_tenant_reuses=self.cross_tenant_reuses,
            cross_tenant_denied=self.cross_tenant_denied,
            denials=MappingProxyType(dict(self.denials)),
            evictions=MappingProxyType(dict(self.evictions)),
            blocks_zeroized=self.blocks_zeroized,
            bytes_zeroized=self.bytes_zeroized,
            blocks_by_state=MappingProxyType(dict(blocks_by_state)),
            blocks_offloaded=self.blocks_offloaded,
            blocks_restored=self.blocks_restored,
            offload_refusals=self.offload_refusals,
        )


def _sum(counters: Iterable[TenantCounters]) -> TenantCounters:
    total = TenantCounters()
    for c in counters:
        total.requests += c.requests
        total.queried_tokens += c.queried_tokens
        total.hit_tokens += c.hit_tokens
        total.cross_tenant_reuses += c.cross_tenant_reuses
        total.cross_tenant_denied += c.cross_tenant_denied
        total.denials.update(c.denials)
        total.evictions.update(c.evictions)
        total.blocks_zeroized += c.blocks_zeroized
        total.bytes_zeroized += c.bytes_zeroized
        total.blocks_offloaded += c.blocks_offloaded
        total.blocks_restored += c.blocks_restored
        total.offload_refusals += c.offload_refusals
    return total


def snapshot(
    *,
    counters: Mapping[str, TenantCounters],
    unattributed: TenantCounters,
    owners: Owners | None,
    pool: ObservedPool,
    policy: PolicyClient,
    live_sequences: int,
    orphans_recovered: int,
    offload: OffloadSnapshot | None = None,
    admission_latency: Mapping[str, LatencyHistogram] | None = None,
    quotas: Mapping[str, Quota] | None = None,
) -> CacheStats:
    """Freeze a governor's counters, with its blocks by state per tenant and in total.

    Args:
        counters: per tenant.
        unattributed: events of blocks without an owner.
        owners: the owner table, or None once closed (no blocks by state then).
        pool: the pool (its states and counts).
        policy: the policy client (decision cache counters, revision).
        live_sequences: the binding's running sequences.
        orphans_recovered: sequences the binding released as orphans.
        offload: the snapshot of the governor's offload tiers, if any.
        admission_latency: the admission histograms by outcome, if any.
    """
    per_tenant: defaultdict[str, dict[str, int]] = defaultdict(lambda: {"owned": 0, "cached": 0})
    totals = {"free": 0, "owned": 0, "cached": 0, "dirty": 0}
    if owners is not None:
        held = owners.held()
        table = owners.table
        for b, state in zip(held, pool.states(held), strict=True):
            owner = table[b]
            if owner is None:  # pragma: no cover - held() lists owned entries only
                continue
            if state is BlockState.OWNED:
                per_tenant[owner.tenant]["owned"] += 1
            elif state is BlockState.CACHED:
                per_tenant[owner.tenant]["cached"] += 1
        counts = pool.counts()
        totals = {
            "free": counts.free,
            "owned": counts.owned,
            "cached": counts.cached,
            "dirty": counts.dirty,
        }
    tenants = {
        name: c.freeze(per_tenant.get(name, {"owned": 0, "cached": 0}))
        for name, c in sorted(counters.items())
    }
    total = _sum([*counters.values(), unattributed]).freeze(totals)
    cache_stats = policy.cache_stats()
    return CacheStats(
        total=total,
        tenants=tenants,
        num_blocks=pool.num_blocks,
        bytes_per_block=pool.bytes_per_block,
        orphans_recovered=orphans_recovered,
        live_sequences=live_sequences,
        decision_cache_hits=cache_stats.hits,
        decision_cache_misses=cache_stats.misses,
        policy_revision=policy.bundle_revision,
        offload=offload,
        admission_latency={k: h.snapshot() for k, h in (admission_latency or {}).items()},
        policy_latency=policy.evaluation_latency(),
        quotas=dict(quotas or {}),
    )
