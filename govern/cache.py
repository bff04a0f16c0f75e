"""The governed KV cache: the one object a serving stack embeds.

``GovernedKVCache`` composes the three lower layers, and is the only place
that does::

    request --> govern --(cached decisions)--> policy
                  |
                  +--(block ids, keys)--> allocator --(events)--+
                  |                                             |
                  +<--------------------------------------------+
                  |
                  +--(typed events)--> audit (background, hash-chained)

Life of a request (``admit`` / ``append`` / ``release``)::

    tokens: |<--- block 0 --->|<--- block 1 --->|<--- block 2 --->|<- tail ->|
    keys:       K0 = H(root)      K1 = H(K0)        K2 = H(K1)        (none)
    admit:  [ hit (reused)   ][ hit (reused)   ][ new, keyed     ][ new     ]
                                                  caller writes KV from here
    release: full keyed blocks -> CACHED (if cacheable); the rest -> DIRTY -> zeroized

Blocks are keyed at admission, as vLLM keys them at scheduling: a second
sequence may hit a block in the same step, so the caller must have written a
block's KV before another sequence's forward pass reads it (on one CUDA
stream, kernel order guarantees that).
"""

from __future__ import annotations

import os
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from operator import itemgetter
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from kvgov import defaults
from kvgov.allocator import (
    BlockPool,
    BlocksEvicted,
    BlockState,
    BlocksZeroized,
    KVSpec,
)
from kvgov.audit import AuditEvent, AuditLog, EventType
from kvgov.exceptions import (
    DuplicateSequence,
    InternalError,
    InvalidArgument,
    InvalidScope,
    OutOfBlocks,
    PolicyDenied,
    PoolClosed,
    TenantPurging,
    UnknownSequence,
    ZeroizationError,
)
from kvgov.policy import PolicyClient

from .keys import (
    CacheKey,
    KeyDeriver,
    NamespaceRoot,
    ScopeDigest,
    continuation_root,
    load_key_secret,
    namespace_root,
    pack_tokens,
    scope_digest,
)
from .logs import get_logger
from .results import Admission, ErasureReport, InvalidationReport, ReconcileReport
from .scope import CacheScope
from .stats import CacheStats, _sum, _TenantCounters

__all__ = ["GovernedKVCache"]

_log = get_logger()

#: The classification of a public prefix (see ``admit(public_prefix_tokens=...)``).
_PUBLIC = "public"


@dataclass(frozen=True, slots=True)
class _ScopeView:
    """What the cache derives once per scope (digest, namespace, audit fields)."""

    scope: CacheScope
    fields: Mapping[str, Any]  # the scope dict: policy input and AuditEvent keyword arguments
    digest: ScopeDigest  # scope digest (tenant excluded)
    own_root: NamespaceRoot  # the tenant's namespace root


class _Sequence:
    """A live sequence; only the cache, under its lock, changes it."""

    __slots__ = (
        "admitted_blocks",
        "block_ids",
        "cacheable",
        "decision_id",
        "num_tokens",
        "parent",
        "priority",
        "seq_id",
        "tail",
        "ttl",
        "view",
    )

    def __init__(
        self,
        seq_id: str,
        view: _ScopeView,
        block_ids: list[int],
        num_tokens: int,
        tail: bytes,
        parent: bytes,
        cacheable: bool,
        priority: int,
        ttl: float | None,
        decision_id: str,
    ) -> None:
        self.seq_id = seq_id  # the caller's id
        self.view = view  # the scope it was admitted under
        self.block_ids = block_ids  # block table in token order; grows on append
        self.admitted_blocks = len(block_ids)  # blocks listed in the admission event
        self.num_tokens = num_tokens  # tokens so far (prompt + appended)
        self.tail = tail  # packed tokens of the partial last block
        self.parent = parent  # key of the last full block (publish namespace) or its root
        self.cacheable = cacheable  # admission said cache; purge/invalidate/rotate clear it
        self.priority = priority  # eviction priority for its cached blocks
        self.ttl = ttl  # retention seconds once CACHED (None: no deadline)
        self.decision_id = decision_id  # the admission decision


@dataclass(slots=True)
class _KeyPlan:
    """How one admission's blocks are keyed (see ``_plan_keys``)."""

    root: bytes  # namespace root of the scope's own blocks: the tenant's or its publish group's
    rest_parent: bytes  # parent of the first block after the public prefix (root without one)
    read_roots: tuple[bytes, ...] = ()  # other namespaces the scope may look up in
    keys: list[CacheKey] = field(default_factory=list)  # one key per full block
    prefix_blocks: int = 0  # leading blocks keyed under the public prefix scope
    prefix_view: _ScopeView | None = None  # that scope
    prefix_ttl: float | None = None  # its retention
    ttl: float | None = None  # retention of the rest; None: nothing may be cached
    prefix_read_roots: tuple[bytes, ...] = ()  # other namespaces the prefix scope may read


