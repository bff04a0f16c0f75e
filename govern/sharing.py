"""May a requester use the blocks a prefix lookup found? :func:`judge_hits`.

A hit can land on a block another tenant wrote only in a share group's
namespace (keys commit to every scope field but the tenant, and each tenant
has its own namespace). Such a block is used only if the sharing policy allows
that requester and that owner. The hit is cut at the first block the policy
refuses: a prefix cache hit must be a prefix.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kvgov.exceptions import InternalError
from kvgov.policy import Decision, PolicyClient, SharingDecision

from .scope import CacheScope
from .views import ScopeView

__all__ = ["HitVerdict", "judge_hits"]


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
