"""Finding the cached prefix a scope may use on a driven pool: :class:`HitFinder`.

A scope looks for its prompt's blocks in the namespace it publishes in, then in
its tenant's own and every share group it may read (a public prefix first where
that scope publishes, then where it may read). A hit on a block another tenant
wrote is used only if the sharing policy allows that requester and that owner
(:mod:`kvgov.govern.sharing`), and every reuse is audited.

Only a binding that drives its pool looks prefixes up itself (kvgov's own
:class:`~kvgov.govern.cache.GovernedKVCache`, on a
:class:`~kvgov.govern.protocol.DrivenPool`); vLLM's scheduler looks up in its
own pool, and its binding judges those hits with :mod:`kvgov.govern.sharing`
directly. The finder runs under the governor's lock.
"""

from __future__ import annotations

from collections.abc import Callable

from kvgov.audit import AuditLog, Deferred
from kvgov.policy import PolicyClient

from . import sharing
from .keys import KeyDeriver
from .ledger import Ledger
from .plan import KeyPlan
from .protocol import DrivenPool
from .views import ScopeView

__all__ = ["HitFinder"]


class HitFinder:
    """Prefix lookup over a scope's namespaces, the sharing check and the reuse audit.

    Args:
        pool: the driven pool the lookups go to.
        ledger: the governor's ledger (owners, views, counters).
        policy: the sharing policy.
        audit: the audit log.
        block_size: tokens per block.
        drain: the governor's drain (pool events into the ledger and the audit trail),
            called after every pool call.
    """

    def __init__(
        self,
        pool: DrivenPool,
        ledger: Ledger,
        policy: PolicyClient,
        audit: AuditLog,
        block_size: int,
        drain: Callable[[], None],
    ) -> None:
        self.pool = pool
        self.ledger = ledger
        self.policy = policy
        self.audit = audit
        self.block_size = block_size
        self.drain = drain

    def find_hits(
        self,
        deriver: KeyDeriver,
        view: ScopeView,
        plan: KeyPlan,
        packed: bytes,
        seq_id: str,
        deferred: list[Deferred],
    ) -> list[int]:
        """The longest cached prefix the scope may use, with a reference taken on each block.

        Looks in the publish namespace, then the tenant's own and every readable
        share group (a public prefix first where that scope publishes, then where
        it may read); cuts the hit at the first block whose owner the sharing
        policy refuses; audits the reuse. The critical events (a cross-tenant
        reuse, a refused share) are appended to the chain here and their waits
        added to ``deferred``: the binding waits on them after releasing the
        lock, before it hands the blocks out, so no database wait holds the lock.
        ``deriver`` is the governor's at the call (it changes on a secret rotation).
        """
        if not plan.cacheable or not plan.max_hit:
            return []
        if plan.prefix_blocks:
            hits = self._prefix_lookup(deriver, plan, packed)
        else:
            hits = self.pool.lookup(plan.keys[: plan.max_hit])
            hits = self._longest_hit(deriver, hits, plan.read_roots, packed, view, plan.max_hit)
        self.drain()
        if not hits:
            return hits
        try:
            keep = self._check_sharing(
                view, hits, seq_id, plan.prefix_view, plan.prefix_blocks, deferred
            )
        except BaseException:
            self.pool.free(hits)
            self.drain()
            raise
        if keep < len(hits):
            self.pool.free(hits[keep:])
            self.drain()
            del hits[keep:]
        return hits

    def _prefix_lookup(self, deriver: KeyDeriver, plan: KeyPlan, packed: bytes) -> list[int]:
        """Longest hit for an admission with a public prefix; takes a reference on it only.

        The prefix is looked up where the public scope publishes, then, if that
        misses part of it, in every other namespace the public scope may read
        (its tenant's own, its readable share groups); the rest of the prompt
        only in the scope's own namespace, chained from its own prefix keys.
        """
        max_hit = plan.max_hit
        best = self.pool.lookup(plan.keys[:max_hit])
        span = min(plan.prefix_blocks, max_hit)
        if len(best) >= span or plan.prefix_view is None:
            return best
        best = self._longest_hit(
            deriver, best, plan.prefix_read_roots, packed, plan.prefix_view, span
        )
        if len(best) == span < max_hit:  # the whole prefix, found in another namespace
            best += self.pool.lookup(plan.keys[span:max_hit])
        return best

    def _longest_hit(
        self,
        deriver: KeyDeriver,
        best: list[int],
        roots: tuple[bytes, ...],
        packed: bytes,
        view: ScopeView,
        count: int,
    ) -> list[int]:
        """The longest of ``best`` and the hits of the first ``count`` blocks in each root.

        Chains of namespaces other than the publish one are derived only here and
        only until a hit covers all ``count`` blocks, so a scope without share
        groups pays for one chain; every hit but the longest is given back, so a
        reference is held on the returned blocks only.
        """
        pool = self.pool
        for root in roots:
            if len(best) == count:
                break
            chain = deriver.derive_chain(root, packed, view.digest, self.block_size, count)
            found = pool.lookup(chain)
            if len(found) > len(best):
                best, found = found, best
            if found:
                pool.free(found)
        return best

    def _check_sharing(
        self,
        view: ScopeView,
        hit_ids: list[int],
        seq_id: str,
        prefix_view: ScopeView | None,
        prefix_blocks: int,
        deferred: list[Deferred],
    ) -> int:
        """How many leading hit blocks the sharing policy lets the requester use; audits.

        Judges, then audits the reuse of the blocks kept (:mod:`kvgov.govern.sharing`),
        the critical events deferred. Gives nothing back itself: :meth:`find_hits`
        frees the blocks past the cut, or every hit block if this raises.
        """
        ledger, audit = self.ledger, self.audit
        verdict = sharing.judge(
            ledger, self.policy, audit, view, hit_ids, seq_id, prefix_view, prefix_blocks, deferred
        )
        sharing.audit_reuse(
            ledger,
            audit,
            self.block_size,
            view,
            hit_ids[: verdict.keep],
            seq_id,
            verdict.granted,
            deferred,
        )
        return verdict.keep