class GovernedKVCache:
    """A paged KV cache where every reuse is scoped, policy-decided and audited.

    Invariants (beyond the pool's own, see :class:`kvgov.allocator.BlockPool`):

    * a block is found by key only in the namespace (tenant or share group)
      that keyed it, and every key commits to the full scope but the tenant
      (see :mod:`kvgov.govern.keys`);
    * a hit on a block another tenant owns is used only if the sharing policy
      allows that requester and owner, and is audited synchronously;
    * ``_owner[b]`` is the scope that first wrote block ``b`` while ``b`` is
      OWNED, CACHED or DIRTY, and None while it is FREE;
    * nothing happens unaudited: when the audit trail cannot be written,
      operations raise :class:`kvgov.exceptions.AuditUnavailable`.

    Thread safety: every public method takes one re-entrant lock; the pool,
    the policy client and the audit log are only used under it (the audit
    log's writer thread works off its own queue).

    Build one with :meth:`create`; the constructor takes ready parts (for
    tests and experts).

    Args:
        pool: the block pool (its clock should be ``clock``).
        policy: the policy client (decision cache inside).
        audit: the audit log.
        deriver: the key deriver holding the secret.
        clock: seconds since the epoch; retention and audit times read it.
    """

    def __init__(
        self,
        *,
        pool: BlockPool,
        policy: PolicyClient,
        audit: AuditLog,
        deriver: KeyDeriver,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._pool = pool
        self._policy = policy
        self._audit = audit
        self._deriver = deriver
        self._clock = clock
        self._lock = threading.RLock()
        self._closed = False
        self._block_size = pool.spec.block_size
        self._bytes_per_block = pool.spec.bytes_per_block
        self._seqs: dict[str, _Sequence] = {}
        self._owner: list[CacheScope | None] = [None] * pool.num_blocks
        self._views: dict[CacheScope, _ScopeView] = {}
        self._group_roots: dict[str, NamespaceRoot] = {}
        self._counters: defaultdict[str, _TenantCounters] = defaultdict(_TenantCounters)
        self._unattributed = _TenantCounters()
        self._purging: set[str] = set()
        self._orphans_recovered = 0
        self._classifications = policy.classifications()
        self._sweeper: _Sweeper | None = None

    # ------------------------------------------------------------------ construction

    @classmethod
    def create(
        cls,
        spec: KVSpec,
        num_blocks: int,
        device: str | torch.device = "cpu",
        policy_dir: str | os.PathLike[str] | None = None,
        policy_data: Mapping[str, Any] | None = None,
        audit_url: str = defaults.AUDIT_URL,
        key_secret: bytes | None = None,
        ephemeral_secret: bool = False,
        clock: Callable[[], float] = time.time,
        worker_id: str | None = None,
        *,
        policy_engine: Any = "embedded",
        verify_zeroization: bool = False,
    ) -> GovernedKVCache:
        """Build a governed cache on the embedded defaults (or the parts named).

        Args:
            spec: the KV layout.
            num_blocks: blocks in the pool.
            device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, or a torch device.
            policy_dir: a Rego bundle directory; None for the bundled policy.
            policy_data: a dict deep-merged over the bundle's ``data.json``
                (share groups, retention, per-tenant overrides).
            audit_url: SQLAlchemy URL of the audit database (SQLite or PostgreSQL).
            key_secret: the cache-key secret (>= 32 bytes); None reads
                ``KVGOV_KEY_SECRET``.
            ephemeral_secret: with no secret anywhere, draw a random one for the
                life of this process instead of refusing to start.
            clock: seconds since the epoch; inject a fake one in tests.
            worker_id: the audit stream id of this worker; None derives one.
            policy_engine: ``"embedded"`` or a ready :class:`kvgov.policy.PolicyEngine`
                (e.g. an ``OpaServerEngine``).
            verify_zeroization: read back every zeroized block range and raise
                :class:`kvgov.exceptions.ZeroizationError` if any byte is left.

        Returns:
            The cache; use it as a context manager or call :meth:`close`.

        Raises:
            KeySecretError: no usable secret.
            PolicyLoadError: the policy bundle does not load or its tests fail.
            AuditSchemaError: the audit database needs ``kvgov db upgrade``.
            InvalidSpec: nonsense sizes.
        """
        deriver = KeyDeriver(
            load_key_secret(key_secret, ephemeral=ephemeral_secret, environ=dict(os.environ))
        )
        policy = PolicyClient.create(
            policy_dir=None if policy_dir is None else Path(policy_dir),
            policy_data=policy_data,
            engine=policy_engine,
        )
        try:
            audit = AuditLog(audit_url, worker_id=worker_id, clock=clock)
        except BaseException:
            policy.close()
            raise
        try:
            pool = BlockPool(spec, num_blocks, device, verify=verify_zeroization, clock=clock)
        except BaseException:
            audit.close()
            policy.close()
            raise
        return cls(pool=pool, policy=policy, audit=audit, deriver=deriver, clock=clock)

    # ------------------------------------------------------------------ properties

    @property
    def spec(self) -> KVSpec:
        """The KV layout of the pool."""
        return self._pool.spec

    @property
    def num_blocks(self) -> int:
        """Blocks in the pool."""
        return self._pool.num_blocks

    @property
    def policy(self) -> PolicyClient:
        """The policy client (for ``reload`` and ``offload`` decisions)."""
        return self._policy

    @property
    def audit(self) -> AuditLog:
        """The audit log this cache writes to."""
        return self._audit

    @property
    def pool(self) -> BlockPool:
        """The underlying block pool (for experts; state changes belong to this cache)."""
        return self._pool

    # ------------------------------------------------------------------ request path

    def admit(
        self,
        seq_id: str,
        scope: CacheScope,
        token_ids: Sequence[int],
        priority: int | None = None,
        *,
        public_prefix_tokens: int = 0,
    ) -> Admission:
        """Admit a sequence: decide, reuse the longest permitted cached prefix, allocate the rest.

        Args:
            seq_id: the caller's id for the sequence, unique among live ones.
            scope: who it belongs to and what produced its KV.
            token_ids: the prompt's token ids.
            priority: a requested eviction priority (0-100); the admission
                policy decides the one used.
            public_prefix_tokens: how many leading tokens are public (a shared
                system prompt). Their whole blocks are keyed under the scope with
                classification ``public``, so a share group the policy grants for
                public data can reuse them across tenants (published where the
                tenant may publish, found in every group it may read); the rest
                stays under ``scope`` and chains from the prefix in the scope's
                own namespace.

        Returns:
            The block table and how many leading tokens are already cached.

        Raises:
            InvalidArgument: bad seq_id or priority.
            InvalidScope: the classification is unknown to the policy.
            InvalidTokens: token ids are not non-negative ints below 2**32.
            TenantPurging: the tenant is being erased.
            DuplicateSequence: ``seq_id`` is live.
            PolicyDenied: the admission policy refused (audited).
            OutOfBlocks: not enough free or evictable blocks (nothing changed).
            AuditUnavailable: the audit trail cannot be written.
        """
        _check_seq_id(seq_id)
        if not isinstance(scope, CacheScope):
            raise InvalidScope("scope", scope, "must be a CacheScope")
        if priority is not None and (
            not isinstance(priority, int)
            or isinstance(priority, bool)
            or not defaults.MIN_PRIORITY <= priority <= defaults.MAX_PRIORITY
        ):
            raise InvalidArgument(
                "priority",
                priority,
                f"an int in {defaults.MIN_PRIORITY}..{defaults.MAX_PRIORITY}, or None",
            )
        packed = pack_tokens(token_ids)
        if (
            not isinstance(public_prefix_tokens, int)
            or isinstance(public_prefix_tokens, bool)
            or not 0 <= public_prefix_tokens <= len(packed) // 4
        ):
            raise InvalidArgument(
                "public_prefix_tokens", public_prefix_tokens, "an int from 0 to len(token_ids)"
            )
        if scope.tenant in self._purging:
            raise TenantPurging(scope.tenant)
        with self._lock:
            self._check_open()
            if seq_id in self._seqs:
                raise DuplicateSequence(seq_id)
            view = self._view(scope)
            num_tokens = len(packed) // 4
            counters = self._counters[scope.tenant]
            adm = self._policy.admission(view.fields, num_tokens, priority)
            decision = adm.decision
            if not adm.allow:
                counters.denials[_denial_key(adm.reason, decision.error)] += 1
                self._audit.record(
                    AuditEvent(
                        type=EventType.POLICY_ERROR if decision.error else EventType.POLICY_DENIED,
                        **view.fields,
                        sequence_id=seq_id,
                        token_count=num_tokens,
                        decision_id=decision.decision_id,
                        policy_revision=decision.bundle_revision,
                        details={"reason": adm.reason, "path": decision.path},
                    )
                )
                _log.info(
                    "admission_denied",
                    tenant=scope.tenant,
                    seq_id=seq_id,
                    reason=adm.reason,
                    decision_id=decision.decision_id,
                )
                raise PolicyDenied(decision.path, adm.reason, decision.decision_id)

            bs = self._block_size
            num_full = num_tokens // bs
            num_blocks = -(-num_tokens // bs)
            # Keep at least one prompt token to compute, as vLLM does: the caller
            # needs its logits, and must never write into a shared block.
            max_hit = (num_tokens - 1) // bs if num_tokens else 0
            cacheable = bool(adm.cache)
            plan = _KeyPlan(view.own_root, view.own_root)
            hit_ids: list[int] = []
            if cacheable:
                plan = self._plan_keys(view, packed, num_full, public_prefix_tokens)
                cacheable = plan.ttl is not None
            if cacheable and max_hit:
                if plan.prefix_blocks:
                    hit_ids = self._prefix_lookup(plan, packed, max_hit)
                    self._drain()
                    if hit_ids:
                        hit_ids = self._check_sharing(
                            view, hit_ids, seq_id, plan.prefix_view, plan.prefix_blocks
                        )
                else:
                    hit_ids = self._lookup(
                        view, packed, plan.keys, max_hit, plan.read_roots, seq_id
                    )
            try:
                new_ids = self._pool.allocate(num_blocks - len(hit_ids))
            except OutOfBlocks:
                self._drain()
                if hit_ids:
                    self._pool.free(hit_ids)
                    self._drain()
                raise
            self._drain()
            owner = self._owner
            first_new = len(hit_ids)
            prefix_blocks = plan.prefix_blocks
            prefix_scope = plan.prefix_view.scope if plan.prefix_view is not None else scope
            if first_new >= prefix_blocks:
                for b in new_ids:
                    owner[b] = scope
            else:
                for i, b in enumerate(new_ids, first_new):
                    owner[b] = prefix_scope if i < prefix_blocks else scope
            block_ids = hit_ids + new_ids
            if cacheable and first_new < prefix_blocks and plan.prefix_view is not None:
                self._pool.set_keys(
                    block_ids[first_new:prefix_blocks],
                    plan.keys[first_new:prefix_blocks],
                    priority=adm.priority,
                    ttl=plan.prefix_ttl,
                )
            start = max(first_new, prefix_blocks)
            if cacheable and num_full > start:
                self._pool.set_keys(
                    block_ids[start:num_full],
                    plan.keys[start:num_full],
                    priority=adm.priority,
                    ttl=plan.ttl,
                )
            parent = (
                plan.keys[num_full - 1]
                if cacheable and num_full > prefix_blocks
                else plan.rest_parent
            )
            self._seqs[seq_id] = _Sequence(
                seq_id,
                view,
                block_ids,
                num_tokens,
                packed[num_full * bs * 4 :],
                parent,
                cacheable,
                adm.priority,
                plan.ttl,
                decision.decision_id,
            )
            cached_tokens = len(hit_ids) * bs
            counters.requests += 1
            counters.queried_tokens += num_tokens
            counters.hit_tokens += cached_tokens
            self._audit.record(
                AuditEvent(
                    type=EventType.ADMISSION,
                    **view.fields,
                    sequence_id=seq_id,
                    block_ids=tuple(block_ids),
                    token_count=num_tokens,
                    reused_tokens=cached_tokens,
                    decision_id=decision.decision_id,
                    policy_revision=decision.bundle_revision,
                    details={"cache": cacheable, "priority": adm.priority, "reason": adm.reason},
                )
            )
            _log.debug(
                "admitted",
                tenant=scope.tenant,
                seq_id=seq_id,
                blocks=len(block_ids),
                cached_tokens=cached_tokens,
                decision_id=decision.decision_id,
            )
            return Admission(
                seq_id=seq_id,
                block_ids=tuple(block_ids),
                cached_tokens=cached_tokens,
                decision_id=decision.decision_id,
                cacheable=cacheable,
                priority=adm.priority,
            )

    def append(self, seq_id: str, token_ids: Sequence[int]) -> list[int]:
        """Grow a live sequence by decoded tokens; blocks that become full get their keys.

        Args:
            seq_id: a live sequence.
            token_ids: the new tokens.

        Returns:
            Ids of the blocks newly added to the sequence's block table (the
            caller writes the new tokens' KV into the last partial block and these).

        Raises:
            UnknownSequence: no live sequence has that id.
            InvalidTokens: bad token ids (nothing changed).
            OutOfBlocks: no block for the growth (nothing changed).
        """
        packed = pack_tokens(token_ids)
        with self._lock:
            self._check_open()
            seq = self._seqs.get(seq_id)
            if seq is None:
                raise UnknownSequence(seq_id)
            if not packed:
                return []
            bs = self._block_size
            total = seq.num_tokens + len(packed) // 4
            needed = -(-total // bs) - len(seq.block_ids)
            new_ids = self._pool.allocate(needed) if needed > 0 else []
            self._drain()
            scope = seq.view.scope
            for b in new_ids:
                self._owner[b] = scope
            seq.block_ids.extend(new_ids)
            tail = seq.tail + packed
            first_full = seq.num_tokens // bs
            completed = total // bs - first_full
            if completed > 0 and seq.cacheable:
                keys = self._deriver.derive_chain(seq.parent, tail, seq.view.digest, bs, completed)
                self._pool.set_keys(
                    seq.block_ids[first_full : first_full + completed],
                    keys,
                    priority=seq.priority,
                    ttl=seq.ttl,
                )
                seq.parent = keys[-1]
            seq.tail = tail[completed * bs * 4 :]
            seq.num_tokens = total
            return new_ids

    def release(self, seq_id: str) -> bool:
        """Finish a sequence: keep its cacheable full blocks, zeroize the rest. Idempotent.

        Args:
            seq_id: the sequence.

        Returns:
            True if it was live and is now released, False if it was not live.
        """
        return self._end(seq_id, cache=True, reason="released")

    def cancel(self, seq_id: str) -> bool:
        """Release a sequence without caching anything of it (its blocks are zeroized). Idempotent.

        Args:
            seq_id: the sequence.

        Returns:
            True if it was live and is now cancelled, False if it was not live.
        """
        return self._end(seq_id, cache=False, reason="cancelled")

    def reconcile(self, live_seq_ids: Iterable[str]) -> ReconcileReport:
        """Release every live sequence the caller no longer knows (crashed scheduler, lost work).

        Orphans are released without caching: their KV may be half written.

        Args:
            live_seq_ids: the sequences the caller still runs.

        Returns:
            The orphans released and how many block references they held.
        """
        keep = set(live_seq_ids)
        with self._lock:
            self._check_open()
            orphans = [s for s in self._seqs if s not in keep]
            blocks = 0
            for seq_id in orphans:
                blocks += len(self._seqs[seq_id].block_ids)
                self._end(seq_id, cache=False, reason="orphaned")
            self._orphans_recovered += len(orphans)
            return ReconcileReport(orphaned=tuple(orphans), blocks_released=blocks)

    def block(self, block_id: int) -> torch.Tensor:
        """The torch view of one block, ``[num_layers, 2, block_size, kv_heads, head_dim]``.

        Args:
            block_id: a block id from an :class:`Admission` or :meth:`append`.

        Returns:
            A view into the pool (writes go to the cache).

        Raises:
            UnknownBlock: no such block.
        """
        return self._pool.block(block_id)

    # ------------------------------------------------------------------ retention and erasure

    def sweep(self) -> int:
        """Evict and zeroize every cached block past its retention deadline.

        Returns:
            How many blocks expired.
        """
        with self._lock:
            self._check_open()
            with self._zeroization_audited():
                expired = self._pool.expire(self._clock())
            self._drain()
            if expired:
                self._audit.record(
                    AuditEvent(
                        type=EventType.RETENTION_SWEEP,
                        block_ids=tuple(expired),
                        details={"expired": len(expired)},
                    )
                )
            return len(expired)

    def start_sweeper(self, interval: float) -> None:
        """Run :meth:`sweep` every ``interval`` seconds on a daemon thread until :meth:`close`.

        Args:
            interval: seconds between sweeps (> 0).

        Raises:
            InvalidArgument: interval not positive, or a sweeper already runs.
        """
        if not isinstance(interval, int | float) or isinstance(interval, bool) or interval <= 0:
            raise InvalidArgument("interval", interval, "seconds, greater than 0")
        with self._lock:
            self._check_open()
            if self._sweeper is not None:
                raise InvalidArgument("interval", interval, "a sweeper already runs")
            self._sweeper = _Sweeper(self, float(interval))
            self._sweeper.start()

    def purge_tenant(self, tenant: str) -> ErasureReport:
        """Erase a tenant from the cache (right to be forgotten).

        Every cached block the tenant wrote (including blocks it published to
        share groups) is evicted and zeroized now and read back to check it is
        zero; blocks still held by running sequences become unreachable by key
        and are zeroized at release; the tenant's running sequences will cache
        nothing. New admissions for the tenant are refused while this runs. The
        erasure event is written synchronously before this returns.

        Args:
            tenant: the tenant.

        Returns:
            The erasure evidence.

        Raises:
            InvalidScope: tenant is not a valid identifier.
            AuditUnavailable: the erasure could not be audited (the blocks are
                zeroized all the same).
        """
        if not isinstance(tenant, str) or not tenant:
            raise InvalidScope("tenant", tenant, "a non-empty string")
        self._purging.add(tenant)
        try:
            with self._lock:
                self._check_open()
                in_flight = tuple(
                    s.seq_id for s in self._seqs.values() if s.view.scope.tenant == tenant
                )
                for seq_id in in_flight:
                    self._seqs[seq_id].cacheable = False
                targets = [
                    b
                    for b, owner in enumerate(self._owner)
                    if owner is not None and owner.tenant == tenant
                ]
                evicted, detached = self._revoke(targets, "purged")
                verified = self._read_back_zero(evicted)
                finished = self._clock()
                event_id = self._audit.record(
                    AuditEvent(
                        type=EventType.ERASURE,
                        tenant=tenant,
                        block_ids=tuple(evicted),
                        details={
                            "blocks_zeroized": len(evicted),
                            "bytes_zeroized": len(evicted) * self._bytes_per_block,
                            "detached_blocks": len(detached),
                            "in_flight_sequences": list(in_flight),
                            "verified": verified,
                            "finished_at": finished,
                        },
                    )
                )
                _log.info(
                    "tenant_erased",
                    tenant=tenant,
                    blocks_zeroized=len(evicted),
                    in_flight=len(in_flight),
                    verified=verified,
                    event_id=event_id,
                )
                return ErasureReport(
                    tenant=tenant,
                    blocks_zeroized=len(evicted),
                    bytes_zeroized=len(evicted) * self._bytes_per_block,
                    in_flight_sequences=in_flight,
                    detached_blocks=len(detached),
                    verified=verified,
                    event_id=event_id,
                    finished_at=finished,
                )
        finally:
            self._purging.discard(tenant)

    def invalidate(
        self,
        *,
        model: str | None = None,
        model_revision: str | None = None,
        adapter: str | None = None,
        adapter_revision: str | None = None,
        tokenizer: str | None = None,
        tokenizer_revision: str | None = None,
        template_version: str | None = None,
    ) -> InvalidationReport:
        """Drop every block keyed under a scope matching all the given fields.

        Run it after a weight, adapter, tokenizer or template update. Fields left
        None match anything; at least one must be given.

        Returns:
            What was dropped.

        Raises:
            InvalidArgument: no field given.
        """
        wanted = {
            name: value
            for name, value in (
                ("model", model),
                ("model_revision", model_revision),
                ("adapter", adapter),
                ("adapter_revision", adapter_revision),
                ("tokenizer", tokenizer),
                ("tokenizer_revision", tokenizer_revision),
                ("template_version", template_version),
            )
            if value is not None
        }
        if not wanted:
            raise InvalidArgument(
                "filters", wanted, "give at least one of model, model_revision, adapter, ..."
            )

        def matches(scope: CacheScope) -> bool:
            return all(getattr(scope, k) == v for k, v in wanted.items())

        with self._lock:
            self._check_open()
            marked = 0
            for seq in self._seqs.values():
                if seq.cacheable and matches(seq.view.scope):
                    seq.cacheable = False
                    marked += 1
            targets = [
                b for b, owner in enumerate(self._owner) if owner is not None and matches(owner)
            ]
            evicted, detached = self._revoke(targets, "invalidated")
            event_id = self._audit.record(
                AuditEvent(
                    type=EventType.INVALIDATION,
                    block_ids=tuple(evicted),
                    details={
                        "filter": wanted,
                        "blocks_zeroized": len(evicted),
                        "detached_blocks": len(detached),
                        "sequences_marked": marked,
                    },
                )
            )
            _log.info("invalidated", filter=wanted, blocks_zeroized=len(evicted))
            return InvalidationReport(
                blocks_zeroized=len(evicted),
                detached_blocks=len(detached),
                sequences_marked=marked,
                event_id=event_id,
            )

    def rotate_secret(self, new_secret: bytes) -> int:
        """Switch to a new cache-key secret; every old key becomes unreachable.

        Cached blocks keyed with the old secret are evicted and zeroized; blocks
        of running sequences are unindexed and zeroized at release, and those
        sequences cache nothing more (their chains were derived with the old secret).

        Args:
            new_secret: at least 32 bytes.

        Returns:
            Blocks evicted and zeroized now.

        Raises:
            KeySecretError: the new secret is too short (nothing changed).
        """
        deriver = KeyDeriver(new_secret)
        with self._lock:
            self._check_open()
            for seq in self._seqs.values():
                seq.cacheable = False
            targets = [b for b, owner in enumerate(self._owner) if owner is not None]
            evicted, detached = self._revoke(targets, "secret_rotated")
            self._deriver = deriver
            self._audit.record(
                AuditEvent(
                    type=EventType.SECRET_ROTATION,
                    block_ids=tuple(evicted),
                    details={"blocks_zeroized": len(evicted), "detached_blocks": len(detached)},
                )
            )
            return len(evicted)

    # ------------------------------------------------------------------ observation and life

    def stats(self) -> CacheStats:
        """A consistent snapshot of every counter, per tenant and in total.

        Returns:
            The counters, and blocks by state.
        """
        with self._lock:
            pool = self._pool
            per_tenant: defaultdict[str, dict[str, int]] = defaultdict(
                lambda: {"owned": 0, "cached": 0}
            )
            if not self._closed:
                for b, owner in enumerate(self._owner):
                    if owner is None:
                        continue
                    state = pool.state(b)
                    if state is BlockState.OWNED:
                        per_tenant[owner.tenant]["owned"] += 1
                    elif state is BlockState.CACHED:
                        per_tenant[owner.tenant]["cached"] += 1
                counts = pool.counts()
                totals = {
                    "free": counts.free,
                    "owned": counts.owned,
                    "cached": counts.cached,
                    "dirty": counts.dirty,
                }
            else:
                totals = {"free": 0, "owned": 0, "cached": 0, "dirty": 0}
            tenants = {
                name: c.freeze(per_tenant.get(name, {"owned": 0, "cached": 0}))
                for name, c in sorted(self._counters.items())
            }
            total = _sum([*self._counters.values(), self._unattributed]).freeze(totals)
            cache_stats = self._policy.cache_stats()
            return CacheStats(
                total=total,
                tenants=tenants,
                num_blocks=pool.num_blocks,
                bytes_per_block=self._bytes_per_block,
                orphans_recovered=self._orphans_recovered,
                live_sequences=len(self._seqs),
                decision_cache_hits=cache_stats.hits,
                decision_cache_misses=cache_stats.misses,
                policy_revision=self._policy.bundle_revision,
            )

    def close(self) -> None:
        """Cancel live sequences, zeroize the whole pool, flush and close the audit trail.

        Idempotent.
        """
        sweeper = self._sweeper
        if sweeper is not None:
            sweeper.stop()
        with self._lock:
            if self._closed:
                return
            try:
                for seq_id in list(self._seqs):
                    self._end(seq_id, cache=False, reason="closed")
                with self._zeroization_audited():
                    self._pool.close()
                self._drain()
            finally:
                self._closed = True
                try:
                    self._audit.close()
                finally:
                    self._policy.close()

    def __enter__(self) -> GovernedKVCache:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _check_open(self) -> None:
        if self._closed:
            raise PoolClosed()

    def _view(self, scope: CacheScope) -> _ScopeView:
        view = self._views.get(scope)
        if view is not None:
            return view
        if scope.classification not in self._classifications:
            raise InvalidScope(
                "classification",
                scope.classification,
                f"unknown to the policy; known: {sorted(self._classifications)}",
            )
        if len(self._views) >= _MAX_VIEWS:
            self._views.clear()
        view = _ScopeView(
            scope=scope,
            fields=scope.as_dict(),
            digest=scope_digest(scope),
            own_root=namespace_root("tenant", scope.tenant),
        )
        self._views[scope] = view
        return view

    def _group_root(self, group: str) -> NamespaceRoot:
        root = self._group_roots.get(group)
        if root is None:
            root = self._group_roots[group] = namespace_root("group", group)
        return root

    def _lookup(
        self,
        view: _ScopeView,
        packed: bytes,
        keys: list[CacheKey],
        max_hit: int,
        read_roots: tuple[bytes, ...],
        seq_id: str,
    ) -> list[int]:
        """Longest permitted hit over the publish namespace, the tenant's own and readable groups.

        Keys of namespaces other than the publish one are derived only here, so
        a scope without share groups pays for one chain. Takes a reference on
        the returned blocks only.
        """
        best = self._longest_hit(
            self._pool.lookup(keys[:max_hit]), read_roots, packed, view.digest, max_hit
        )
        self._drain()
        if best:
            best = self._check_sharing(view, best, seq_id)
        return best

    def _prefix_lookup(self, plan: _KeyPlan, packed: bytes, max_hit: int) -> list[int]:
        """Longest hit for an admission with a public prefix; takes a reference on it only.

        The prefix is looked up where the public scope publishes, then, if that
        misses part of it, in every other namespace the public scope may read
        (its tenant's own, its readable share groups); the rest of the prompt
        only in the scope's own namespace, chained from its own prefix keys.
        """
        best = self._pool.lookup(plan.keys[:max_hit])
        span = min(plan.prefix_blocks, max_hit)
        if len(best) >= span or plan.prefix_view is None:
            return best
        best = self._longest_hit(
            best, plan.prefix_read_roots, packed, plan.prefix_view.digest, span
        )
        if len(best) == span < max_hit:  # the whole prefix, found in another namespace
            best += self._pool.lookup(plan.keys[span:max_hit])
        return best

    def _longest_hit(
        self,
        best: list[int],
        roots: tuple[bytes, ...],
        packed: bytes,
        digest: ScopeDigest,
        count: int,
    ) -> list[int]:
        """The longest of ``best`` and the hits of the first ``count`` blocks in each root.

        Chains are derived root by root and only until a hit covers all ``count``
        blocks; every hit but the longest is given back, so a reference is held
        on the returned blocks only.
        """
        pool = self._pool
        for root in roots:
            if len(best) == count:
                break
            chain = self._deriver.derive_chain(root, packed, digest, self._block_size, count)
            found = pool.lookup(chain)
            if len(found) > len(best):
                best, found = found, best
            if found:
                pool.free(found)
        return best

    def _check_sharing(
        self,
        view: _ScopeView,
        hit_ids: list[int],
        seq_id: str,
        prefix_view: _ScopeView | None = None,
        prefix_blocks: int = 0,
    ) -> list[int]:
        """Cut the hit at the first block whose owner the sharing policy refuses; audit reuse.

        Blocks another tenant owns are used only if ``kvgov/sharing/decision``
        allows this requester and that owner; the requester is judged under the
        scope it asked for (the public prefix scope for prefix blocks).
        """
        requester = view.scope.tenant
        owner_of = self._owner
        cut = len(hit_ids)
        granted: dict[tuple[CacheScope, CacheScope], Any] = {}
        denied: tuple[CacheScope, Any] | None = None
        groups = _by_owner(owner_of, hit_ids)
        own = all(o is not None and o.tenant == requester for o, _ in groups)
        for i, b in enumerate(() if own else hit_ids):
            owner = owner_of[b]
            if owner is None:
                raise InternalError(f"cached block {b} has no owner")
            if owner.tenant == requester:
                continue
            asking = prefix_view if prefix_view is not None and i < prefix_blocks else view
            pair = (asking.scope, owner)
            if pair in granted:
                continue
            share = self._policy.sharing(asking.fields, self._view(owner).fields)
            if not share.allow:
                cut, denied = i, (owner, share)
                break
            granted[pair] = share.decision
        if cut < len(hit_ids):
            self._pool.free(hit_ids[cut:])
            self._drain()
            hit_ids = hit_ids[:cut]
            groups = _by_owner(owner_of, hit_ids)
        counters = self._counters[requester]
        if denied is not None:
            owner, share = denied
            counters.cross_tenant_denied += 1
            self._audit.record(
                AuditEvent(
                    type=EventType.SHARE_DENIED,
                    **{**self._view(owner).fields, "requester_tenant": requester},
                    sequence_id=seq_id,
                    decision_id=share.decision.decision_id,
                    policy_revision=share.decision.bundle_revision,
                    details={"reason": share.reason},
                )
            )
        bs = self._block_size
        for owner, ids in groups:
            if owner is None:  # pragma: no cover - excluded by the loop above
                continue
            fields = {**self._view(owner).fields, "requester_tenant": requester}
            if owner.tenant == requester:
                self._audit.record(
                    AuditEvent(
                        type=EventType.REUSE,
                        **fields,
                        sequence_id=seq_id,
                        block_ids=tuple(ids),
                        reused_tokens=len(ids) * bs,
                    )
                )
                continue
            counters.cross_tenant_reuses += 1
            decision = next(d for (_, o), d in granted.items() if o == owner)
            self._audit.record(
                AuditEvent(
                    type=EventType.CROSS_TENANT_REUSE,
                    **fields,
                    sequence_id=seq_id,
                    block_ids=tuple(ids),
                    reused_tokens=len(ids) * bs,
                    decision_id=decision.decision_id,
                    policy_revision=decision.bundle_revision,
                )
            )
        return hit_ids

    def _plan_keys(
        self, view: _ScopeView, packed: bytes, num_full: int, public_prefix_tokens: int
    ) -> _KeyPlan:
        """Decide the namespaces, retention and keys of a cacheable admission."""
        policy = self._policy
        root, read_roots = self._namespaces(view)
        ttl = float(policy.retention(view.fields).ttl_seconds)
        if ttl <= 0:
            return _KeyPlan(root, root)  # nothing may be kept: key nothing
        bs = self._block_size
        derive = self._deriver.derive_chain
        prefix_blocks = min(public_prefix_tokens // bs, num_full)
        if prefix_blocks:
            pview = self._view(replace(view.scope, classification=_PUBLIC))
            proot, prefix_read_roots = self._namespaces(pview)
            pttl = float(policy.retention(pview.fields).ttl_seconds)
            if pttl > 0:
                prefix_keys = derive(proot, packed, pview.digest, bs, prefix_blocks)
                rest_parent = continuation_root(root, prefix_keys[-1])
                rest = derive(
                    rest_parent,
                    packed,
                    view.digest,
                    bs,
                    num_full - prefix_blocks,
                    first=prefix_blocks,
                )
                return _KeyPlan(
                    root,
                    rest_parent,
                    read_roots,
                    prefix_keys + rest,
                    prefix_blocks,
                    pview,
                    pttl,
                    ttl,
                    prefix_read_roots,
                )
        keys = derive(root, packed, view.digest, bs, num_full)
        return _KeyPlan(root, root, read_roots, keys, ttl=ttl)

    def _namespaces(self, view: _ScopeView) -> tuple[bytes, tuple[bytes, ...]]:
        """Where a scope's blocks are keyed (its tenant's namespace, or the share group
        the policy lets it publish in) and the other namespaces it may find blocks in
        (its tenant's own and every group it may read), each once."""
        groups = self._policy.share_groups(view.fields)
        root = view.own_root if groups.publish is None else self._group_root(groups.publish)
        readable = (view.own_root, *(self._group_root(g) for g in groups.read))
        return root, tuple(dict.fromkeys(r for r in readable if r != root))

    def _end(self, seq_id: str, *, cache: bool, reason: str) -> bool:
        with self._lock:
            self._check_open()
            seq = self._seqs.pop(seq_id, None)
            if seq is None:
                return False
            keep = cache and seq.cacheable
            with self._zeroization_audited():
                # Tail blocks first, so they sit nearer the LRU end and go before the prefix.
                self._pool.free(seq.block_ids[::-1], cache=keep)
            self._drain()
            self._audit.record(
                AuditEvent(
                    type=EventType.RELEASE if reason == "released" else EventType.LIFECYCLE,
                    **seq.view.fields,
                    sequence_id=seq_id,
                    # the admission event lists the blocks admitted; this adds only
                    # those decode growth appended since, and the count of all
                    block_ids=tuple(seq.block_ids[seq.admitted_blocks :]),
                    token_count=seq.num_tokens,
                    decision_id=seq.decision_id,
                    details={"reason": reason, "cached": keep, "blocks": len(seq.block_ids)},
                )
            )
            return True

    def _revoke(self, block_ids: list[int], reason: str) -> tuple[list[int], list[int]]:
        if not block_ids:
            return [], []
        with self._zeroization_audited():
            revoked = self._pool.revoke(block_ids, reason)
        self._drain()
        return list(revoked.evicted), list(revoked.detached)

    def _read_back_zero(self, block_ids: Sequence[int]) -> bool:
        pool = self._pool
        return all(not bool(pool.block(b).any()) for b in block_ids)

    @contextmanager
    def _zeroization_audited(self) -> Iterator[None]:
        try:
            yield
        except ZeroizationError as exc:
            self._audit.record(
                AuditEvent(
                    type=EventType.ZEROIZATION_FAILURE,
                    block_ids=exc.block_ids,
                    details={"error": str(exc)},
                )
            )
            raise

    def _drain(self) -> None:
        """Turn the pool's events into audit events and counters (owner known until zeroized)."""
        events = self._pool.take_events()
        if not events:
            return
        owner = self._owner
        for event in events:
            if isinstance(event, BlocksEvicted):
                for scope, ids in _by_owner(owner, event.block_ids):
                    counters = self._counters[scope.tenant] if scope else self._unattributed
                    counters.evictions[event.reason] += len(ids)
                    self._audit.record(
                        AuditEvent(
                            type=EventType.EVICTION,
                            **(self._view(scope).fields if scope else {}),
                            block_ids=tuple(ids),
                            details={"reason": event.reason},
                        )
                    )
            elif isinstance(event, BlocksZeroized):
                per_block = event.nbytes // len(event.block_ids) if event.block_ids else 0
                # zeroized blocks are FREE now: their owner is read and cleared in one pass
                for scope, ids in _by_owner(owner, event.block_ids, clear=True):
                    counters = self._counters[scope.tenant] if scope else self._unattributed
                    counters.blocks_zeroized += len(ids)
                    counters.bytes_zeroized += per_block * len(ids)
                    self._audit.record(
                        AuditEvent(
                            type=EventType.ZEROIZATION,
                            tenant=scope.tenant if scope else None,
                            block_ids=tuple(ids),
                            details={
                                "bytes": per_block * len(ids),
                                "device": event.device,
                                "seconds": event.seconds,
                            },
                        )
                    )


_MAX_VIEWS = 65_536


def _by_owner(
    owner: list[CacheScope | None], block_ids: Sequence[int], *, clear: bool = False
) -> list[tuple[CacheScope | None, Sequence[int]]]:
    """Group block ids by owning scope, in first-seen order; ``clear`` forgets the owners.

    One owner for the whole batch is the rule (a request's blocks, a one-tenant
    cache): that case costs one C-level gather and one count, which compares by
    identity first. Otherwise blocks are grouped by object identity: every block
    of one admission holds the same scope object, and hashing a scope's nine
    fields per block would dominate the cost.
    """
    n = len(block_ids)
    if n == 0:
        return []
    first = owner[block_ids[0]]
    if n == 1 or itemgetter(*block_ids)(owner).count(first) == n:
        if clear:
            for b in block_ids:
                owner[b] = None
        return [(first, block_ids)]
    groups: dict[int, tuple[CacheScope | None, list[int]]] = {}
    last: object = groups  # a sentinel no owner can be
    current: list[int] = []
    for b in block_ids:
        scope = owner[b]
        if scope is not last:  # runs of one owner are the rule: one identity test per block
            group = groups.get(id(scope))
            if group is None:
                group = groups[id(scope)] = (scope, [])
            current, last = group[1], scope
        current.append(b)
        if clear:
            owner[b] = None
    return list(groups.values())


def _check_seq_id(seq_id: object) -> None:
    if not isinstance(seq_id, str) or not seq_id or len(seq_id) > 256:
        raise InvalidArgument("seq_id", seq_id, "a non-empty string of at most 256 characters")


def _denial_key(reason: str, error: str | None) -> str:
    return "policy_error" if error else (reason or "denied")


class _Sweeper(threading.Thread):
    """Daemon thread calling ``sweep`` every interval until stopped."""

    def __init__(self, cache: GovernedKVCache, interval: float) -> None:
        super().__init__(name="kvgov-retention-sweeper", daemon=True)
        self._cache = cache
        self._interval = interval
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self._interval):
            try:
                self._cache.sweep()
            except PoolClosed:
                return

    def stop(self) -> None:
        self._stop_event.set()
        if self is not threading.current_thread():
            self.join(timeout=5)
