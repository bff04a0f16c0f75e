"""The governor's offload tiers: capture on capacity eviction, restore on admission, erasure.

:class:`Offloading` joins an :class:`~kvgov.offload.OffloadStore` (sealing, tiers,
tenant keys) to a governor's ledger and its driven pool. It is attached once
(:meth:`Offloading.attach`), and the binding hands it to the governor
(``Governor.offload``); without it the governor does no offload work at all
(one ``is None`` test per admission)::

    capacity eviction (inside pool.allocate)          admission (GovernedKVCache.admit)
    ---------------------------------------           ------------------------------------
    pool -> observer(EvictedBlocks)                   HitFinder.find_hits: the device's prefix
      not a pressure reason?        -> nothing        allocate the rest
      per owner scope:                                restore(): for each next key the
        tenant purging?             -> skip             scope's own namespace holds, in
        published in a share group? -> skip             the tiers in order:
        policy.offload(scope, tier) per tier              store.restore(key, digest,
      per block: store.offload(key, digest,                   tenant, into=the new block)
          owner tenant, deadline, bytes,                  refusals -> OFFLOAD_REFUSED
          tiers=allowed)                                  a miss    -> stop
      OFFLOAD audit event per tier                      OFFLOAD_RESTORE per tier
    then the pool zeroizes the blocks                 the binding keys them as new blocks

Why only the scope's own namespace: a block published in a share group may have
been sealed by another tenant, under that tenant's data key. Restoring it for this
requester would need the sharing decision on an owner nobody can see before the
object is opened; such blocks are neither offloaded nor restored (device sharing
is unchanged). Restricted data never reaches a tier: it is never cached, and the
offload policy denies it besides.

Thread safety: everything here runs under the governor's lock (the observer
inside a pool call a governed binding makes under it).
"""

from __future__ import annotations

import math
from collections import Counter, OrderedDict
from collections.abc import Callable, Sequence

from kvgov.allocator import PRESSURE_REASONS, EvictedBlocks
from kvgov.audit import AuditEvent, AuditLog, Deferred, EventType
from kvgov.defaults import MAX_SCOPES
from kvgov.exceptions import InvalidArgument, OffloadError
from kvgov.offload import (
    DeleteReport,
    OffloadStore,
    PutOutcome,
    Refusal,
    ShredReport,
    WrappedKeyStore,
)
from kvgov.policy import PolicyClient

from .ledger import Ledger
from .logs import get_logger
from .plan import KeyPlan
from .protocol import OffloadablePool
from .scope import CacheScope
from .stats import OffloadSnapshot
from .views import ScopeView

__all__ = ["Offloading"]

_log = get_logger()

#: The eviction reasons that are offloaded (allocation pressure: capacity, priority,
#: cap, floor pressure); purge, invalidation, rotation, expiry and close destroy the
#: KV on purpose.
OFFLOADED_REASONS = PRESSURE_REASONS


class _Attached:
    """What an attached :class:`Offloading` works with: the governor's parts it reads."""

    __slots__ = ("audit", "block_size", "ledger", "policy", "pool")

    def __init__(
        self,
        ledger: Ledger,
        policy: PolicyClient,
        audit: AuditLog,
        pool: OffloadablePool,
        block_size: int,
    ) -> None:
        self.ledger = ledger
        self.policy = policy
        self.audit = audit
        self.pool = pool
        self.block_size = block_size


