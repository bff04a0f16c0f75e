"""The governor on vLLM's pool: :class:`VllmGovernance`, the steps vLLM's scheduler drives.

The governed scheduler (:mod:`kvgov.govern.vllm.scheduler`) calls one method
here at each point of a request's life::

    add_request        admit      scope (extra_args, engine, adapter; signed token),
                                  admission policy, namespace and retention; swaps in
                                  the keyed hasher, or refuses (audited)
    schedule()         sweep_due  retention: evict what expired (cheap when nothing is due)
      lookup           judge_hit  a hit on another tenant's blocks (share group) is
                                  judged by the sharing policy and cut where refused
      allocate_slots   allocated  owners of new blocks (a public prefix's: the public
                                  scope's); ADMISSION (first time), REUSE /
                                  CROSS_TENANT_REUSE from the hit vLLM committed (a first
                                  hit on its own scope's blocks: in the ADMISSION event)
      vLLM caches      (pool)     retention of newly cached blocks (_keyed)
      output built     zero_orders  the ids that left an owner, for this step's workers
    update_from_output step_returned  "done" for the zeroing that step carried (coalesced)

Erasure (``purge_tenant``, ``invalidate``, ``sweep``, ``rotate_secret``) is the
governor's (:class:`~kvgov.govern.governor.Governor`); its pool calls reach vLLM's
``evict_blocks`` path (:class:`~kvgov.govern.vllm.pool.GovernedBlockPool`).

Everything here runs on the engine core's thread: the scheduler's calls, and
engine utility calls (``kvgov_call``), which vLLM runs between steps.

Eviction is the policy's: the admission decision's priority (a request may ask
with ``kvgov_priority``; the policy caps it), its tenant's priority duration and
floor and cap order vLLM's free queue (:mod:`.free_queue`); the default policy
leaves vLLM's LRU order as it is.

Limits (see docs/vllm.md): a request reads only the namespaces it publishes in
(vLLM keeps one hash chain per request: its public prefix's, then its own), so a
share group's readers that do not publish there find nothing; a public prefix
needs one KV cache group.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from kvgov.audit import EventType
from kvgov.audit.events import trusted_details, trusted_event
from kvgov.defaults import (
    DEFAULT_PRIORITY,
    MAX_PRIORITY,
    MIN_PRIORITY,
    ZEROIZATION_DONE_FLUSH_SECONDS,
)
from kvgov.exceptions import (
    AuditUnavailable,
    InvalidArgument,
    InvalidScope,
    PolicyDenied,
    PoolClosed,
    ScopeTokenError,
    TenantPurging,
)

from .. import sharing
from ..assemble import open_parts
from ..governor import Governor
from ..refusal import ERROR_PATH, SCOPE_PATH, describe_error, refuse, request_id_problem
from ..results import ErasureReport, InvalidationReport
from ..scope_resolver import EngineScope, ScopeResolver, revision_of
from ..stats import CacheStats
from . import fence
from .groups import hit_positions
from .pool import GovernedBlockPool, VllmPoolAdapter
from .request_state import RequestGovernance
from .requests import governed_block_hasher, has_extra_keys
from .settings import BindingSettings

__all__ = ["PRIORITY_KEY", "SCOPE_PATH", "VllmGovernance"]

#: ``extra_args`` key of a request's eviction priority hint (0-100): the admission policy
#: accepts it, capped by its tenant's ``max_priority``.
PRIORITY_KEY = "kvgov_priority"

_log = logging.getLogger("kvgov.vllm")


class VllmGovernance:
    """One engine's governance: the governor, vLLM's pool and the scope resolver.

    ``fold_own_reuse`` (True) is the audit trail's event layout: a request's first
    allocation that reuses only its own scope's cached blocks writes one
    ``admission`` event that records the reuse too (``details.own_reuse``, listed
    by every compliance query as its own ``reuse`` record), not an admission and a
    ``reuse``; False writes both events (the layout before; the equivalence test
    replays a workload under each).

    Build it with :meth:`open` (the scheduler does); the constructor takes
    ready parts (tests).

    Args:
        governor: the governor, driving ``pool`` through a :class:`VllmPoolAdapter`.
        pool: vLLM's pool, adopted.
        resolver: request -> scope.
        block_size: tokens per block (vLLM's block size, equal to its hash block size).
        lookahead: tokens after each block its hash covers (EAGLE/MTP lookahead hashing).
        groups: vLLM's KV cache groups (a public prefix needs one).
    """

    #: The event layout (see the class docstring).
    fold_own_reuse: bool = True

    def __init__(
        self,
        *,
        governor: Governor,
        pool: GovernedBlockPool,
        resolver: ScopeResolver,
        block_size: int,
        lookahead: int = 0,
        groups: int = 1,
    ) -> None:
        self.gov = governor
        self.lookahead = lookahead
        self.groups = groups
        self.pool = pool
        self.resolver = resolver
        self.block_size = block_size
        # zero lists handed to steps, by id(list): (list, the (id, owner) zeroings it completes)
        self._inflight: dict[int, tuple[list[int], list[tuple[int, Any]]]] = {}
        # zeroing done but not yet written (step_returned): by id(owner), steps, since when
        self._done: dict[int, tuple[Any, list[int]]] = {}
        self._done_steps = 0
        self._done_since: float | None = None
        pool.kvgov_keyed = self._keyed
        pool.kvgov_moved = self._moved
        pool.kvgov_owner_table = governor.ledger.owners.table
        pool.kvgov_now = governor.clock

    @classmethod
    def open(
        cls,
        *,
        vllm_config: Any,
        kv_cache_config: Any,
        pool: GovernedBlockPool,
        block_size: int,
        clock: Callable[[], float] = time.time,
        environ: Mapping[str, str],
    ) -> VllmGovernance:
        """Read the settings, open the governor's parts, attach them to vLLM's pool.

        Raises:
            BindingConfigError: invalid settings, or a scope token required without a key.
            KeySecretError: no cache-key secret.
            PolicyLoadError: the policy bundle does not load or its tests fail.
            AuditSchemaError: the audit database needs ``kvgov db upgrade``.
        """
        settings = BindingSettings.load(getattr(vllm_config, "additional_config", None), environ)
        resolver = ScopeResolver.from_settings(
            settings, engine_scope(vllm_config.model_config, settings), environ, clock
        )
        parts = open_parts(
            policy_dir=settings.policy_dir,
            policy_data=settings.policy_data,
            audit_url=settings.audit_url,
            audit_writer=settings.audit_writer,
            key_secret=settings.key_secret(),
            ephemeral_secret=settings.ephemeral_secret,
            clock=clock,
            worker_id=settings.worker_id,
            policy_engine="embedded",
        )
        try:
            pool.kvgov_device = (
                f"vllm-worker:{getattr(vllm_config.device_config, 'device_type', '?')}"
            )
            adapter = VllmPoolAdapter(pool, bytes_per_block(kv_cache_config))
            governor = Governor(
                pool=adapter,
                policy=parts.policy,
                audit=parts.audit,
                deriver=parts.deriver,
                block_size=block_size,
                clock=clock,
            )
            # floors, caps and priority durations: validated against this pool now (a
            # bundle whose floors do not fit refuses to start), enforced in vLLM's queue
            governor.sync_eviction()
            return cls(
                governor=governor,
                pool=pool,
                resolver=resolver,
                block_size=block_size,
                lookahead=fence.hash_lookahead_tokens(vllm_config),
                groups=len(kv_cache_config.kv_cache_groups),
            )
        except BaseException:
            parts.close()
            raise

    # ------------------------------------------------------------------ admission

    def admit(self, request: Any) -> str | None:
        """Decide a new request; on admission, key it in its namespace.

        A request whose id the audit trail cannot hold as a ``sequence_id`` (too
        long, a NUL, a lone surrogate: a client's ``X-Request-Id``) is refused here,
        audited with the id escaped, so nothing written later (the admission event,
        inside vLLM's ``schedule()``) can fail on it.

        Never raises: a request whose admission fails unexpectedly (anything its
        client sent that slipped past validation, a policy-engine error) is refused
        and audited (``details.path`` ``kvgov.vllm/error``), and the engine's log has
        the traceback.

        Returns:
            None if admitted (its governance set, its hasher replaced), else the
            reason to send its client (``"kvgov: ..."``); every refusal is audited
            (unless the audit trail itself is down: then the message says so).
        """
        try:
            seq_id = str(request.request_id)
            num_tokens = int(request.num_tokens)
            sp = request.sampling_params
            extra_args = sp.extra_args if sp is not None else None
        except Exception as exc:
            _log.exception("kvgov: refusing a request that cannot be read")
            return refuse(
                self.gov.ledger,
                self.gov.audit,
                "",
                None,
                describe_error(exc),
                None,
                path=ERROR_PATH,
            )
        problem = request_id_problem(seq_id)
        if problem is not None:
            return refuse(self.gov.ledger, self.gov.audit, seq_id, num_tokens, problem, extra_args)
        try:
            return self._admit(request, seq_id, num_tokens, extra_args)
        except Exception as exc:
            _log.exception("kvgov: admitting request %r failed; refusing it", seq_id[:256])
            state: RequestGovernance | None = fence.governance_of(request)
            if state is not None:  # refused after keying: it caches nothing
                state.cacheable = False
                with contextlib.suppress(Exception):
                    request.block_hashes.clear()
            return refuse(
                self.gov.ledger,
                self.gov.audit,
                seq_id,
                num_tokens,
                describe_error(exc),
                extra_args,
                path=ERROR_PATH,
            )

    def _admit(
        self, request: Any, seq_id: str, num_tokens: int, extra_args: Mapping[str, Any] | None
    ) -> str | None:
        gov = self.gov
        try:
            gov.check_open()
            scope, prefix_tokens = self.resolver.resolve_request(extra_args, request.lora_request)
        except (InvalidScope, ScopeTokenError, PoolClosed) as exc:
            return refuse(gov.ledger, gov.audit, seq_id, num_tokens, str(exc), extra_args)
        hint = extra_args.get(PRIORITY_KEY) if extra_args else None
        if hint is not None and (type(hint) is not int or not MIN_PRIORITY <= hint <= MAX_PRIORITY):
            problem = (
                f"{PRIORITY_KEY} must be an integer {MIN_PRIORITY}..{MAX_PRIORITY}, "
                f"got {str(hint)[:64]!r}"
            )
            return refuse(gov.ledger, gov.audit, seq_id, num_tokens, problem, extra_args)
        why = self._prefix_problem(prefix_tokens, num_tokens)
        if why is not None:
            return refuse(gov.ledger, gov.audit, seq_id, num_tokens, why, extra_args)
        try:
            gov.check_not_purging(scope.tenant)
            view = gov.admission_view(scope, seq_id, num_tokens)
            adm = gov.decide(view, seq_id, num_tokens, hint)
            # namespaces and retention only: the hasher derives the keys (with extra keys)
            plan = gov.plan(view, b"", bool(adm.cache), 0)
            prefix = None
            blocks = min(prefix_tokens, num_tokens) // self.block_size
            if blocks and plan.cacheable:  # the prefix's namespaces and retention
                pview = gov.ledger.views.public(view)
                pplan = gov.plan(pview, b"", True, 0)
                if pplan.cacheable:  # else, as kvgov's own cache: all under the scope
                    prefix = (pview, pplan, blocks)
        except PolicyDenied as exc:  # audited by the governor
            return f"kvgov: {exc}"
        except (InvalidScope, TenantPurging) as exc:
            return refuse(gov.ledger, gov.audit, seq_id, num_tokens, str(exc), extra_args)
        except AuditUnavailable as exc:  # fail closed: nothing is admitted unaudited
            return f"kvgov: request refused, {exc}"
        state = RequestGovernance(
            seq_id=seq_id,
            num_tokens=num_tokens,
            view=view,
            adm=adm,
            plan=plan,
            deriver=gov.deriver,
            block_size=self.block_size,
            has_extra=has_extra_keys(request),
            lookahead=self.lookahead,
            requested_priority=hint,
            prefix=prefix,
        )
        fence.set_governance(request, state)
        if fence.block_hasher(request) is not None:  # None: prefix caching is off, nothing hashed
            fence.set_block_hasher(request, governed_block_hasher)
            request.block_hashes.clear()  # whatever the engine's own hasher made
            try:
                request.update_block_hashes()
            except InvalidArgument as exc:  # an extra key kvgov cannot encode
                request.block_hashes.clear()
                state.cacheable = False
                return refuse(gov.ledger, gov.audit, seq_id, num_tokens, str(exc), extra_args)
        return None

    def _prefix_problem(self, prefix_tokens: int, num_tokens: int) -> str | None:
        """Why a request's public prefix cannot be honoured (None: it can, or it has none)."""
        if not prefix_tokens:
            return None
        if prefix_tokens > num_tokens:
            return (
                f"kvgov_public_prefix_tokens ({prefix_tokens}) is longer than the prompt "
                f"({num_tokens} tokens)"
            )
        if self.groups != 1:
            return (
                "kvgov_public_prefix_tokens needs a model with one KV cache group; this "
                f"engine has {self.groups} (hybrid or sliding-window attention)"
            )
        return None

    # ------------------------------------------------------------------ lookup and commit

    def judge_hit(self, request: Any, hit_groups: Sequence[Sequence[Any]], hit_tokens: int) -> int:
        """How many leading tokens of the hit the request may use (its lookup just found it).

        A request that publishes in its tenant's namespace finds only its tenant's
        blocks there; in a share group, owners of other tenants are judged by the
        sharing policy over the blocks of every KV cache group in prefix order, the
        hit is cut at the first refusal (audited), and the granting decisions are
        kept for the reuse audit at commit.

        Args:
            request: vLLM's request.
            hit_groups: per KV cache group, the blocks the lookup found (a sliding
                window's are padded with the null block).
            hit_tokens: the tokens the hit covers.

        Returns:
            ``hit_tokens`` when every block may be used, else the tokens before the
            first refused block (a multiple of the block size).
        """
        state: RequestGovernance | None = fence.governance_of(request)
        if state is None or not state.shared or not hit_tokens:
            return hit_tokens
        self.drain()
        gov = self.gov
        found = hit_positions(hit_groups)
        verdict = sharing.judge(
            gov.ledger,
            gov.policy,
            gov.audit,
            state.view,
            [block_id for _, block_id in found],
            state.seq_id,
            state.prefix_view,
            state.prefix_blocks,
        )
        state.granted = verdict.granted
        if verdict.keep >= len(found):
            return hit_tokens
        return found[verdict.keep][0] * self.block_size

    def allocated(
        self,
        request: Any,
        new_blocks: Sequence[Any],
        hit_blocks: Sequence[Any],
        *,
        hit_tokens: int | None = None,
        public_ids: Sequence[int] = (),
    ) -> None:
        """vLLM gave the request ``new_blocks`` and committed the hit ``hit_blocks``.

        Records the owner of the new blocks; audits the admission the first time and
        every committed reuse (the owner and requester tenants, tokens reused): in the
        admission event when it is the first and of the request's own scope only
        (``fold_own_reuse``), else in REUSE / CROSS_TENANT_REUSE events.

        Args:
            request: vLLM's request.
            new_blocks: the blocks handed out, of every KV cache group.
            hit_blocks: the hit blocks committed, of every KV cache group.
            hit_tokens: the tokens the hit covers (default: one block's tokens per
                hit block, right for a single group).
            public_ids: the blocks at the request's public prefix positions: those of
                them just handed out are owned by the public scope.
        """
        state: RequestGovernance | None = fence.governance_of(request)
        if state is None:
            return
        gov = self.gov
        if self.pool.kvgov_events:  # evictions and frees before the owner changes hands
            gov.drain()
        new_ids = [b.block_id for b in new_blocks] if new_blocks else []
        if new_ids:
            gov.ledger.owners.assign(new_ids, state.view.scope)
            if public_ids and state.prefix_view is not None:
                public = set(public_ids)
                gov.ledger.owners.assign(
                    [i for i in new_ids if i in public], state.prefix_view.scope
                )
        hit_ids = [b.block_id for b in hit_blocks] if hit_blocks else []
        if not state.admitted:
            state.admitted = True
            # a reuse of the request's own scope's blocks (one owner: its scope) goes in
            # the admission event (OWN_REUSE_KEY), which the queries list as both
            own = None
            if hit_ids and self.fold_own_reuse:
                groups = gov.ledger.owners.group(hit_ids)
                if len(groups) == 1 and groups[0][0] == state.view.scope:
                    own = (len(hit_ids), len(hit_ids) * self.block_size)
            # written when vLLM first gives the request blocks, so it names the blocks and
            # the reused tokens vLLM committed; the decision was made at add_request
            gov.record_admission(
                state.view,
                state.seq_id,
                hit_ids + new_ids,
                state.adm,
                num_tokens=state.num_tokens,
                cacheable=state.cacheable,
                ttl=state.plan.ttl,
                requested_priority=state.requested_priority,
                cached_tokens=len(hit_ids) * self.block_size if hit_tokens is None else hit_tokens,
                own_reuse=own,
            )
            if own is not None:
                return
        if hit_ids:
            sharing.audit_reuse(
                gov.ledger,
                gov.audit,
                self.block_size,
                state.view,
                hit_ids,
                state.seq_id,
                state.granted,
            )

    def _keyed(self, request: Any, block_ids: list[int], first: int = 0) -> None:
        """vLLM cached the request's full blocks (``first``: the position of the first):
        give them the request's retention, and its eviction priority, duration and quota
        group (its tenant's). Blocks of a public prefix take the public scope's retention
        (their owner is the public scope since their allocation: :meth:`allocated`)."""
        state: RequestGovernance | None = fence.governance_of(request)
        queue = self.pool.kvgov_governed
        if state is None:
            if queue is not None:
                queue.kvgov_keyed(block_ids, DEFAULT_PRIORITY, 0, None)
            return
        rest = block_ids
        if first < state.prefix_blocks:
            public, rest = (
                block_ids[: state.prefix_blocks - first],
                block_ids[state.prefix_blocks - first :],
            )
            if state.prefix_ttl is not None:
                self.gov.ledger.deadlines.keyed(public, state.prefix_ttl)
        if state.plan.ttl is not None and rest:
            self.gov.ledger.deadlines.keyed(rest, state.plan.ttl)
        priority = state.adm.priority
        if queue is None:
            if priority == DEFAULT_PRIORITY:
                return  # the default policy: vLLM's queue, vLLM's order
            queue = self.pool.kvgov_queue()
        tenant = state.view.scope.tenant
        queue.kvgov_keyed(
            block_ids, priority, queue.kvgov_group(tenant), self._deadline(state, priority)
        )

    def _moved(self, src: int, dst: int) -> None:
        """vLLM moved block ``src``'s cached keys to ``dst`` (copy-on-write of a Mamba state
        or a partial hit: the worker copies ``src`` into ``dst`` this step): ``dst`` takes
        ``src``'s owner, retention and eviction order. ``dst`` was just handed out (its
        previous owner's eviction and zeroing are reported first); ``src`` stays with its
        holder, unhashed, and is ordered zeroed when it leaves it."""
        gov = self.gov
        if self.pool.kvgov_events:  # dst's eviction (get_new_blocks) before its owner changes
            gov.drain()
        owner = gov.ledger.owners.table[src]
        if owner is not None:
            gov.ledger.owners.assign([dst], owner)
        gov.ledger.deadlines.moved(src, dst)
        queue = self.pool.kvgov_governed
        if queue is not None:
            queue.kvgov_moved(src, dst)

    def _deadline(self, state: RequestGovernance, priority: int) -> float | None:
        """When a block this request caches at ``priority`` decays (None: never)."""
        if priority == DEFAULT_PRIORITY:
            return None
        duration = self.gov.ledger.eviction.durations.get(state.view.scope.tenant)
        return None if duration is None else self.gov.clock() + duration

    def allocating(self, request: Any) -> bool:
        """vLLM is about to allocate for ``request``: its tenant's cap applies (True when
        quotas are in force; :meth:`allocated_done` ends it)."""
        queue = self.pool.kvgov_governed
        if queue is None or not queue.kvgov_quotas:
            return False
        state: RequestGovernance | None = fence.governance_of(request)
        queue.kvgov_allocating = queue.kvgov_group(state.view.scope.tenant) if state else 0
        return True

    def allocated_done(self) -> None:
        """The allocation :meth:`allocating` announced is over."""
        queue = self.pool.kvgov_governed
        if queue is not None:
            queue.kvgov_allocating = 0

    # ------------------------------------------------------------------ steps

    def drain(self) -> None:
        """Turn the pool's events into owners, deadlines, counters and audit events."""
        if self.pool.kvgov_events:
            self.gov.drain()

    def sweep_due(self) -> None:
        """Evict what outlived its retention, if anything is due (a heap peek otherwise)."""
        gov = self.gov
        if gov.ledger.deadlines.next_due() <= gov.clock():
            gov.sweep()

    def zero_pending(self) -> bool:
        """Whether ids wait for a step to carry them to the workers."""
        return bool(self.pool.kvgov_zero)

    def zero_orders(self, also: Sequence[int] = ()) -> list[int] | None:
        """The ids that left an owner since the last step: this step's ``new_block_ids_to_zero``.

        Args:
            also: ids vLLM itself zeroes this step (its new blocks, where its cache needs
                zeroing: mixed precision), carried too; their zeroing completes no order.
        """
        self.drain()
        if not self.zero_pending():  # most steps: nothing to carry
            if not also:
                return None
            ids: list[int] = list(dict.fromkeys(also))
            self._inflight[id(ids)] = (ids, [])
            return ids
        ids, pairs = self.pool.take_zero_orders()
        if also:
            ordered = set(ids)
            ids.extend(i for i in dict.fromkeys(also) if i not in ordered)
        self._inflight[id(ids)] = (ids, pairs)
        return ids

    def loaded(self, block_ids: Iterable[int]) -> None:
        """An async KV-connector load fills ``block_ids``: keep them out of this step's zeroing.

        A block among them that left an owner since the last step is not zeroed now
        (the zeroing would race the load); it is zeroed at its next release, and that
        step's "done" covers its earlier owner too (:meth:`GovernedBlockPool.kvgov_defer_zero`).
        """
        self.pool.kvgov_defer_zero(block_ids)

    def step_returned(self, carried: list[int] | None, *, has_requests: Callable[[], bool]) -> None:
        """The step whose output carried ``carried`` came back: the workers zeroed them.

        "Done" is written per owner, coalesced over steps: when the engine goes idle
        (``has_requests()`` is false), when the oldest unwritten one is
        ``ZEROIZATION_DONE_FLUSH_SECONDS`` old, at an erasure and at shutdown (one event
        per step would double the audit trail of a busy engine). ``details.steps`` says
        how many steps an event covers. A step that carried nothing, with nothing
        waiting (most steps), returns at once, without asking ``has_requests``.
        """
        if carried is None:
            if self._done_since is None:
                return
            entry = None
        else:
            entry = self._inflight.pop(id(carried), None)
        if entry is not None and entry[0] is carried:
            done = self._done
            for b, owner in entry[1]:
                key = id(owner)
                group = done.get(key)
                if group is None:
                    group = done[key] = (owner, [])
                group[1].append(b)
            self._done_steps += 1
            if self._done_since is None:
                self._done_since = self.gov.clock()
        if self._done_since is not None and (
            self.gov.clock() - self._done_since >= ZEROIZATION_DONE_FLUSH_SECONDS
            or not has_requests()
        ):
            self.flush_done()

    def flush_done(self) -> None:
        """Write the coalesced "done" zeroization events now (one per owner)."""
        done, steps = self._done, self._done_steps
        self._done, self._done_steps, self._done_since = {}, 0, None
        bpb = self.pool.kvgov_bytes_per_block
        for owner, ids in done.values():
            self.gov.audit.record(
                trusted_event(  # vLLM's block ids, an owner scope's tenant, counts
                    EventType.ZEROIZATION,
                    tenant=owner.tenant if owner is not None else None,
                    block_ids=tuple(sorted(ids)),
                    details=trusted_details(
                        {
                            "bytes": bpb * len(ids),
                            "device": self.pool.kvgov_device,
                            "state": "done",
                            "steps": steps,
                        }
                    ),
                )
            )

    # ------------------------------------------------------------------ erasure and maintenance

    def purge_tenant(self, tenant: str, live: Iterable[RequestGovernance]) -> ErasureReport:
        """Erase a tenant (see :meth:`kvgov.govern.GovernedKVCache.purge_tenant`).

        The blocks are ordered zeroed (the next step carries them; an idle engine
        runs one for it): the report's ``verified`` is False (the pool cannot read
        the workers' bytes back; ``held_blocks`` counts the tenant's blocks running
        requests still hold, as for kvgov's pool), the "done" zeroization events
        follow when that step comes back.
        """
        self.flush_done()
        return self.gov.purge_tenant(tenant, live)

    def invalidate(
        self, live: Iterable[RequestGovernance], filters: Mapping[str, str]
    ) -> InvalidationReport:
        """Drop every block of a scope matching all ``filters`` (``erasure.SCOPE_FILTERS``)."""
        return self.gov.invalidate(dict(filters), live)

    def sweep(self) -> int:
        """Evict every cached block past its retention now; returns how many."""
        return self.gov.sweep()

    def rotate_secret(self, new_secret: bytes, live: Iterable[RequestGovernance]) -> int:
        """Switch the cache-key secret (see :meth:`GovernedKVCache.rotate_secret`)."""
        return self.gov.rotate_secret(new_secret, live)

    def stats(self, live_sequences: int) -> CacheStats:
        """The governor's counters and the pool's blocks by state."""
        self.drain()
        with self.gov.lock:
            return self.gov.stats(live_sequences=live_sequences, orphans_recovered=0)

    def close(self) -> None:
        """Flush and close the audit trail and the policy client. Idempotent."""
        if self.gov.closed:
            return
        try:
            self.drain()
            self.flush_done()
        finally:
            self.gov.close()


def engine_scope(model_config: Any, settings: BindingSettings) -> EngineScope:
    """The model and tokenizer fields of every scope, from vLLM's model config.

    A setting overrides the engine's revision (a local model path has none);
    a revision nobody gives is :data:`kvgov.defaults.UNVERSIONED`.
    """
    model = revision_of(getattr(model_config, "model", None))
    tokenizer = getattr(model_config, "tokenizer", None) or getattr(model_config, "model", None)
    return EngineScope(
        model=model,
        model_revision=revision_of(
            settings.model_revision or getattr(model_config, "revision", None)
        ),
        tokenizer=revision_of(tokenizer),
        tokenizer_revision=revision_of(
            settings.tokenizer_revision or getattr(model_config, "tokenizer_revision", None)
        ),
    )


def bytes_per_block(kv_cache_config: Any) -> int:
    """Bytes of KV one block holds in one worker: page size times its group's layers.

    A block id belongs to one group at a time; with several groups, the largest.
    """
    return max(
        int(group.kv_cache_spec.page_size_bytes) * max(1, len(group.layer_names))
        for group in kv_cache_config.kv_cache_groups
    )
