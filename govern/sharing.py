"""May a requester use the blocks a prefix lookup found, and the audit of the reuse.

A hit can land on a block another tenant wrote only in a share group's
namespace (keys commit to every scope field but the tenant, and each tenant
has its own namespace). Such a block is used only if the sharing policy allows
that requester and that owner. The hit is cut at the first block the policy
refuses: a prefix cache hit must be a prefix.

Two steps, so that a binding whose engine commits a hit later than it looks it
up (vLLM's scheduler may look a request up, then not schedule it) judges at
the lookup and audits what was committed:

* :func:`judge` (pure policy: :func:`judge_hits`) cuts the hit and audits a
  refusal (SHARE_DENIED);
* :func:`audit_reuse` writes one REUSE or CROSS_TENANT_REUSE event per owner
  scope of the blocks actually reused.

``GovernedKVCache`` runs both at its lookup (``HitFinder.find_hits``); vLLM's
binding judges at vLLM's lookup and audits at its allocation. Both take the
governor's :class:`~kvgov.govern.ledger.Ledger` and the collaborators they use,
and assume the governor's lock is held.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvgov.audit import AuditEvent, AuditLog, Deferred, EventType
from kvgov.audit.events import trusted_event
from kvgov.exceptions import InternalError
from kvgov.policy import Decision, PolicyClient, SharingDecision

from .ledger import Ledger
from .scope import CacheScope
from .views import ScopeView

__all__ = ["HitVerdict", "audit_reuse", "judge", "judge_hits"]


@dataclass(slots=True)
class HitVerdict:
    """What the sharing policy made of one lookup's hits.

    Attributes:
        keep: how many leading hit blocks may be used.
        granted: the decision that allowed each (requester scope, owner scope)
            pair of another tenant among the kept blocks.
        denied: the owner and the refusal that cut the hit, or None.
    """

    keep: int
    granted: dict[tuple[CacheScope, CacheScope], Decision] = field(default_factory=dict)
    denied: tuple[CacheScope, SharingDecision] | None = None


def judge_hits(
    policy: PolicyClient,
    view_of: Callable[[CacheScope], ScopeView],
    owners: Sequence[CacheScope | None],
    view: ScopeView,
    hit_ids: Sequence[int],
    prefix_view: ScopeView | None = None,
    prefix_blocks: int = 0,
) -> HitVerdict:
    """Judge every hit block another tenant owns, in order, until one is refused.

    The requester is judged under the scope it asked for: the public prefix
    scope for the first ``prefix_blocks`` blocks, ``view`` for the rest. One
    decision per (requester scope, owner scope) pair.

    Args:
        policy: the sharing policy.
        view_of: the view of an owner scope.
        owners: owner scope by block id.
        view: the requester's scope.
        hit_ids: the blocks the lookup found, in order.
        prefix_view: the public prefix scope, if the admission has one.
        prefix_blocks: blocks keyed under it.

    Returns:
        The verdict.

    Raises:
        InternalError: a hit block has no owner (a bug in kvgov).
    """
    requester = view.scope.tenant
    verdict = HitVerdict(keep=len(hit_ids))
    for i, b in enumerate(hit_ids):
        owner = owners[b]
        if owner is None:
            raise InternalError(f"cached block {b} has no owner")
        if owner.tenant == requester:
            continue
        asking = prefix_view if prefix_view is not None and i < prefix_blocks else view
        pair = (asking.scope, owner)
        if pair in verdict.granted:
            continue
        share = policy.sharing(asking.fields, view_of(owner).fields)
        if not share.allow:
            verdict.keep, verdict.denied = i, (owner, share)
            break
        verdict.granted[pair] = share.decision
    return verdict


def judge(
    ledger: Ledger,
    policy: PolicyClient,
    audit: AuditLog,
    view: ScopeView,
    hit_ids: Sequence[int],
    seq_id: str,
    prefix_view: ScopeView | None = None,
    prefix_blocks: int = 0,
    deferred: list[Deferred] | None = None,
) -> HitVerdict:
    """How many leading hit blocks the requester may use; a refusal is counted and audited.

    Hits on the requester's own tenant's blocks need no decision (the common
    case, one owner lookup per distinct owner); any other owner is judged by
    :func:`judge_hits`. Gives no block back itself: the caller drops the blocks
    past ``keep``.

    Args:
        ledger: the governor's ledger (its lock held): owners, views, counters.
        policy: the sharing policy.
        audit: the audit log.
        view: the requester's scope.
        hit_ids: the blocks the lookup found, in order.
        seq_id: the requesting sequence (for the audit trail).
        prefix_view: the public prefix scope, if the admission has one.
        prefix_blocks: blocks keyed under it.
        deferred: where to put the wait of the refusal's (critical) audit event, for
            a binding that waits after releasing its lock; None writes it here.

    Returns:
        The verdict: ``keep``, the decisions that granted other tenants' blocks,
        and the refusal that cut the hit, if any.
    """
    requester = view.scope.tenant
    owners, views = ledger.owners, ledger.views
    if all(o is not None and o.tenant == requester for o, _ in owners.group(hit_ids)):
        return HitVerdict(keep=len(hit_ids))
    verdict = judge_hits(
        policy,
        lambda owner: views.view(owner, admitted=True),
        owners.table,
        view,
        hit_ids,
        prefix_view,
        prefix_blocks,
    )
    if verdict.denied is not None:
        owner, share = verdict.denied
        ledger.counters[requester].cross_tenant_denied += 1
        _critical(
            audit,
            AuditEvent(
                type=EventType.SHARE_DENIED,
                **{**views.view(owner, admitted=True).fields, "requester_tenant": requester},
                sequence_id=seq_id,
                decision_id=share.decision.decision_id,
                policy_revision=share.decision.bundle_revision,
                details={"reason": share.reason},
            ),
            deferred,
        )
    return verdict


def audit_reuse(
    ledger: Ledger,
    audit: AuditLog,
    block_size: int,
    view: ScopeView,
    reused_ids: Sequence[int],
    seq_id: str,
    granted: dict[tuple[CacheScope, CacheScope], Decision],
    deferred: list[Deferred] | None = None,
) -> None:
    """Audit a reuse: one REUSE (own tenant) or CROSS_TENANT_REUSE event per owner scope.

    Args:
        ledger: the governor's ledger (its lock held): owners, views, counters.
        audit: the audit log.
        block_size: tokens per block (the reused token count).
        view: the requester's scope.
        reused_ids: the blocks reused, a prefix of what :func:`judge` kept.
        seq_id: the requesting sequence.
        granted: :attr:`HitVerdict.granted` of that judgement.
        deferred: as for :func:`judge` (a cross-tenant reuse is critical).

    Raises:
        InternalError: a reused block has no owner, or another tenant's block was
            reused without a granting decision (a bug in kvgov).
    """
    requester = view.scope.tenant
    counters = ledger.counters[requester]
    per_block = block_size
    # every owner checked before any event is written: a refused hit records no reuse
    checked: list[tuple[CacheScope, Sequence[int], Decision | None]] = []
    for owner, ids in ledger.owners.group(reused_ids):
        if owner is None:
            raise InternalError(f"reused blocks {list(ids)[:8]} have no owner")
        decision = None
        if owner.tenant != requester:
            decision = next((d for (_, o), d in granted.items() if o == owner), None)
            if decision is None:
                raise InternalError(
                    f"tenant {requester!r} reused blocks of {owner.tenant!r} unjudged"
                )
        checked.append((owner, ids, decision))
    for owner, ids, decision in checked:
        owner_view = ledger.views.view(owner, admitted=True)
        if decision is None:  # the requester's own tenant
            audit.record(  # kvgov's own values only: the scopes, the checked id, the blocks
                trusted_event(
                    EventType.REUSE,
                    owner_view.values,
                    requester_tenant=requester,
                    sequence_id=seq_id,
                    block_ids=tuple(ids),
                    reused_tokens=len(ids) * per_block,
                )
            )
            continue
        fields = {**owner_view.fields, "requester_tenant": requester}
        counters.cross_tenant_reuses += 1
        _critical(
            audit,
            AuditEvent(
                type=EventType.CROSS_TENANT_REUSE,
                **fields,
                sequence_id=seq_id,
                block_ids=tuple(ids),
                reused_tokens=len(ids) * per_block,
                decision_id=decision.decision_id,
                policy_revision=decision.bundle_revision,
            ),
            deferred,
        )


def _critical(audit: AuditLog, event: AuditEvent, deferred: list[Deferred] | None) -> None:
    """Write a critical event now, or append it and leave its wait in ``deferred``."""
    if deferred is None:
        audit.record(event)
    else:
        deferred.append(audit.defer(event))
