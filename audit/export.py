"""The policy decisions in the audit trail, as OPA decision-log entries.

``kvgov audit export --format opa-decision-log`` writes them one JSON object per
line, so OPA's tooling reads them, and ``kvgov policy replay`` re-evaluates them
against a candidate bundle. An entry::

    {"decision_id": "...", "path": "kvgov/admission/decision",
     "input": {...}, "result": {...},           # or "error": {"code", "message"}
     "bundles": {"kvgov": {"revision": "<policy_revision>"}},
     "timestamp": "2025-01-01T12:00:00.000001Z",
     "labels": {"kvgov_event": "<stream>:<seq>", "kvgov_event_type": "admission"}}

What each event type records, and the entries it gives:

=====================  =======================================================
event type             entries
=====================  =======================================================
``admission``          ``kvgov/admission/decision``: input ``{scope, tokens:
                       token_count, priority: details.requested_priority}``,
                       result ``{allow: true, cache, priority, reason}`` from
                       details; and, where ``details.ttl_seconds`` is a number
                       (the request was cacheable), ``kvgov/retention/decision``
                       with input ``{scope}`` and result ``{ttl_seconds}``
                       (decision id ``<admission id>/retention``: the retention
                       decision's own id is not recorded)
``policy_denied``      the rule of ``details.path`` (admission by default),
                       result ``{allow: false, reason}`` (admission: also
                       ``cache: false, priority: 0``)
``policy_error``       the same input, ``error`` instead of a result: the
                       decision failed closed
``cross_tenant_reuse`` ``kvgov/sharing/decision``: input ``{requester, owner}``,
                       result ``{allow: true}`` (and ``reason`` where recorded)
``share_denied``       the same, result ``{allow: false, reason}``
=====================  =======================================================

The scope is the event's scope columns. Sharing events hold the **owner's**
scope and ``requester_tenant``; the requester's scope is the owner's with
``tenant`` replaced (cache keys commit to every scope field but the tenant, so
only such scopes meet). The paths are the policy bundle's rule paths
(``kvgov.policy.client``), restated here because audit does not import policy.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from datetime import datetime
from typing import Any, Final, TextIO

from kvgov.audit.events import EventType
from kvgov.audit.queries import AuditQueries, AuditRecord
from kvgov.schema import SCOPE_FIELDS

__all__ = [
    "ADMISSION_PATH",
    "DECISION_EVENT_TYPES",
    "RETENTION_PATH",
    "SHARING_PATH",
    "decision_log",
    "decision_log_entries",
    "write_decision_log",
]

#: Rule paths of the policy bundle (the same strings as ``kvgov.policy.client``).
ADMISSION_PATH: Final = "kvgov/admission/decision"
SHARING_PATH: Final = "kvgov/sharing/decision"
RETENTION_PATH: Final = "kvgov/retention/decision"
_SCOPE_ONLY_PATHS: Final = frozenset({RETENTION_PATH, "kvgov/sharing/groups"})
_OFFLOAD_PATH: Final = "kvgov/offload/decision"

#: The event types that record a policy decision.
DECISION_EVENT_TYPES: Final = (
    EventType.ADMISSION,
    EventType.POLICY_DENIED,
    EventType.POLICY_ERROR,
    EventType.CROSS_TENANT_REUSE,
    EventType.SHARE_DENIED,
)


def _scope(record: AuditRecord) -> dict[str, Any]:
    return {f: getattr(record, f) for f in SCOPE_FIELDS}


def _timestamp(when: datetime) -> str:
    """RFC 3339 in UTC with microseconds and ``Z``, as OPA writes it."""
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _input(record: AuditRecord, path: str) -> dict[str, Any] | None:
    """The policy input of a decision at ``path`` recorded by ``record``; None if unknown."""
    scope = _scope(record)
    details = record.details
    if path == ADMISSION_PATH:
        return {
            "scope": scope,
            "tokens": record.token_count,
            "priority": details.get("requested_priority"),
        }
    if path == SHARING_PATH:
        return {"requester": {**scope, "tenant": record.requester_tenant}, "owner": scope}
    if path in _SCOPE_ONLY_PATHS:
        return {"scope": scope}
    if path == _OFFLOAD_PATH and "tier" in details:
        return {"scope": scope, "tier": details["tier"]}
    return None


def _entry(
    record: AuditRecord,
    path: str,
    result: Mapping[str, Any] | None,
    *,
    decision_id: str | None = None,
    error: str | None = None,
) -> dict[str, Any] | None:
    policy_input = _input(record, path)
    if policy_input is None:
        return None
    entry: dict[str, Any] = {
        "decision_id": decision_id or record.decision_id,
        "path": path,
        "input": policy_input,
    }
    if error is not None:
        entry["error"] = {"code": "kvgov_fail_closed", "message": error}
    else:
        entry["result"] = dict(result or {})
    entry["bundles"] = {"kvgov": {"revision": record.policy_revision}}
    entry["timestamp"] = _timestamp(record.time)
    entry["labels"] = {"kvgov_event": record.event_id, "kvgov_event_type": record.type}
    return entry


def _pick(details: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {k: details[k] for k in keys if k in details}


def decision_log_entries(record: AuditRecord) -> list[dict[str, Any]]:
    """The decision-log entries one audit event gives (see the module docstring).

    Args:
        record: a stored event.

    Returns:
        No entry for an event that records no decision (or a rule whose input the
        event does not hold), one, or two (an admission with its retention).
    """
    details = record.details
    entries: list[dict[str, Any] | None] = []
    if record.type == EventType.ADMISSION:
        result = {"allow": True, **_pick(details, "cache", "priority", "reason")}
        entries.append(_entry(record, ADMISSION_PATH, result))
        ttl = details.get("ttl_seconds")
        if isinstance(ttl, int | float) and not isinstance(ttl, bool):
            retention_id = f"{record.decision_id}/retention" if record.decision_id else None
            entries.append(
                _entry(record, RETENTION_PATH, {"ttl_seconds": ttl}, decision_id=retention_id)
            )
    elif record.type in (EventType.POLICY_DENIED, EventType.POLICY_ERROR):
        path = details.get("path")
        if not isinstance(path, str):
            path = ADMISSION_PATH
        reason = details.get("reason", "")
        if record.type == EventType.POLICY_ERROR:
            entries.append(_entry(record, path, None, error=str(reason)))
        else:
            denied = {"allow": False, "reason": reason}
            if path == ADMISSION_PATH:
                denied = {"allow": False, "cache": False, "priority": 0, "reason": reason}
            entries.append(_entry(record, path, denied))
    elif record.type == EventType.CROSS_TENANT_REUSE:
        entries.append(_entry(record, SHARING_PATH, {"allow": True, **_pick(details, "reason")}))
    elif record.type == EventType.SHARE_DENIED:
        entries.append(
            _entry(record, SHARING_PATH, {"allow": False, "reason": details.get("reason", "")})
        )
    return [e for e in entries if e is not None]


def decision_log(
    queries: AuditQueries,
    *,
    since: datetime | None = None,
    until: datetime | None = None,
    tenant: str | None = None,
) -> Iterator[dict[str, Any]]:
    """The recorded decisions of a time window as decision-log entries, oldest first.

    Args:
        queries: the audit database.
        since: inclusive lower time bound.
        until: exclusive upper time bound.
        tenant: only decisions where this tenant is the one asking or the owner.

    Yields:
        The entries (streamed: a week of decisions is never held at once).
    """
    for record in queries.iter_events(DECISION_EVENT_TYPES, tenant, since, until):
        yield from decision_log_entries(record)


def write_decision_log(out: TextIO, entries: Iterable[Mapping[str, Any]]) -> int:
    """Write entries one compact JSON object per line.

    Args:
        out: a text stream.
        entries: the entries.

    Returns:
        The number written.
    """
    n = 0
    for entry in entries:
        out.write(json.dumps(entry, separators=(",", ":"), ensure_ascii=False) + "\n")
        n += 1
    return n
