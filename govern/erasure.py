"""Erasure and maintenance through a governor: purge, invalidate, rotate, sweep.

Each function selects the blocks from the governor's own bookkeeping (owners,
deadlines), has the pool revoke or evict them through the pool protocol,
drains the pool's events into the audit trail, and writes the operation's own
event. They take the governor's lock; a binding passes its running sequences
(``live``) so the ones that match stop caching.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from contextlib import contextmanager
from typing import Any

from kvgov.audit import AuditEvent, EventType
from kvgov.exceptions import InvalidArgument, InvalidScope, ZeroizationError

from .governor import Governor, LiveSequence, _log
from .keys import KeyDeriver
from .results import ErasureReport, InvalidationReport
from .scope import CacheScope

__all__ = ["SCOPE_FILTERS", "invalidate", "purge_tenant", "rotate_secret", "sweep"]

#: The scope fields :func:`invalidate` can filter on.
SCOPE_FILTERS = (
    "model",
    "model_revision",
    "adapter",
    "adapter_revision",
    "tokenizer",
    "tokenizer_revision",
    "template_version",
)


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


def purge_tenant(gov: Governor, tenant: str, live: Iterable[LiveSequence]) -> ErasureReport:
    """Erase a tenant: see :meth:`kvgov.govern.GovernedKVCache.purge_tenant`.

    The blocks are revoked under the governor's lock; the erasure event, which
    the audit log writes through to its store, is recorded after the lock is
    released (the tenant's admissions stay refused until it is), so a slow
    audit database never stalls other tenants.
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
            evicted, detached = revoke(gov, gov.owners.of_tenant(tenant), "purged")
            # verified only when every block of the tenant is zero now: a detached one
            # (still held by a running sequence) is zeroized only at its release
            verified = not detached and gov.pool.read_back_zero(evicted) is True
            finished = gov.clock()
            nbytes = len(evicted) * gov.pool.bytes_per_block
        recorded = gov.audit.record_durable(
            AuditEvent(
                type=EventType.ERASURE,
                tenant=tenant,
                block_ids=tuple(evicted),
                details={
                    "blocks_zeroized": len(evicted),
                    "bytes_zeroized": nbytes,
                    "detached_blocks": len(detached),
                    "in_flight_sequences": in_flight,
                    "verified": verified,
                    "finished_at": finished,
                },
            )
        )
        _log.info(
            "tenant_erased",
            tenant=tenant,
            blocks_zeroized=len(evicted),
            in_flight=len(in_flight),
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
            verified=verified,
            event_id=recorded.event_id,
            finished_at=finished,
            evidence=recorded.evidence,
        )
    finally:
        gov.purging.discard(tenant)


def invalidate(
    gov: Governor, wanted: Mapping[str, str], live: Iterable[LiveSequence]
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
        evicted, detached = revoke(gov, gov.owners.select(matches), "invalidated")
        event_id = gov.audit.record(
            AuditEvent(
                type=EventType.INVALIDATION,
                block_ids=tuple(evicted),
                details={
                    "filter": dict(wanted),
                    "blocks_zeroized": len(evicted),
                    "detached_blocks": len(detached),
                    "sequences_marked": marked,
                },
            )
        )
        _log.info("invalidated", filter=dict(wanted), blocks_zeroized=len(evicted))
        return InvalidationReport(
            blocks_zeroized=len(evicted),
            detached_blocks=len(detached),
            sequences_marked=marked,
            event_id=event_id,
        )


def rotate_secret(gov: Governor, new_secret: bytes, live: Iterable[LiveSequence]) -> int:
    """Switch the key secret: see :meth:`GovernedKVCache.rotate_secret`."""
    deriver = KeyDeriver(new_secret)
    with gov.lock:
        gov.check_open()
        for seq in live:
            seq.cacheable = False
        evicted, detached = revoke(gov, gov.owners.held(), "secret_rotated")
        gov.deriver = deriver
        gov.audit.record(
            AuditEvent(
                type=EventType.SECRET_ROTATION,
                block_ids=tuple(evicted),
                details={"blocks_zeroized": len(evicted), "detached_blocks": len(detached)},
            )
        )
        return len(evicted)


def sweep(gov: Governor) -> int:
    """Evict and zeroize every cached block past its retention deadline.

    Returns:
        How many blocks expired.
    """
    with gov.lock:
        gov.check_open()
        due = gov.deadlines.due(gov.clock())
        expired: list[int] = []
        if due:
            with zeroization_audited(gov):
                expired = gov.pool.evict(due, "expired")
        gov.drain()
        if expired:
            gov.audit.record(
                AuditEvent(
                    type=EventType.RETENTION_SWEEP,
                    block_ids=tuple(expired),
                    details={"expired": len(expired)},
                )
            )
        return len(expired)
