"""An audit trail of policy decisions, written as the governor writes it, for replay tests.

Each helper asks a :class:`PolicyClient` what the governor asks and records the
events the governor records, with the details the trail's contract names:

- admission: ADMISSION (details ``requested_priority``, ``cache``, ``priority``,
  ``reason``, ``ttl_seconds``: the retention decision's TTL when cacheable, else
  null), POLICY_DENIED or POLICY_ERROR (``requested_priority``, ``reason``,
  ``path``), the scope in the columns, ``token_count``, decision id, revision;
- cross-tenant lookup: CROSS_TENANT_REUSE or SHARE_DENIED with the **owner's**
  scope in the columns and ``requester_tenant``.
"""

from __future__ import annotations

from typing import Any

from kvgov.audit import AuditEvent, AuditLog, EventType
from kvgov.policy.client import PolicyClient


def record_admission(
    log: AuditLog, client: PolicyClient, scope: dict[str, Any], tokens: int, priority: int | None
) -> bool:
    """Decide one admission and record it; return whether it was admitted."""
    adm = client.admission(scope, tokens, priority)
    d = adm.decision
    common: dict[str, Any] = {
        **scope,
        "sequence_id": f"seq-{d.decision_id[:8]}",
        "token_count": tokens,
        "decision_id": d.decision_id,
        "policy_revision": d.bundle_revision,
    }
    if not adm.allow:
        kind = EventType.POLICY_ERROR if d.error else EventType.POLICY_DENIED
        details = {"requested_priority": priority, "reason": adm.reason, "path": d.path}
        log.record(AuditEvent(type=kind, **common, details=details))
        return False
    ttl = client.retention(scope).ttl_seconds if adm.cache else None
    details = {
        "requested_priority": priority,
        "cache": adm.cache,
        "priority": adm.priority,
        "reason": adm.reason,
        "ttl_seconds": ttl,
    }
    log.record(AuditEvent(type=EventType.ADMISSION, **common, details=details))
    return True


def record_lookup(
    log: AuditLog, client: PolicyClient, requester_tenant: str, owner: dict[str, Any]
) -> bool:
    """Decide whether ``requester_tenant`` may reuse ``owner``'s blocks, and record it."""
    share = client.sharing({**owner, "tenant": requester_tenant}, owner)
    d = share.decision
    kind = EventType.CROSS_TENANT_REUSE if share.allow else EventType.SHARE_DENIED
    details = {} if share.allow else {"reason": share.reason}
    log.record(
        AuditEvent(
            type=kind,
            **owner,
            requester_tenant=requester_tenant,
            sequence_id="seq-lookup",
            decision_id=d.decision_id,
            policy_revision=d.bundle_revision,
            details=details,
        )
    )
    return share.allow
