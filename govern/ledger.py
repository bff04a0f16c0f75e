"""The governor's state, in one object: :class:`Ledger`.

Everything the governor knows that a pool does not, kept by block id or by
tenant, and nothing else (no policy, no audit log, no pool)::

    owners       block -> the scope that wrote it        (ownership.Owners)
    deadlines    block -> when its retention ends         (retention.Deadlines)
    views        scope -> policy input, digest, roots     (views.ScopeViews)
    counters     tenant -> its counters                   (stats.TenantCounters)
    unattributed counters of blocks without an owner
    purging      tenants being erased now (admissions refused)
    eviction     tenant -> cache floor, cap, priority duration (quotas.EvictionRules)

The :class:`~kvgov.govern.governor.Governor` owns one ledger and passes it to
the helpers that read or change it (:mod:`kvgov.govern.sharing`,
:class:`~kvgov.govern.hits.HitFinder`, :class:`~kvgov.govern.offloading.Offloading`),
together with exactly the collaborators each needs (the policy client, the
audit log, the pool). Only code running under the governor's lock changes it;
``purging`` is the exception, read without the lock by admissions (a set's
``in`` and ``add`` are atomic).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from kvgov.policy import PolicyClient

from .ownership import Owners
from .quotas import EvictionRules
from .retention import Deadlines
from .stats import TenantCounters
from .views import ScopeViews

__all__ = ["Ledger"]


@dataclass(eq=False, slots=True)
class Ledger:
    """The governor's bookkeeping: see the module docstring.

    Build one with :meth:`create`.

    Attributes:
        owners: the writer's scope of every block, by block id.
        deadlines: the retention deadline of every CACHED block.
        views: the policy view of every scope seen.
        counters: per tenant.
        unattributed: counters of events on blocks without an owner.
        purging: tenants whose erasure runs now.
        eviction: each tenant's cache floor and cap (in blocks) and priority
            duration, from the policy (replaced whole, under the lock, when the
            bundle changes: see ``Governor.sync_eviction``).
    """

    owners: Owners
    deadlines: Deadlines
    views: ScopeViews
    counters: defaultdict[str, TenantCounters] = field(
        default_factory=lambda: defaultdict(TenantCounters)
    )
    unattributed: TenantCounters = field(default_factory=TenantCounters)
    purging: set[str] = field(default_factory=set)
    eviction: EvictionRules = field(default_factory=EvictionRules)

    @classmethod
    def create(
        cls, num_blocks: int, policy: PolicyClient, clock: Callable[[], float] = time.time
    ) -> Ledger:
        """An empty ledger for a pool of ``num_blocks`` blocks.

        Args:
            num_blocks: blocks in the pool.
            policy: the policy client the scope views read classifications from.
            clock: seconds since the epoch (retention deadlines).
        """
        return cls(
            owners=Owners(num_blocks),
            deadlines=Deadlines(num_blocks, clock),
            views=ScopeViews(policy),
        )
