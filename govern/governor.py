"""The pool-agnostic governor: policy, keys, owners, retention and audit for any block pool.

A serving engine keeps its own block pool (vLLM's ``BlockPool`` lives in its
scheduler, the KV tensors in its workers), so governance cannot live inside
kvgov's pool. The :class:`Governor` holds everything that is governance and
drives a pool only through :class:`~kvgov.govern.protocol.GovernedPool`::

                      +------------------- Governor -------------------+
    binding --------> | views      scope -> digest, namespaces         |
    (GovernedKVCache, | policy     admission, sharing, retention       | --> audit
     vLLM scheduler)  | deriver    scope -> keyed chain of block keys  |     (hash-chained)
                      | owners     block -> the scope that wrote it    |
                      | deadlines  block -> when it expires            |
                      | counters   per tenant                          |
                      +------------------------------------------------+
                                |  allocate, free, lookup, set_keys,
                                v  evict, revoke, take_events
                           a GovernedPool (kvgov's BlockPool, vLLM's via an adapter)

A binding admits a request in named steps, each a method here: ``decide``,
``plan``, ``find_hits``, (the binding allocates), ``key_blocks``,
``record_admission``; after every pool call it ``drain``s the pool's events,
which turns them into owners, deadlines, counters and audit events. Erasure
and maintenance (``purge_tenant``, ``invalidate``, ``rotate_secret``,
``sweep``, ``stats``) live in :mod:`kvgov.govern.erasure`; encrypted offload
tiers, when a binding attaches them (:attr:`Governor.offload`), in
:mod:`kvgov.govern.offloading`.

Thread safety: one re-entrant lock (:attr:`lock`). ``decide`` and ``plan``
need no lock (the policy client, the scope views and the audit log are
thread-safe; deriving keys is pure), so a binding runs them first and holds
the lock for the steps that touch the pool, owners, deadlines and counters;
the erasure and maintenance methods take it themselves. A binding that derived
keys before the lock re-plans under it if :attr:`deriver` changed meanwhile
(a secret rotation).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from kvgov.allocator import BlocksCached, BlocksEvicted, BlockState, BlocksZeroized
from kvgov.audit import AuditEvent, AuditLog, EventType
from kvgov.exceptions import (
    InternalError,
    PolicyDenied,
    PolicyUnavailable,
    PoolClosed,
    TenantPurging,
)
from kvgov.policy import AdmissionDecision, PolicyClient
from kvgov.policy.client import CLASSIFICATIONS_PATH
from kvgov.policy.latency import LatencyHistogram

from .assemble import close_parts
from .hits import HitFinder
from .keys import KeyDeriver
from .logs import get_logger
from .ownership import Owners
from .plan import KeyPlan, plan_keys, unkeyed_plan
from .protocol import GovernedPool, RunningSequence
from .retention import Deadlines
from .scope import CacheScope
from .stats import CacheStats, _TenantCounters, snapshot
from .views import ScopeView, ScopeViews

if TYPE_CHECKING:
    from .offloading import Offloading

__all__ = ["Governor", "RunningSequence"]

_log = get_logger()

#: The outcomes an admission's latency is counted under.
ADMISSION_OUTCOMES = ("admitted", "denied", "error")


class Governor(HitFinder):
    """Governance of one block pool: every reuse scoped, policy-decided and audited.

    Invariants (checked by :meth:`_check_invariants`, beyond the pool's own):

    * a block is found by key only in the namespace (tenant or share group)
      that keyed it, and every key commits to the full scope but the tenant
      (see :mod:`kvgov.govern.keys`);
    * a hit on a block another tenant owns is used only if the sharing policy
      allows that requester and owner, and is audited;
    * a block's owner is the scope that wrote it while it is OWNED, CACHED or
      DIRTY, and None while it is FREE;
    * every CACHED block with a retention has a pending deadline;
    * nothing happens unaudited: when the audit trail cannot be written,
      operations raise :class:`kvgov.exceptions.AuditUnavailable`.

    Args:
        pool: the block pool, through the protocol.
        policy: the policy client (decision cache inside).
        audit: the audit log.
        deriver: the key deriver holding the secret.
        block_size: tokens per block.
        clock: seconds since the epoch; retention and audit times read it.
    """

    def __init__(
        self,
        *,
        pool: GovernedPool,
        policy: PolicyClient,
        audit: AuditLog,
        deriver: KeyDeriver,
        block_size: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.pool = pool
        self.policy = policy
        self.audit = audit
        self.deriver = deriver
        self.block_size = block_size
        self.clock = clock
        self.lock = threading.RLock()
        self.views = ScopeViews(policy)
        self.owners = Owners(pool.num_blocks)
        self.deadlines = Deadlines(pool.num_blocks, clock)
        self.counters: defaultdict[str, _TenantCounters] = defaultdict(_TenantCounters)
        self.unattributed = _TenantCounters()
        self.purging: set[str] = set()
        self.closed = False
        #: The encrypted offload tiers, once a binding attaches them; None: no offload work.
        self.offload: Offloading | None = None
        #: How long admissions took, by outcome (kvgov_admission_duration_seconds).
        self.admission_latency = {o: LatencyHistogram() for o in ADMISSION_OUTCOMES}

    # ------------------------------------------------------------------ admission steps

    def check_open(self) -> None:
        """Raise PoolClosed once :meth:`close` ran."""
        if self.closed:
            raise PoolClosed()

    def check_not_purging(self, tenant: str) -> None:
        """Raise TenantPurging while the tenant is being erased."""
        if tenant in self.purging:
            raise TenantPurging(tenant)

    def admission_view(self, scope: CacheScope, seq_id: str, num_tokens: int) -> ScopeView:
        """The view of a scope asking for admission; a policy outage denies, audited.

        Raises:
            InvalidScope: the classification is unknown to the policy.
            PolicyDenied: the policy engine cannot list its classifications (fail
                closed; a POLICY_ERROR event is written).
        """
        try:
            return self.views.view(scope)
        except PolicyUnavailable as exc:
            decision_id = f"unavailable-{uuid.uuid4().hex}"
            with self.lock:
                self.counters[scope.tenant].denials["policy_error"] += 1
            self.audit.record(
                AuditEvent(
                    type=EventType.POLICY_ERROR,
                    **scope.as_dict(),
                    sequence_id=seq_id,
                    token_count=num_tokens,
                    decision_id=decision_id,
                    details={"reason": str(exc), "path": CLASSIFICATIONS_PATH},
                )
            )
            raise PolicyDenied(CLASSIFICATIONS_PATH, str(exc), decision_id) from exc

    def decide(
        self, view: ScopeView, seq_id: str, num_tokens: int, priority: int | None
    ) -> AdmissionDecision:
        """Ask the admission policy; a refusal is counted, audited and raised.

        Raises:
            PolicyDenied: the policy refused (or failed closed).
        """
        adm = self.policy.admission(view.fields, num_tokens, priority)
        if adm.allow:
            return adm
        decision = adm.decision
        with self.lock:
            self.counters[view.scope.tenant].denials[
                "policy_error" if decision.error else (adm.reason or "denied")
            ] += 1
        self.audit.record(
            AuditEvent(
                type=EventType.POLICY_ERROR if decision.error else EventType.POLICY_DENIED,
                **view.fields,
                sequence_id=seq_id,
                token_count=num_tokens,
                decision_id=decision.decision_id,
                policy_revision=decision.bundle_revision,
                details={
                    "reason": adm.reason,
                    "path": decision.path,
                    "requested_priority": priority,
                },
            )
        )
        _log.info(
            "admission_denied",
            tenant=view.scope.tenant,
            seq_id=seq_id,
            reason=adm.reason,
            decision_id=decision.decision_id,
        )
        raise PolicyDenied(decision.path, adm.reason, decision.decision_id)

    def plan(
        self, view: ScopeView, packed: bytes, cache: bool, public_prefix_tokens: int
    ) -> KeyPlan:
        """The admission's geometry and, if it may be cached, its namespaces, retention and keys."""
        if not cache:
            return unkeyed_plan(view, len(packed) // 4, self.block_size)
        plan = plan_keys(
            self.policy,
            self.views,
            self.deriver,
            view,
            packed,
            self.block_size,
            public_prefix_tokens,
        )
        for decision in plan.failed:  # fail closed (nothing cached or shared), and say so
            self.audit.record(
                AuditEvent(
                    type=EventType.POLICY_ERROR,
                    **view.fields,
                    decision_id=decision.decision_id,
                    policy_revision=decision.bundle_revision,
                    details={"reason": decision.error, "path": decision.path},
                )
            )
        return plan

    def key_blocks(
        self, block_ids: Sequence[int], keys: Sequence[bytes], priority: int, ttl: float | None
    ) -> None:
        """Key OWNED blocks (a duplicate key leaves its block unkeyed) and note their retention."""
        indexed = self.pool.set_keys(block_ids, keys, priority=priority)
        if indexed.count(True) == len(indexed):
            self.deadlines.keyed(block_ids, ttl)
        else:
            self.deadlines.keyed([b for b, ok in zip(block_ids, indexed, strict=True) if ok], ttl)

    def key_admitted(
        self,
        scope: CacheScope,
        block_ids: Sequence[int],
        first_new: int,
        plan: KeyPlan,
        priority: int,
    ) -> None:
        """Record the owner of an admission's new blocks and key its new full ones."""
        prefix = plan.prefix_blocks
        new_ids = block_ids[first_new:]
        if first_new >= prefix or plan.prefix_view is None:
            self.owners.assign(new_ids, scope)
        else:
            self.owners.assign(block_ids[first_new:prefix], plan.prefix_view.scope)
            self.owners.assign(block_ids[prefix:], scope)
        if not plan.cacheable:
            return
        if first_new < prefix:
            self.key_blocks(
                block_ids[first_new:prefix], plan.keys[first_new:prefix], priority, plan.prefix_ttl
            )
        start = max(first_new, prefix)
        if plan.num_full > start:
            self.key_blocks(
                block_ids[start : plan.num_full],
                plan.keys[start : plan.num_full],
                priority,
                plan.ttl,
            )

    def record_admission(
        self,
        view: ScopeView,
        seq_id: str,
        block_ids: Sequence[int],
        adm: AdmissionDecision,
        *,
        num_tokens: int,
        cacheable: bool,
        ttl: float | None,
        requested_priority: int | None,
        cached_tokens: int,
    ) -> None:
        """Count the admission and write its audit event (every pool binding calls this)."""
        counters = self.counters[view.scope.tenant]
        counters.requests += 1
        counters.queried_tokens += num_tokens
        counters.hit_tokens += cached_tokens
        decision = adm.decision
        self.audit.record(
            AuditEvent(
                type=EventType.ADMISSION,
                **view.fields,
                sequence_id=seq_id,
                block_ids=tuple(block_ids),
                token_count=num_tokens,
                reused_tokens=cached_tokens,
                decision_id=decision.decision_id,
                policy_revision=decision.bundle_revision,
                details={
                    "cache": cacheable,
                    "priority": adm.priority,
                    "reason": adm.reason,
                    "requested_priority": requested_priority,
                    "ttl_seconds": ttl,
                },
            )
        )

    def record_end(
        self,
        view: ScopeView,
        seq_id: str,
        event_type: EventType,
        *,
        appended: Sequence[int],
        num_tokens: int,
        decision_id: str,
        details: dict[str, Any],
    ) -> None:
        """Write the audit event of a sequence's end (release, cancel, orphan, close)."""
        self.audit.record(
            AuditEvent(
                type=event_type,
                **view.fields,
                sequence_id=seq_id,
                block_ids=tuple(appended),
                token_count=num_tokens,
                decision_id=decision_id,
                details=details,
            )
        )

    # ------------------------------------------------------------------ pool events

    def drain(self) -> None:
        """Turn the pool's events into deadlines, owners, counters and audit events."""
        events = self.pool.take_events()
        if not events:
            return
        for event in events:
            if isinstance(event, BlocksCached):
                self.deadlines.cached(event.block_ids)
            elif isinstance(event, BlocksEvicted):
                self._record_evicted(event)
            elif isinstance(event, BlocksZeroized):
                self._record_zeroized(event)

    def _record_evicted(self, event: BlocksEvicted) -> None:
        for scope, ids in self.owners.group(event.block_ids):
            counters = self.counters[scope.tenant] if scope else self.unattributed
            counters.evictions[event.reason] += len(ids)
            self.audit.record(
                AuditEvent(
                    type=EventType.EVICTION,
                    **(self.views.view(scope, admitted=True).fields if scope else {}),
                    block_ids=tuple(ids),
                    details={"reason": event.reason},
                )
            )

    def _record_zeroized(self, event: BlocksZeroized) -> None:
        per_block = event.nbytes // len(event.block_ids) if event.block_ids else 0
        # zeroized blocks are FREE now: their owner is read and cleared in one pass
        for scope, ids in self.owners.group(event.block_ids, clear=True):
            counters = self.counters[scope.tenant] if scope else self.unattributed
            counters.blocks_zeroized += len(ids)
            counters.bytes_zeroized += per_block * len(ids)
            details: dict[str, Any] = {
                "bytes": per_block * len(ids),
                "device": event.device,
                "seconds": event.seconds,
            }
            if event.state != "done":  # bytes in another process: see BlocksZeroized.state
                details["state"] = event.state
            self.audit.record(
                AuditEvent(
                    type=EventType.ZEROIZATION,
                    tenant=scope.tenant if scope else None,
                    block_ids=tuple(ids),
                    details=details,
                )
            )

    # ------------------------------------------------------------------ observation and life

    def stats(self, *, live_sequences: int, orphans_recovered: int) -> CacheStats:
        """A consistent snapshot of every counter, per tenant and in total.

        Args:
            live_sequences: the binding's running sequences.
            orphans_recovered: sequences the binding released as orphans.
        """
        with self.lock:
            return snapshot(
                counters=self.counters,
                unattributed=self.unattributed,
                owners=None if self.closed else self.owners,
                pool=self.pool,
                policy=self.policy,
                live_sequences=live_sequences,
                orphans_recovered=orphans_recovered,
                offload=self.offload,
                admission_latency=self.admission_latency,
            )

    def close(self) -> None:
        """Mark the governor closed, then close the audit log, the policy client and offload.

        The binding ends its sequences and closes its pool (draining the last
        events) before calling this. Idempotent.
        """
        with self.lock:
            if self.closed:
                return
            self.closed = True
            close_parts(self.audit, self.policy, self.offload)

    def _check_invariants(self) -> None:
        """Check the governor's invariants against the pool's states.

        Raises:
            InternalError: an invariant does not hold (a bug in kvgov).
        """
        with self.lock:
            table = self.owners.table
            everything = list(range(self.pool.num_blocks))
            states = self.pool.states(everything)
            for b, state in enumerate(states):
                if (table[b] is None) != (state is BlockState.FREE):
                    raise InternalError(f"block {b} is {state.name} but its owner is {table[b]!r}")
            self.deadlines._check_invariants(
                b for b, state in enumerate(states) if state is BlockState.CACHED
            )
