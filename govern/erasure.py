"""Erasure and maintenance through a governor: purge, invalidate, rotate, sweep.

Each function selects the blocks from the governor's own bookkeeping (owners,
deadlines), has the pool revoke or evict them through the pool protocol,
drains the pool's events into the audit trail, and writes the operation's own
event. They take the governor's lock; a binding passes its running sequences
(``live``) so the ones that match stop caching. With offload tiers
(``gov.offload``) each also reaches the tiers: a purge crypto-shreds the tenant
(its data key first, then its objects), an invalidation deletes the matching
scopes' objects, a rotation every object, a sweep the expired ones; the
operation's event names what each tier lost.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from kvgov.allocator import BlockState
from kvgov.audit import AuditEvent, EventType
from kvgov.exceptions import InvalidArgument, InvalidScope, KeyStoreUnavailable, ZeroizationError
from kvgov.offload import ShredReport
from kvgov.schema import SCOPE_FIELDS

from .governor import Governor, RunningSequence, _log
from .keys import KeyDeriver
from .offloading import erasure_details
from .results import ErasureReport, InvalidationReport
from .scope import CacheScope

__all__ = ["SCOPE_FILTERS", "erasure_check", "invalidate", "purge_tenant", "rotate_secret", "sweep"]

#: The scope fields :func:`invalidate` can filter on: what produced the KV (every
#: scope field but who owns it and how it is labelled), in scope order.
SCOPE_FILTERS = tuple(f for f in SCOPE_FIELDS if f not in ("tenant", "classification"))


@contextmanager
def zeroization_audited(gov: Governor) -> Any:
    """Audit a ZeroizationError raised inside the block, then let it propagate."""
    try:
        yield
    except ZeroizationError as exc:
        gov.audit.record(
            AuditEvent(
                type=EventType.ZEROIZATION_FAILURE,
                block_ids=exc.block_ids,
                details={"error": str(exc)},
            )
        )
        raise


def revoke(gov: Governor, block_ids: list[int], reason: str) -> tuple[list[int], list[int]]:
    """Have the pool evict the CACHED blocks and unindex the OWNED ones; drain.

    Returns:
        The blocks evicted (zeroized now) and those detached (zeroized at release).
    """
    if not block_ids:
        return [], []
    with zeroization_audited(gov):
        revoked = gov.pool.revoke(block_ids, reason)
    gov.drain()
    return list(revoked.evicted), list(revoked.detached)


def erasure_check(gov: Governor, written: Sequence[int]) -> tuple[list[int], bool]:
    """Whether the erasure of blocks is verified, read off their states and bytes, not their keys.

    Call it under the governor's lock, after the revocation and its drain, with
    every block the erased owner (tenant, scope) wrote, as the governor's owners
    named them before: a block without a cache key (restricted data, a partial
    block, a tenant that caches nothing, a key an earlier invalidation or
    rotation dropped) holds its writer's bytes all the same.

    Returns:
        The blocks among ``written`` that are not FREE now (held by a running
        sequence of any tenant, so zeroized only when their last holder releases
        them), ascending; and ``verified``: none is held and the pool read them
        all back as zero bytes (a pool whose bytes live in another process cannot
        read them back: never verified).
    """
    states = gov.pool.states(written)
    held = [b for b, state in zip(written, states, strict=True) if state is not BlockState.FREE]
    return held, not held and gov.pool.read_back_zero(written) is True


def purge_tenant(gov: Governor, tenant: str, live: Iterable[RunningSequence]) -> ErasureReport:
    """Erase a tenant: see :meth:`kvgov.govern.GovernedKVCache.purge_tenant`.

    The blocks are revoked under the governor's lock; the erasure event, which
    the audit log writes through to its store, is recorded after the lock is
    released (the tenant's admissions stay refused until it is), so a slow
    audit database never stalls other tenants. The offload tiers are shredded
    then too: the tenant has no CACHED block left to offload, and a capacity
    eviction of a purging tenant's block offloads nothing.

    ``verified`` rests on ownership (:func:`erasure_check`): every block the
    governor's owners name the tenant's before the purge must be FREE and zero
    after it. A block a running sequence holds cannot be freed; it counts in
    ``held_blocks`` and the purge is not verified until a later one finds none.

    Raises:
        InvalidScope: tenant is not a valid identifier.
        KeyStoreUnavailable: the tenant's offload data key could not be destroyed
            (the device blocks are zeroized and the attempt is audited); retry.
        AuditUnavailable: the erasure could not be audited.
    """
    if not isinstance(tenant, str) or not tenant:
        raise InvalidScope("tenant", tenant, "a non-empty string")
    gov.purging.add(tenant)
    try:
        with gov.lock:
            gov.check_open()
            in_flight = []
            for seq in live:
                if seq.scope.tenant == tenant:
                    seq.cacheable = False
                    in_flight.append(seq.seq_id)
            written = gov.owners.of_tenant(tenant)
            evicted, detached = revoke(gov, written, "purged")
            # verified from ownership: every block the tenant wrote, keyed or not, is
            # FREE and zero now; a held one is zeroized only at its holder's release
            held, verified = erasure_check(gov, written)
            nbytes = len(evicted) * gov.pool.bytes_per_block
        details: dict[str, Any] = {
            "blocks_zeroized": len(evicted),
            "bytes_zeroized": nbytes,
            "detached_blocks": len(detached),
            "held_blocks": len(held),
            "in_flight_sequences": in_flight,
            "verified": verified,
        }
        shred, failure = _shred(gov, tenant, details)
        finished = details["finished_at"] = gov.clock()
        recorded = gov.audit.record_durable(
            AuditEvent(
                type=EventType.ERASURE, tenant=tenant, block_ids=tuple(evicted), details=details
            )
        )
        if failure is not None:
            raise failure
        _log.info(
            "tenant_erased",
            tenant=tenant,
            blocks_zeroized=len(evicted),
            in_flight=len(in_flight),
            held_blocks=len(held),
            verified=verified,
            event_id=recorded.event_id,
            evidence=recorded.evidence,
        )
        return ErasureReport(
            tenant=tenant,
            blocks_zeroized=len(evicted),
            bytes_zeroized=nbytes,
            in_flight_sequences=tuple(in_flight),
            detached_blocks=len(detached),
            held_blocks=len(held),
            verified=verified,
            event_id=recorded.event_id,
            finished_at=finished,
            evidence=recorded.evidence,
            destroyed_key_ids=() if shred is None else shred.destroyed_key_ids,
            offload_deleted={} if shred is None else dict(shred.deleted),
            offload_unreachable=() if shred is None else shred.unreachable,
        )
    finally:
        gov.purging.discard(tenant)


def _shred(
    gov: Governor, tenant: str, details: dict[str, Any]
) -> tuple[ShredReport | None, KeyStoreUnavailable | None]:
    """Crypto-shred the tenant in the offload tiers, if any; say so in ``details["offload"]``."""
    if gov.offload is None:
        return None, None
    try:
        shred = gov.offload.shred(tenant)
    except KeyStoreUnavailable as exc:
        details["offload"] = {"shredded": False, "error": str(exc)}
        _log.warning("offload_shred_failed", tenant=tenant, error=str(exc))
        return None, exc
    details["offload"] = {"shredded": True, **erasure_details(shred)}
    return shred, None


def invalidate(
    gov: Governor, wanted: Mapping[str, str], live: Iterable[RunningSequence]
) -> InvalidationReport:
    """Drop every block of a matching scope: see :meth:`GovernedKVCache.invalidate`.

    Args:
        gov: the governor.
        wanted: scope field -> value; every one must match (fields of
            :data:`SCOPE_FILTERS`, at least one).
        live: the binding's running sequences.

    Raises:
        InvalidArgument: no filter, or a field that is not a filter.
    """
    if not wanted:
        raise InvalidArgument(
            "filters", dict(wanted), "give at least one of model, model_revision, adapter, ..."
        )
    unknown = sorted(set(wanted) - set(SCOPE_FILTERS))
    if unknown:
        raise InvalidArgument("filters", unknown, f"fields to filter on are {SCOPE_FILTERS}")
    for name, value in wanted.items():
        if not isinstance(value, str) or not value:
            raise InvalidArgument(name, value, "a non-empty string (the scope field to match)")

    def matches(scope: CacheScope) -> bool:
        return all(getattr(scope, k) == v for k, v in wanted.items())

    with gov.lock:
        gov.check_open()
        marked = 0
        for seq in live:
            if seq.cacheable and matches(seq.scope):
                seq.cacheable = False
                marked += 1
        written = gov.owners.select(matches)
        evicted, detached = revoke(gov, written, "invalidated")
        held, verified = erasure_check(gov, written)
        details: dict[str, Any] = {
            "filter": dict(wanted),
            "blocks_zeroized": len(evicted),
            "detached_blocks": len(detached),
            "held_blocks": len(held),
            "sequences_marked": marked,
            "verified": verified,
        }
        deleted = None if gov.offload is None else gov.offload.invalidate(matches)
        if deleted is not None:
            details["offload"] = erasure_details(deleted)
        event_id = gov.audit.record(
            AuditEvent(type=EventType.INVALIDATION, block_ids=tuple(evicted), details=details)
        )
        _log.info("invalidated", filter=dict(wanted), blocks_zeroized=len(evicted))
        return InvalidationReport(
            blocks_zeroized=len(evicted),
            detached_blocks=len(detached),
            held_blocks=len(held),
            sequences_marked=marked,
            verified=verified,
            event_id=event_id,
            offload_deleted={} if deleted is None else dict(deleted.deleted),
        )


def rotate_secret(gov: Governor, new_secret: bytes, live: Iterable[RunningSequence]) -> int:
    """Switch the key secret: see :meth:`GovernedKVCache.rotate_secret`."""
    deriver = KeyDeriver(new_secret)
    with gov.lock:
        gov.check_open()
        for seq in live:
            seq.cacheable = False
        written = gov.owners.held()
        evicted, detached = revoke(gov, written, "secret_rotated")
        gov.deriver = deriver
        held, verified = erasure_check(gov, written)
        details: dict[str, Any] = {
            "blocks_zeroized": len(evicted),
            "detached_blocks": len(detached),
            "held_blocks": len(held),
            "verified": verified,
        }
        if gov.offload is not None:  # every object's key was derived with the old secret
            details["offload"] = erasure_details(gov.offload.drop_all())
        gov.audit.record(
            AuditEvent(type=EventType.SECRET_ROTATION, block_ids=tuple(evicted), details=details)
        )
        return len(evicted)


def sweep(gov: Governor) -> int:
    """Evict and zeroize every cached block past its retention deadline (and tier objects).

    The event's ``details.verified`` (when a block expired): every expired block is
    FREE and reads back as zero bytes (:func:`erasure_check`).

    Returns:
        How many device blocks expired.
    """
    with gov.lock:
        gov.check_open()
        due = gov.deadlines.due(gov.clock())
        expired: list[int] = []
        if due:
            with zeroization_audited(gov):
                expired = gov.pool.evict(due, "expired")
        gov.drain()
        # the expired blocks only: a due block hit since is live KV, not erased (its
        # deadline restarts at its next release)
        verified = erasure_check(gov, expired)[1] if expired else None
    details: dict[str, Any] = {"expired": len(expired)}
    if verified is not None:
        details["verified"] = verified
    # the tiers outside the lock: the store is thread-safe, and Redis may be slow
    tiers = None if gov.offload is None else gov.offload.sweep()
    if tiers is not None and (tiers.total or tiers.unreachable):
        details["offload"] = erasure_details(tiers)
    if expired or "offload" in details:
        gov.audit.record(
            AuditEvent(type=EventType.RETENTION_SWEEP, block_ids=tuple(expired), details=details)
        )
    return len(expired)
