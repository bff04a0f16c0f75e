"""Small frozen results returned by :class:`kvgov.govern.GovernedKVCache`, read by name."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from kvgov.audit import Evidence

__all__ = ["Admission", "ErasureReport", "InvalidationReport", "ReconcileReport", "RotationReport"]


@dataclass(frozen=True, slots=True)
class Admission:
    """What :meth:`GovernedKVCache.admit` granted.

    Attributes:
        seq_id: the sequence admitted.
        block_ids: the sequence's block table, in token order; the first
            ``cached_tokens // block_size`` blocks hold reused KV, the caller
            writes KV for the remaining tokens into the rest.
        cached_tokens: leading tokens whose KV is already in the blocks
            (prefill the caller may skip).
        decision_id: the admission decision, as written to the audit trail.
        cacheable: whether the sequence's full blocks will be kept for reuse
            at release (False for ``restricted`` data under the bundled policy).
        priority: the eviction priority the policy gave (0-100, lower first).
    """

    seq_id: str
    block_ids: tuple[int, ...]
    cached_tokens: int
    decision_id: str
    cacheable: bool
    priority: int


@dataclass(frozen=True, slots=True)
class ErasureReport:
    """Evidence of :meth:`GovernedKVCache.purge_tenant`.

    Attributes:
        tenant: the tenant erased.
        blocks_zeroized: cached blocks evicted and zeroized by the purge.
        bytes_zeroized: their bytes.
        in_flight_sequences: the tenant's sequences still running; their blocks
            are never cached and are zeroized at release.
        detached_blocks: keyed blocks of the tenant still held by running sequences
            (of any tenant) whose key this purge removed: unreachable by key from now
            on and zeroized when their last holder releases them.
        held_blocks: every block the tenant wrote that is not FREE after the purge,
            keyed or not (restricted data, a partial block, a tenant that caches
            nothing, a key an earlier invalidation or rotation dropped, a public
            block another tenant reuses): held by running sequences of any tenant,
            it keeps the tenant's bytes until its last holder releases it, when it
            is zeroized. Purge again after those sequences end to get a verified
            report.
        verified: read off ownership, not keys: every block the tenant wrote is FREE
            now and reads back as all zero bytes. False while ``held_blocks`` is not
            0, and always where the pool cannot read its bytes back (they live in
            another process: vLLM's workers).
        event_id: the erasure event in the audit trail (durable before this returns).
        finished_at: the cache clock's time when the purge finished (seconds).
        evidence: where the erasure event is: ``"stored"`` in the audit database, or
            ``"spooled"`` only in the local spool (the database did not answer in
            time; the event is replayed into it when it does, and ``kvgov audit
            status`` lists it until then).
        destroyed_key_ids: the tenant's offload data keys destroyed (crypto-shredding):
            every copy of its KV in every offload tier is unreadable from then on.
            Empty without offload tiers (or if the tenant never offloaded).
        offload_deleted: the tenant's objects then deleted, per offload tier.
        offload_unreachable: offload tiers that could not be reached; their copies
            remain, unreadable.
    """

    tenant: str
    blocks_zeroized: int
    bytes_zeroized: int
    in_flight_sequences: tuple[str, ...]
    detached_blocks: int
    held_blocks: int
    verified: bool
    event_id: str
    finished_at: float
    evidence: Evidence
    destroyed_key_ids: tuple[str, ...] = ()
    offload_deleted: Mapping[str, int] = field(default_factory=dict)
    offload_unreachable: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class InvalidationReport:
    """What :meth:`GovernedKVCache.invalidate` dropped.

    Attributes:
        blocks_zeroized: cached blocks evicted and zeroized now.
        detached_blocks: matching keyed blocks still held by running sequences
            whose key this invalidation removed: unreachable from now on and
            zeroized at release.
        held_blocks: every block a matching scope wrote that is not FREE after
            the invalidation, keyed or not (held by running sequences, zeroized at
            their release).
        sequences_marked: running sequences of a matching scope, which will
            cache nothing more.
        verified: every block a matching scope wrote is FREE now and reads back as
            all zero bytes (False while ``held_blocks`` is not 0, and where the pool
            cannot read its bytes back).
        event_id: the invalidation event in the audit trail.
        offload_deleted: objects of matching scopes deleted, per offload tier (empty
            without offload tiers).
    """

    blocks_zeroized: int
    detached_blocks: int
    held_blocks: int
    sequences_marked: int
    verified: bool
    event_id: str
    offload_deleted: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ReconcileReport:
    """What :meth:`GovernedKVCache.reconcile` recovered.

    Attributes:
        orphaned: sequence ids that were live here but unknown to the caller,
            now released without caching (their blocks zeroized or returned).
        blocks_released: block references dropped for them.
    """

    orphaned: tuple[str, ...]
    blocks_released: int


@dataclass(frozen=True, slots=True)
class RotationReport:
    """What a cache-key secret rotation did.

    Attributes:
        blocks_zeroized: cached blocks evicted and zeroized now.
        detached_blocks: keyed blocks still held by running sequences (unindexed,
            zeroized at their release).
        held_blocks: blocks written under the old secret that are not FREE after it.
        verified: every block written under the old secret is FREE and reads back zero.
        event_id: the rotation event in the audit trail.
    """

    blocks_zeroized: int
    detached_blocks: int
    held_blocks: int
    verified: bool
    event_id: str