class Offloading:
    """Encrypted offload tiers wired into a governor: see the module docstring.

    Args:
        store: the offload store (its tiers are looked up in order).
        key_store: a wrapped-key store this object opened and must close with the
            store; None when the caller owns it.
    """

    def __init__(self, store: OffloadStore, *, key_store: WrappedKeyStore | None = None) -> None:
        self.store = store
        self._key_store = key_store
        self._tiers = store.tier_names
        self._parts: _Attached | None = None
        self._denied: Counter[str] = Counter()
        self._not_offloaded: Counter[str] = Counter()
        self._restore_errors = 0
        # digest -> scope of every scope whose blocks went to or came from the tiers,
        # so that invalidate() can name their digests (objects carry only the digest)
        self._scopes: OrderedDict[bytes, CacheScope] = OrderedDict()

    @property
    def tier_names(self) -> tuple[str, ...]:
        """The tiers' names, in lookup order (the names the offload policy is asked about)."""
        return self._tiers

    def attach(
        self,
        ledger: Ledger,
        policy: PolicyClient,
        audit: AuditLog,
        pool: object,
        block_size: int,
    ) -> None:
        """Wire into a governor's ledger and its pool: observe the pool's evictions.

        The binding then hands this object to the governor (``Governor.offload``),
        which reaches it on admission, erasure, stats and close.

        Args:
            ledger: the governor's ledger (owners, deadlines, views, counters, purging).
            policy: the policy client (offload decisions).
            audit: the audit log.
            pool: the pool; it must be an :class:`~kvgov.govern.protocol.OffloadablePool`.
            block_size: tokens per block.

        Raises:
            InvalidArgument: the pool cannot show evicted bytes or give block views,
                or this object is attached already.
        """
        if self._parts is not None:
            raise InvalidArgument("offload", self, "is attached to a governor already")
        if not isinstance(pool, OffloadablePool):
            raise InvalidArgument(
                "pool",
                type(pool).__name__,
                "offload needs a pool with set_eviction_observer() and block() "
                "(kvgov.allocator.BlockPool); leave offload unset for this binding",
            )
        self._parts = _Attached(ledger, policy, audit, pool, block_size)
        pool.set_eviction_observer(self._on_evict)

    def _bound(self) -> _Attached:
        if self._parts is None:
            raise InvalidArgument("offload", self, "attach it to a governor first")
        return self._parts

    # ------------------------------------------------------------------ capture

    def _on_evict(self, evicted: EvictedBlocks) -> None:
        """The pool's eviction observer: offload capacity evictions; never raise."""
        if evicted.reason not in OFFLOADED_REASONS:
            return
        try:
            self._capture(evicted)
        except Exception as exc:  # an offload failure must never stop an eviction
            self._not_offloaded["error"] += len(evicted.block_ids)
            _log.warning("offload_failed", error=repr(exc))

    def _capture(self, evicted: EvictedBlocks) -> None:
        parts = self._bound()
        ledger = parts.ledger
        key_of = dict(zip(evicted.block_ids, evicted.keys, strict=True))
        for owner, ids in ledger.owners.group(evicted.block_ids):
            if owner is None:  # pragma: no cover - every CACHED block has an owner
                continue
            if owner.tenant in ledger.purging:
                self._not_offloaded["purging"] += len(ids)
                continue
            view = ledger.views.view(owner, admitted=True)
            tiers = self._allowed(parts, view, len(ids))
            if not tiers:
                continue
            stored: dict[str, list[int]] = {}
            key_id = None
            for b in ids:
                deadline = ledger.deadlines.deadline(b)
                if not math.isfinite(deadline):
                    self._not_offloaded["no_deadline"] += 1
                    continue
                result = self.store.offload(
                    key_of[b], view.digest, owner.tenant, deadline, evicted.payload(b), tiers=tiers
                )
                key_id = result.key_id or key_id
                for put in result.puts:
                    if put.outcome is PutOutcome.STORED:
                        stored.setdefault(put.tier, []).append(b)
            if stored:
                self._remember(view)
                ledger.counters[owner.tenant].blocks_offloaded += len(set().union(*stored.values()))
                for tier, blocks in stored.items():
                    parts.audit.record(
                        AuditEvent(
                            type=EventType.OFFLOAD,
                            **view.fields,
                            block_ids=tuple(blocks),
                            details={"tier": tier, "key_id": key_id, "reason": evicted.reason},
                        )
                    )

    def _allowed(self, parts: _Attached, view: ScopeView, n: int) -> tuple[str, ...]:
        """The tiers the offload policy allows for a scope's ``n`` evicted blocks."""
        root, _read, _groups = parts.ledger.views.namespaces(view)
        if root != view.own_root:  # published in a share group: see the module docstring
            self._not_offloaded["shared_namespace"] += n
            return ()
        allowed = []
        for tier in self._tiers:
            decision = parts.policy.offload(view.fields, tier)
            if decision.allow:
                allowed.append(tier)
                continue
            self._denied[tier] += n
            d = decision.decision
            if d.error is not None:  # fail closed (nothing offloaded), and say so
                parts.audit.record(
                    AuditEvent(
                        type=EventType.POLICY_ERROR,
                        **view.fields,
                        decision_id=d.decision_id,
                        policy_revision=d.bundle_revision,
                        details={"reason": d.error, "path": d.path, "tier": tier},
                    )
                )
        return tuple(allowed)

    def _remember(self, view: ScopeView) -> None:
        scopes = self._scopes
        if view.digest in scopes:
            scopes.move_to_end(view.digest)
            return
        scopes[view.digest] = view.scope
        if len(scopes) > MAX_SCOPES:
            scopes.popitem(last=False)

    # ------------------------------------------------------------------ restore

    def restore(
        self,
        view: ScopeView,
        plan: KeyPlan,
        block_ids: Sequence[int],
        first: int,
        seq_id: str,
        deferred: list[Deferred],
    ) -> int:
        """Fill an admission's new blocks from the tiers, from ``first`` on, until a miss.

        The blocks are OWNED and zero; each restored one holds its KV verified and
        decrypted, a missed one stays zero (the store zeroes it again after a
        refused decryption). Refusals and restores are audited; a refusal is a
        critical event, appended here and awaited by the binding after it releases
        the lock (its wait goes to ``deferred``).

        Args:
            view: the admitted scope.
            plan: its key plan.
            block_ids: its block table (device hits, then new blocks).
            first: the first new block (how many the device hit).
            seq_id: the sequence, for the audit trail.
            deferred: where the waits of the critical events go.

        Returns:
            How many blocks were restored (they count as hits).
        """
        parts = self._bound()
        pool = parts.pool
        end = self._restorable_end(parts.ledger, view, plan, first)
        if end <= first:
            return 0
        tenant = view.scope.tenant
        # (tier, owner scope) -> owner view, blocks, key ids: one audit event each
        restored: dict[tuple[str, CacheScope], tuple[ScopeView, list[int], set[str]]] = {}
        i = first
        while i < end:
            prefix = plan.prefix_view
            owner = prefix if i < plan.prefix_blocks and prefix is not None else view
            b = block_ids[i]
            try:
                got = self.store.restore(plan.keys[i], owner.digest, tenant, into=pool.block(b))
            except OffloadError as exc:  # authentic but unusable: another KV layout, a wrong KEK
                self._restore_errors += 1
                _log.warning("offload_restore_failed", error=str(exc))
                break
            for refusal in got.refusals:
                deferred.append(self._record_refusal(owner, tenant, seq_id, b, refusal))
            if not got.hit:
                break
            _view, blocks, key_ids = restored.setdefault(
                (got.tier, owner.scope), (owner, [], set())
            )
            blocks.append(b)
            key_ids.add(got.key_id)
            i += 1
        for (tier, _scope), (owner, blocks, key_ids) in restored.items():
            self._remember(owner)
            parts.audit.record(
                AuditEvent(
                    type=EventType.OFFLOAD_RESTORE,
                    **{**owner.fields, "requester_tenant": tenant},
                    sequence_id=seq_id,
                    block_ids=tuple(blocks),
                    reused_tokens=len(blocks) * parts.block_size,
                    details={"tier": tier, "key_ids": sorted(key_ids)},
                )
            )
        parts.ledger.counters[tenant].blocks_restored += i - first
        return i - first

    def _restorable_end(self, ledger: Ledger, view: ScopeView, plan: KeyPlan, first: int) -> int:
        """Where the run of blocks the tiers may fill ends: own-namespace keys up to max_hit."""
        if not plan.cacheable:
            return first
        own = view.own_root
        if first < plan.prefix_blocks and plan.prefix_view is not None:
            if ledger.views.namespaces(plan.prefix_view)[0] != own:
                return first
            return plan.max_hit if plan.root == own else min(plan.max_hit, plan.prefix_blocks)
        return plan.max_hit if plan.root == own else first

    def _record_refusal(
        self, owner: ScopeView, tenant: str, seq_id: str, block_id: int, refusal: Refusal
    ) -> Deferred:
        parts = self._bound()
        parts.ledger.counters[tenant].offload_refusals += 1
        return parts.audit.defer(
            AuditEvent(
                type=EventType.OFFLOAD_REFUSED,
                **{**owner.fields, "requester_tenant": tenant},
                sequence_id=seq_id,
                block_ids=(block_id,),
                details={
                    "tier": refusal.tier,
                    "reason": str(refusal.reason),
                    "detail": refusal.detail,
                },
            )
        )

    # ------------------------------------------------------------------ erasure, retention

    def shred(self, tenant: str) -> ShredReport:
        """Crypto-shred a tenant in every tier: destroy its data key, then delete its objects.

        Raises:
            KeyStoreUnavailable: the key could not be destroyed; nothing is claimed.
        """
        return self.store.shred(tenant)

    def invalidate(self, matches: Callable[[CacheScope], bool]) -> DeleteReport:
        """Delete every object of a scope that ``matches``, by the digests this worker knows.

        Objects carry a scope digest, not the fields, so the digests come from the
        scopes this worker has seen: those it offloaded or restored, and those it
        admitted (still in its scope views). An object of a scope only another worker
        saw is left to that worker's invalidation, or to its deadline; it can be
        restored only under a scope whose fields hash to its digest.
        """
        views = self._bound().ledger.views
        stale = {d for d, s in self._scopes.items() if matches(s)}
        stale.update(v.digest for v in views.known() if matches(v.scope))
        if not stale:
            return DeleteReport({t: 0 for t in self._tiers}, ())
        return self.store.delete_where(lambda info: info.scope_digest in stale)

    def drop_all(self) -> DeleteReport:
        """Delete every object of every tier (the cache-key secret was rotated)."""
        return self.store.delete_where(lambda info: True)

    def sweep(self) -> DeleteReport:
        """Delete every object past its retention deadline, in every tier."""
        return self.store.sweep()

    # ------------------------------------------------------------------ observation and life

    def snapshot(self) -> OffloadSnapshot:
        """The tiers' counters and fill, and the governor's own offload counters."""
        return OffloadSnapshot(
            tiers=self.store.stats().tiers,
            policy_denied={t: self._denied[t] for t in self._tiers},
            not_offloaded=dict(self._not_offloaded),
            restore_errors=self._restore_errors,
        )

    def close(self) -> None:
        """Close the tiers (local tiers drop their objects), then a key store opened here."""
        try:
            self.store.close()
        finally:
            if self._key_store is not None:
                self._key_store.close()
