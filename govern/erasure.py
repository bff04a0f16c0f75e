"""What every erasure shares: the scope filters, the zeroization audit, the verification.

The erasure operations themselves (``purge_tenant``, ``invalidate``,
``rotate_secret``, ``sweep``) are the governor's
(:class:`~kvgov.govern.governor.Governor`): they select the blocks from its
ledger (owners, deadlines), have the pool revoke or evict them through the
observed-pool protocol, drain the pool's events into the audit trail and write
the operation's own event. This module holds the pieces they share, each taking
only what it reads.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from kvgov.allocator import BlockState
from kvgov.audit import AuditEvent, AuditLog, EventType
from kvgov.exceptions import InvalidArgument, ZeroizationError
from kvgov.offload import DeleteReport, ShredReport
from kvgov.schema import SCOPE_FILTERS

from .protocol import ObservedPool

__all__ = [
    "SCOPE_FILTERS",
    "check_filters",
    "erasure_check",
    "erasure_details",
    "zeroization_audited",
]


def check_filters(wanted: Mapping[str, str]) -> None:
    """Check an invalidation's filters: scope field -> value, at least one.

    Raises:
        InvalidArgument: no filter, a field that is not in :data:`SCOPE_FILTERS`,
            or a value that is not a non-empty string.
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


@contextmanager
def zeroization_audited(audit: AuditLog) -> Iterator[None]:
    """Audit a ZeroizationError raised inside the block, then let it propagate."""
    try:
        yield
    except ZeroizationError as exc:
        audit.record(
            AuditEvent(
                type=EventType.ZEROIZATION_FAILURE,
                block_ids=exc.block_ids,
                details={"error": str(exc)},
            )
        )
        raise


def erasure_check(pool: ObservedPool, written: Sequence[int]) -> tuple[list[int], bool]:
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
    states = pool.states(written)
    held = [b for b, state in zip(written, states, strict=True) if state is not BlockState.FREE]
    return held, not held and pool.read_back_zero(written) is True


def erasure_details(report: ShredReport | DeleteReport) -> dict[str, Any]:
    """What an audit event says of a tier erasure (never key material, never payload)."""
    out: dict[str, Any] = {
        "deleted": dict(report.deleted),
        "unreachable": list(report.unreachable),
    }
    if isinstance(report, ShredReport):
        out["destroyed_key_ids"] = list(report.destroyed_key_ids)
    return out
