"""The pool-agnostic governor: policy, keys, ownership, retention, erasure and audit.

A serving engine keeps its own block pool (vLLM's ``BlockPool`` lives in its
scheduler, the KV tensors in its workers), so governance cannot live inside
kvgov's pool. The :class:`Governor` holds everything that is governance; its
state is one :class:`~kvgov.govern.ledger.Ledger`, and it sees a pool only
through :class:`~kvgov.govern.protocol.ObservedPool`::

                      +------------------- Governor -------------------+
    binding --------> | policy     admission, sharing, retention       | --> audit
    (GovernedKVCache, | deriver    scope -> keyed chain of block keys  |     (hash-chained)
     vLLM's           | ledger     owners     block -> writer's scope  |
     GovernedSched-   |            deadlines  block -> when it expires |
     uler)            |            views      scope -> digest, roots   |
                      |            counters   per tenant               |
                      |            purging    tenants being erased     |
                      | offload    encrypted tiers, if attached        |
                      +------------------------------------------------+
                                |  evict, revoke, states, counts,
                                v  read_back_zero, take_events
                           an ObservedPool (kvgov's BlockPool, vLLM's via an adapter)

A binding admits a request in named steps: ``admission_view``, ``decide``,
``plan`` here; then the binding's own pool work (kvgov's binding looks up with a
:class:`~kvgov.govern.hits.HitFinder`, allocates and keys blocks on its
:class:`~kvgov.govern.protocol.DrivenPool`; vLLM's scheduler does that itself
and its binding records owners and judges hits with :mod:`kvgov.govern.sharing`);
then ``record_admission`` here. After every pool call the binding ``drain``s the
pool's events, which turns them into owners, deadlines, counters and audit
events. Erasure and maintenance (``purge_tenant``, ``invalidate``,
``rotate_secret``, ``sweep``) are methods here too (the pieces they share are in
:mod:`kvgov.govern.erasure`); encrypted offload tiers, when a binding attaches
them (:attr:`Governor.offload`), are in :mod:`kvgov.govern.offloading`.

Thread safety: one re-entrant lock (:attr:`lock`). ``decide`` and ``plan``
need no lock (the policy client, the scope views and the audit log are
thread-safe; deriving keys is pure), so a binding runs them first and holds
the lock for the steps that touch the pool and the ledger; the erasure and
maintenance methods take it themselves. A binding that derived keys before the
lock re-plans under it if :attr:`deriver` changed meanwhile (a secret rotation).
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

from kvgov.allocator import BlocksCached, BlocksEvicted, BlockState, BlocksZeroized
from kvgov.audit import AuditEvent, AuditLog, EventType
from kvgov.audit.events import OWN_REUSE_KEY, checked_text, trusted_details, trusted_event
from kvgov.exceptions import (
    InternalError,
    InvalidQuota,
    InvalidScope,
    KeyStoreUnavailable,
    PolicyDenied,
    PolicyUnavailable,
    PoolClosed,
    TenantPurging,
)
from kvgov.offload import ShredReport
from kvgov.policy import AdmissionDecision, PolicyClient
from kvgov.policy.client import CLASSIFICATIONS_PATH
from kvgov.policy.latency import LatencyHistogram

from .assemble import close_parts
from .erasure import (
    check_filters,
    erasure_check,
    erasure_details,
    zeroization_audited,
)
from .keys import KeyDeriver
from .ledger import Ledger
from .logs import get_logger
from .plan import KeyPlan, plan_keys, unkeyed_plan
from .protocol import ObservedPool, QuotaPool, RunningSequence
from .quotas import EvictionRules, resolve
from .results import ErasureReport, InvalidationReport, RotationReport
from .scope import CacheScope
from .stats import CacheStats, snapshot
from .views import ScopeView

if TYPE_CHECKING:
    from .offloading import Offloading

__all__ = ["Governor", "admission_event"]

_log = get_logger()

#: The outcomes an admission's latency is counted under.
ADMISSION_OUTCOMES = ("admitted", "denied", "error")
#: Engine bindings' plans kept before the memo starts over (a bound on memory: a
#: deployment has far fewer scopes).
_MAX_PLANS = 4096


class Governor:
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
        pool: ObservedPool,
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
        #: The governor's state: owners, deadlines, views, counters, purging tenants.
        self.ledger = Ledger.create(pool.num_blocks, policy, clock)
        self.closed = False
        #: The encrypted offload tiers, once a binding attaches them; None: no offload work.
        self.offload: Offloading | None = None
        #: How long admissions took, by outcome (kvgov_admission_duration_seconds).
        self.admission_latency = {o: LatencyHistogram() for o in ADMISSION_OUTCOMES}
        # engine bindings' plans (no keys) by (scope, policy revision): see plan()
        self._plans: dict[tuple[CacheScope, str], KeyPlan] = {}

    # ------------------------------------------------------------------ admission steps

    def check_open(self) -> None:
        """Raise PoolClosed once :meth:`close` ran."""
        if self.closed:
            raise PoolClosed()

    def check_not_purging(self, tenant: str) -> None:
        """Raise TenantPurging while the tenant is being erased."""
        if tenant in self.ledger.purging:
            raise TenantPurging(tenant)

    def admission_view(self, scope: CacheScope, seq_id: str, num_tokens: int) -> ScopeView:
        """The view of a scope asking for admission; a policy outage denies, audited.

        Raises:
            InvalidScope: the classification is unknown to the policy.
            PolicyDenied: the policy engine cannot list its classifications (fail
                closed; a POLICY_ERROR event is written).
        """
        try:
            return self.ledger.views.view(scope)
        except PolicyUnavailable as exc:
            decision_id = f"unavailable-{uuid.uuid4().hex}"
            with self.lock:
                self.ledger.counters[scope.tenant].denials["policy_error"] += 1
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
            if adm.decision.bundle_revision != self.ledger.eviction.revision:
                self.sync_eviction(strict=False)
            return adm
        decision = adm.decision
        with self.lock:
            self.ledger.counters[view.scope.tenant].denials[
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

    def sync_eviction(self, *, strict: bool = True) -> EvictionRules:
        """Read the policy's eviction settings (floors, caps, priority durations) into
        the ledger and hand the quotas to the pool (when it is a QuotaPool).

        Called at start, by an operator after a policy reload, and by :meth:`decide`
        whenever the bundle's revision changed.

        Args:
            strict: raise when the settings are refused; otherwise log the error
                and keep the rules in force (the refused revision is remembered, so
                it is not read again on every admission).

        Returns:
            The rules in force.

        Raises:
            InvalidQuota: (strict) the settings are malformed or the floors add up
                to more than the pool; the rules in force are unchanged. (A policy
                that cannot be evaluated is logged, not raised: admissions fail
                closed then anyway, and the next revision is read again.)
        """
        settings = self.policy.eviction()
        revision = settings.decision.bundle_revision
        try:
            rules = resolve(settings, self.pool.num_blocks, revision)
        except InvalidQuota as exc:
            with self.lock:
                old = self.ledger.eviction
                self.ledger.eviction = EvictionRules(old.quotas, old.durations, revision)
            _log.error("eviction_policy_refused", revision=revision, error=str(exc))
            if strict and settings.decision.error is None:
                raise  # a policy outage is not the operator's data: retried on change
            return self.ledger.eviction
        with self.lock:
            pool = self.pool
            if isinstance(pool, QuotaPool) and rules.quotas != self.ledger.eviction.quotas:
                try:
                    pool.set_quotas(rules.quotas)
                finally:
                    self.drain()
            self.ledger.eviction = rules
        return rules

    def plan(
        self, view: ScopeView, packed: bytes, cache: bool, public_prefix_tokens: int
    ) -> KeyPlan:
        """The admission's geometry and, if it may be cached, its namespaces, retention and keys.

        An engine binding's plan (no tokens: the engine's hasher derives the keys) is the
        same for every request of a scope while the policy's revision is: it is kept per
        scope and revision (:meth:`~kvgov.policy.cache.CachedEngine.kept_revision`), as
        the policy's own cache keeps the decisions it comes from, and shared read-only.
        """
        if not cache:
            return unkeyed_plan(view, len(packed) // 4, self.block_size)
        kept = None
        if not packed and not public_prefix_tokens:
            revision = self.policy.engine.kept_revision()
            if revision is not None:
                kept = (view.scope, revision)
                hit = self._plans.get(kept)
                if hit is not None:
                    return hit
        plan = plan_keys(
            self.policy,
            self.ledger.views,
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
        if kept is not None and not plan.failed:  # a failed decision is asked again
            if len(self._plans) >= _MAX_PLANS:
                self._plans.clear()
            self._plans[kept] = plan
        return plan

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
        own_reuse: tuple[int, int] | None = None,
    ) -> None:
        """Count the admission and write its audit event (every pool binding calls this).

        Args:
            own_reuse: (blocks, reused tokens) of a reuse of the request's own scope's
                cached blocks, its first ``blocks`` of ``block_ids``, that this event
                records too (``details[OWN_REUSE_KEY]``) instead of a ``reuse`` event
                after it; None: none, or audited apart (:func:`~.sharing.audit_reuse`).
        """
        self.count_admission(view.scope.tenant, num_tokens, cached_tokens)
        self.audit.record(
            admission_event(
                view,
                seq_id,
                block_ids,
                adm,
                num_tokens=num_tokens,
                cacheable=cacheable,
                ttl=ttl,
                requested_priority=requested_priority,
                cached_tokens=cached_tokens,
                own_reuse=own_reuse,
            )
        )

    def count_admission(self, tenant: str, num_tokens: int, cached_tokens: int) -> None:
        """Count one admission in the tenant's counters (:meth:`record_admission`'s count).

        For a binding that writes the admission's event itself, derived from an
        :func:`admission_event` it built before (``AuditEvent.derive``).
        """
        counters = self.ledger.counters[tenant]
        counters.requests += 1
        counters.queried_tokens += num_tokens
        counters.hit_tokens += cached_tokens

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
                self.ledger.deadlines.cached(event.block_ids)
            elif isinstance(event, BlocksEvicted):
                self._record_evicted(event)
            elif isinstance(event, BlocksZeroized):
                self._record_zeroized(event)

    def _record_evicted(self, event: BlocksEvicted) -> None:
        for scope, ids in self.ledger.owners.group(event.block_ids):
            counters = self.ledger.counters[scope.tenant] if scope else self.ledger.unattributed
            counters.evictions[event.reason] += len(ids)
            self.audit.record(
                trusted_event(
                    EventType.EVICTION,
                    self.ledger.views.view(scope, admitted=True).values if scope else None,
                    block_ids=tuple(ids),
                    details=trusted_details({"reason": event.reason}),
                )
            )

    def _record_zeroized(self, event: BlocksZeroized) -> None:
        per_block = event.nbytes // len(event.block_ids) if event.block_ids else 0
        # zeroized blocks are FREE now: their owner is read and cleared in one pass
        for scope, ids in self.ledger.owners.group(event.block_ids, clear=True):
            counters = self.ledger.counters[scope.tenant] if scope else self.ledger.unattributed
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
                trusted_event(
                    EventType.ZEROIZATION,
                    tenant=scope.tenant if scope else None,
                    block_ids=tuple(ids),
                    details=trusted_details(details),
                )
            )

    # ------------------------------------------------------------------ erasure and maintenance

    def _revoke(self, block_ids: list[int], reason: str) -> tuple[list[int], list[int]]:
        """Have the pool evict the CACHED blocks and unindex the OWNED ones; drain.

        Returns:
            The blocks evicted (zeroized now) and those detached (zeroized at release).
        """
        if not block_ids:
            return [], []
        with zeroization_audited(self.audit):
            revoked = self.pool.revoke(block_ids, reason)
        self.drain()
        return list(revoked.evicted), list(revoked.detached)

    def purge_tenant(
        self, tenant: str, live: Iterable[RunningSequence], *, order_id: str | None = None
    ) -> ErasureReport:
        """Erase a tenant: see :meth:`kvgov.govern.GovernedKVCache.purge_tenant`.

        The blocks are revoked under the lock; the erasure event, which the audit
        log writes through to its store, is recorded after the lock is released
        (the tenant's admissions stay refused until it is), so a slow audit
        database never stalls other tenants. The offload tiers are shredded then
        too: the tenant has no CACHED block left to offload, and a capacity
        eviction of a purging tenant's block offloads nothing.

        ``verified`` rests on ownership (:func:`~kvgov.govern.erasure.erasure_check`):
        every block the ledger's owners name the tenant's before the purge must be
        FREE and zero after it. A block a running sequence holds cannot be freed;
        it counts in ``held_blocks`` and the purge is not verified until a later
        one finds none.

        Args:
            tenant: the tenant.
            live: the binding's running sequences (the tenant's stop caching).
            order_id: the fleet order this erasure executes (``details.order_id``).

        Raises:
            InvalidScope: tenant is not a valid identifier.
            KeyStoreUnavailable: the tenant's offload data key could not be destroyed
                (the device blocks are zeroized and the attempt is audited); retry.
            AuditUnavailable: the erasure could not be audited.
        """
        if not isinstance(tenant, str) or not tenant:
            raise InvalidScope("tenant", tenant, "a non-empty string")
        ledger = self.ledger
        ledger.purging.add(tenant)
        try:
            with self.lock:
                self.check_open()
                in_flight = []
                for seq in live:
                    if seq.scope.tenant == tenant:
                        seq.cacheable = False
                        in_flight.append(seq.seq_id)
                written = ledger.owners.of_tenant(tenant)
                evicted, detached = self._revoke(written, "purged")
                # verified from ownership: every block the tenant wrote, keyed or not, is
                # FREE and zero now; a held one is zeroized only at its holder's release
                held, verified = erasure_check(self.pool, written)
                nbytes = len(evicted) * self.pool.bytes_per_block
            details: dict[str, Any] = {
                "blocks_zeroized": len(evicted),
                "bytes_zeroized": nbytes,
                "detached_blocks": len(detached),
                "held_blocks": len(held),
                "in_flight_sequences": in_flight,
                "verified": verified,
            }
            if order_id is not None:
                details["order_id"] = order_id
            shred, failure = self._shred(tenant, details)
            finished = details["finished_at"] = self.clock()
            recorded = self.audit.record_durable(
                AuditEvent(
                    type=EventType.ERASURE, tenant=tenant, block_ids=tuple(evicted), details=details
                )
            )
            if failure is not None:
                raise failure
            _log.info(
                "tenant_erased",
                tenant=tenant,
                blocks_zeroized=len(evicted),
                in_flight=len(in_flight),
                held_blocks=len(held),
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
                held_blocks=len(held),
                verified=verified,
                event_id=recorded.event_id,
                finished_at=finished,
                evidence=recorded.evidence,
                destroyed_key_ids=() if shred is None else shred.destroyed_key_ids,
                offload_deleted={} if shred is None else dict(shred.deleted),
                offload_unreachable=() if shred is None else shred.unreachable,
            )
        finally:
            ledger.purging.discard(tenant)

    def _shred(
        self, tenant: str, details: dict[str, Any]
    ) -> tuple[ShredReport | None, KeyStoreUnavailable | None]:
        """Crypto-shred the tenant in the offload tiers, if any; say so in details["offload"]."""
        if self.offload is None:
            return None, None
        try:
            shred = self.offload.shred(tenant)
        except KeyStoreUnavailable as exc:
            details["offload"] = {"shredded": False, "error": str(exc)}
            _log.warning("offload_shred_failed", tenant=tenant, error=str(exc))
            return None, exc
        details["offload"] = {"shredded": True, **erasure_details(shred)}
        return shred, None

    def invalidate(
        self,
        wanted: Mapping[str, str],
        live: Iterable[RunningSequence],
        *,
        order_id: str | None = None,
    ) -> InvalidationReport:
        """Drop every block of a matching scope: see :meth:`GovernedKVCache.invalidate`.

        Args:
            wanted: scope field -> value; every one must match (fields of
                :data:`~kvgov.govern.erasure.SCOPE_FILTERS`, at least one).
            live: the binding's running sequences (the matching ones stop caching).
            order_id: the fleet order this invalidation executes (``details.order_id``).

        Raises:
            InvalidArgument: no filter, or a field that is not a filter.
        """
        check_filters(wanted)

        def matches(scope: CacheScope) -> bool:
            return all(getattr(scope, k) == v for k, v in wanted.items())

        with self.lock:
            self.check_open()
            marked = 0
            for seq in live:
                if seq.cacheable and matches(seq.scope):
                    seq.cacheable = False
                    marked += 1
            written = self.ledger.owners.select(matches)
            evicted, detached = self._revoke(written, "invalidated")
            held, verified = erasure_check(self.pool, written)
            details: dict[str, Any] = {
                "filter": dict(wanted),
                "blocks_zeroized": len(evicted),
                "detached_blocks": len(detached),
                "held_blocks": len(held),
                "sequences_marked": marked,
                "verified": verified,
            }
            if order_id is not None:
                details["order_id"] = order_id
            deleted = None if self.offload is None else self.offload.invalidate(matches)
            if deleted is not None:
                details["offload"] = erasure_details(deleted)
            event_id = self.audit.record(
                AuditEvent(type=EventType.INVALIDATION, block_ids=tuple(evicted), details=details)
            )
            _log.info("invalidated", filter=dict(wanted), blocks_zeroized=len(evicted))
            return InvalidationReport(
                blocks_zeroized=len(evicted),
                detached_blocks=len(detached),
                held_blocks=len(held),
                sequences_marked=marked,
                verified=verified,
                event_id=event_id,
                offload_deleted={} if deleted is None else dict(deleted.deleted),
            )

    def rotate_secret(
        self, new_secret: bytes, live: Iterable[RunningSequence], *, order_id: str | None = None
    ) -> int:
        """Switch the key secret: see :meth:`GovernedKVCache.rotate_secret`.

        Returns:
            Blocks evicted and zeroized now (:meth:`rotate_secret_report` says more).

        Raises:
            KeySecretError: the new secret is too short (nothing changed).
        """
        return self.rotate_secret_report(new_secret, live, order_id=order_id).blocks_zeroized

    def rotate_secret_report(
        self, new_secret: bytes, live: Iterable[RunningSequence], *, order_id: str | None = None
    ) -> RotationReport:
        """Switch the key secret; the report names the rotation's audit event.

        Args:
            new_secret: at least 32 bytes.
            live: the binding's running sequences (none caches any more).
            order_id: the fleet order this rotation executes (``details.order_id``).

        Raises:
            KeySecretError: the new secret is too short (nothing changed).
        """
        deriver = KeyDeriver(new_secret, implementation=self.deriver.implementation)
        with self.lock:
            self.check_open()
            for seq in live:
                seq.cacheable = False
            written = self.ledger.owners.held()
            evicted, detached = self._revoke(written, "secret_rotated")
            self.deriver = deriver
            held, verified = erasure_check(self.pool, written)
            details: dict[str, Any] = {
                "blocks_zeroized": len(evicted),
                "detached_blocks": len(detached),
                "held_blocks": len(held),
                "verified": verified,
            }
            if order_id is not None:
                details["order_id"] = order_id
            if self.offload is not None:  # every object's key was derived with the old secret
                details["offload"] = erasure_details(self.offload.drop_all())
            event_id = self.audit.record(
                AuditEvent(
                    type=EventType.SECRET_ROTATION, block_ids=tuple(evicted), details=details
                )
            )
            return RotationReport(
                blocks_zeroized=len(evicted),
                detached_blocks=len(detached),
                held_blocks=len(held),
                verified=verified,
                event_id=event_id,
            )

    def sweep(self) -> int:
        """Evict and zeroize every cached block past its retention deadline (and tier objects).

        The event's ``details.verified`` (when a block expired): every expired block is
        FREE and reads back as zero bytes (:func:`~kvgov.govern.erasure.erasure_check`).

        Returns:
            How many device blocks expired.
        """
        with self.lock:
            self.check_open()
            due = self.ledger.deadlines.due(self.clock())
            expired: list[int] = []
            if due:
                with zeroization_audited(self.audit):
                    expired = self.pool.evict(due, "expired")
            self.drain()
            # the expired blocks only: a due block hit since is live KV, not erased (its
            # deadline restarts at its next release)
            verified = erasure_check(self.pool, expired)[1] if expired else None
        details: dict[str, Any] = {"expired": len(expired)}
        if verified is not None:
            details["verified"] = verified
        # the tiers outside the lock: the store is thread-safe, and Redis may be slow
        tiers = None if self.offload is None else self.offload.sweep()
        if tiers is not None and (tiers.total or tiers.unreachable):
            details["offload"] = erasure_details(tiers)
        if expired or "offload" in details:
            self.audit.record(
                AuditEvent(
                    type=EventType.RETENTION_SWEEP, block_ids=tuple(expired), details=details
                )
            )
        return len(expired)

    # ------------------------------------------------------------------ observation and life

    def stats(self, *, live_sequences: int, orphans_recovered: int) -> CacheStats:
        """A consistent snapshot of every counter, per tenant and in total.

        Args:
            live_sequences: the binding's running sequences.
            orphans_recovered: sequences the binding released as orphans.
        """
        with self.lock:
            return snapshot(
                counters=self.ledger.counters,
                unattributed=self.ledger.unattributed,
                owners=None if self.closed else self.ledger.owners,
                pool=self.pool,
                policy=self.policy,
                live_sequences=live_sequences,
                orphans_recovered=orphans_recovered,
                offload=None if self.offload is None else self.offload.snapshot(),
                admission_latency=self.admission_latency,
                quotas=self.ledger.eviction.quotas,
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
            table = self.ledger.owners.table
            everything = list(range(self.pool.num_blocks))
            states = self.pool.states(everything)
            for b, state in enumerate(states):
                if (table[b] is None) != (state is BlockState.FREE):
                    raise InternalError(f"block {b} is {state.name} but its owner is {table[b]!r}")
            self.ledger.deadlines._check_invariants(
                b for b, state in enumerate(states) if state is BlockState.CACHED
            )


#: Admission events' details by their values (:func:`admission_event`), and how many
#: are kept before it starts over.
_ADMISSION_DETAILS: dict[tuple[Any, ...], dict[str, Any]] = {}
_ADMISSION_DETAILS_SIZE: Final = 1024


def admission_event(
    view: ScopeView,
    seq_id: str | None,
    block_ids: Sequence[int],
    adm: AdmissionDecision,
    *,
    num_tokens: int,
    cacheable: bool,
    ttl: float | None,
    requested_priority: int | None,
    cached_tokens: int,
    own_reuse: tuple[int, int] | None = None,
) -> AuditEvent:
    """The ``admission`` event :meth:`Governor.record_admission` writes (built, not written).

    The scope, the sequence id (checked when it came in), the blocks and counts are
    kvgov's and go unchecked (:func:`~kvgov.audit.events.trusted_event`); the
    decision's id, revision, reason, priority and TTL are the policy's, checked here
    by ``AuditEvent``'s rules. ``own_reuse``: see :meth:`Governor.record_admission`.
    """
    decision = adm.decision
    priority, reason = adm.priority, adm.reason
    # one details mapping per set of values (types included: 1, 1.0 and True differ in
    # JSON): events share it, the writer encodes it once (a mapping is never changed)
    key = (
        cacheable, type(priority), priority, reason, type(requested_priority),
        requested_priority, type(ttl), ttl, own_reuse,
    )  # fmt: skip
    hashable = True
    try:
        details = _ADMISSION_DETAILS.get(key)
    except TypeError:  # an unhashable value: AuditEvent's checks (below) say what it is
        details, hashable = None, False
    if details is None:
        details = trusted_details(
            {
                "cache": cacheable,
                "priority": priority,
                "reason": reason,
                "requested_priority": requested_priority,
                "ttl_seconds": ttl,
            }
        )
        if own_reuse is not None:  # kvgov's counts
            details[OWN_REUSE_KEY] = {"blocks": own_reuse[0], "reused_tokens": own_reuse[1]}
        if hashable:
            if len(_ADMISSION_DETAILS) >= _ADMISSION_DETAILS_SIZE:
                _ADMISSION_DETAILS.clear()
            _ADMISSION_DETAILS[key] = details
    return trusted_event(
        EventType.ADMISSION,
        view.values,
        sequence_id=seq_id,
        block_ids=tuple(block_ids),
        token_count=num_tokens,
        reused_tokens=cached_tokens,
        decision_id=checked_text("decision_id", decision.decision_id),
        policy_revision=checked_text("policy_revision", decision.bundle_revision),
        details=details,
    )
