"""The governed KV cache on kvgov's own block pool: the one object a serving stack embeds.

``GovernedKVCache`` is the native binding: a :class:`~kvgov.govern.governor.Governor`
on kvgov's :class:`~kvgov.allocator.BlockPool`, which it drives itself through the
:class:`~kvgov.govern.protocol.DrivenPool` protocol (prefix lookup with a
:class:`~kvgov.govern.hits.HitFinder`, allocation, keying, release), plus the
block tables of the requests it serves and the retention and erasure methods
an operator calls (sweep, the sweeper, purge, invalidation, secret rotation).
See docs/architecture.md for the picture.

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
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

import torch

from kvgov import defaults
from kvgov.allocator import BlockPool, KVSpec, resolve_device
from kvgov.audit import AuditLog, Deferred, EventType
from kvgov.exceptions import (
    DuplicateSequence,
    InvalidArgument,
    PolicyDenied,
    UnknownSequence,
)
from kvgov.policy import PolicyClient

from .assemble import open_parts
from .erasure import SCOPE_FILTERS, zeroization_audited
from .governor import Governor
from .hits import HitFinder
from .keys import KeyDeriver, pack_tokens
from .logs import get_logger
from .offload_config import OffloadConfig
from .offloading import Offloading
from .plan import KeyPlan
from .results import Admission, ErasureReport, InvalidationReport, ReconcileReport, RotationReport
from .scope import CacheScope
from .sequence import NativeSequence, check_admission, check_live_ids, check_seq_id
from .stats import CacheStats
from .sweeper import Sweeper, check_interval

__all__ = ["GovernedKVCache"]

_log = get_logger()


class GovernedKVCache:
    """A paged KV cache where every reuse is scoped, policy-decided and audited.

    The governance (and its invariants) is the :class:`~kvgov.govern.governor.Governor`'s;
    this class adds kvgov's own block pool (see :class:`kvgov.allocator.BlockPool`),
    which it drives (lookup, allocate, key, free), the block tables of live
    sequences, and the retention and erasure methods (``sweep``,
    ``start_sweeper``, ``purge_tenant``, ``invalidate``, ``rotate_secret``), which
    hand the governor its running sequences.

    Thread safety: every public method takes the governor's re-entrant lock.

    Build one with :meth:`create`; the constructor takes ready parts (for
    tests and experts).

    Args:
        pool: the block pool.
        policy: the policy client (decision cache inside).
        audit: the audit log.
        deriver: the key deriver holding the secret.
        clock: seconds since the epoch; retention and audit times read it.
        offload: encrypted offload tiers, attached here to the governor and the pool;
            None for none (no offload work at all).
    """

    def __init__(
        self,
        *,
        pool: BlockPool,
        policy: PolicyClient,
        audit: AuditLog,
        deriver: KeyDeriver,
        clock: Callable[[], float] = time.time,
        offload: Offloading | None = None,
    ) -> None:
        self._pool = pool
        self._gov = Governor(
            pool=pool,
            policy=policy,
            audit=audit,
            deriver=deriver,
            block_size=pool.spec.block_size,
            clock=clock,
        )
        gov = self._gov
        gov.sync_eviction()
        if offload is not None:
            offload.attach(gov.ledger, policy, audit, pool, pool.spec.block_size)
            gov.offload = offload
        self._hits = HitFinder(pool, gov.ledger, policy, audit, pool.spec.block_size, gov.drain)
        self._block_size = pool.spec.block_size
        self._seqs: dict[str, NativeSequence] = {}
        self._orphans_recovered = 0
        self._sweeper: Sweeper | None = None
        self._boundary_hooks: list[Callable[[], None]] = []

    def add_boundary_hook(self, hook: Callable[[], None]) -> None:
        """Call ``hook`` at every admission's start, before the admission's own work.

        That is a boundary between the embedding process's steps: a fleet agent
        (:class:`kvgov.govern.fleet.FleetAgent`) runs the orders it has received there.
        The hook runs on the admitting thread and must not wait on a database.

        Args:
            hook: a callable taking nothing.
        """
        self._boundary_hooks.append(hook)

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
        offload: OffloadConfig | None = None,
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
            offload: encrypted offload tiers (host memory, disk, Redis) that keep
                capacity-evicted blocks for later admissions: see
                :class:`~kvgov.govern.OffloadConfig` and docs/offload.md. None: none.

        Returns:
            The cache; use it as a context manager or call :meth:`close`.

        Raises:
            KeySecretError: no usable secret.
            PolicyLoadError: the policy bundle does not load or its tests fail.
            AuditSchemaError: the audit database needs ``kvgov db upgrade``.
            InvalidSpec: nonsense sizes, or a device this machine does not have
                (``device="cuda"`` without CUDA: "CUDA is not available"), refused
                before the audit log, policy or offload tiers are opened.
            KEKError: ``offload`` is given without a usable key-encryption key.
            InvalidArgument: a bad ``offload`` configuration (a tier URL, say).
        """
        resolve_device(device)  # a device this machine lacks: refused before anything opens
        parts = open_parts(
            policy_dir=policy_dir,
            policy_data=policy_data,
            audit_url=audit_url,
            key_secret=key_secret,
            ephemeral_secret=ephemeral_secret,
            clock=clock,
            worker_id=worker_id,
            policy_engine=policy_engine,
            offload=offload,
        )
        try:
            pool = BlockPool(spec, num_blocks, device, verify=verify_zeroization, clock=clock)
        except BaseException:
            parts.close()
            raise
        return cls(
            pool=pool,
            policy=parts.policy,
            audit=parts.audit,
            deriver=parts.deriver,
            clock=clock,
            offload=parts.offload,
        )

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
        return self._gov.policy

    def reload_policy(
        self,
        policy_dir: str | os.PathLike[str] | None = None,
        policy_data: Mapping[str, Any] | None = None,
    ) -> str:
        """Reload the in-process policy bundle, then apply its eviction settings
        (floors, caps, priority durations) to this pool.

        Args:
            policy_dir: new bundle directory; None keeps the current one.
            policy_data: new data over data.json; None keeps the current data.

        Returns:
            The new revision.

        Raises:
            PolicyLoadError: the new bundle does not load (the old one stays active).
            PolicyError: the engine cannot reload here (an OPA server reloads itself;
                its new settings apply at the next admission).
            InvalidQuota: the new bundle's floors and caps are malformed or its floors
                add up to more than this pool; the bundle is active but the quotas
                in force stay the previous ones (fix the data and reload again).
        """
        revision = self._gov.policy.reload(
            None if policy_dir is None else Path(policy_dir), policy_data
        )
        self._gov.sync_eviction()
        return revision

    @property
    def audit(self) -> AuditLog:
        """The audit log this cache writes to."""
        return self._gov.audit

    @property
    def pool(self) -> BlockPool:
        """The underlying block pool (for experts; state changes belong to this cache)."""
        return self._pool

    @property
    def governor(self) -> Governor:
        """The governor (for experts and bindings; its steps assume its lock is held)."""
        return self._gov

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
            The block table and how many leading tokens are already cached: found
            on the device, or restored from an offload tier into new blocks.

        Raises:
            InvalidArgument: bad seq_id or priority.
            InvalidScope: the classification is unknown to the policy.
            InvalidTokens: token ids are not non-negative ints below 2**32.
            TenantPurging: the tenant is being erased.
            DuplicateSequence: ``seq_id`` is live.
            PolicyDenied: the admission policy refused (audited).
            OutOfBlocks: not enough free or evictable blocks (nothing changed).
            AuditUnavailable: the audit trail cannot be written.

        All or nothing: if any step after the prefix lookup raises, every block
        reference the admission took is given back (new blocks zeroized, hit
        blocks cached again) and no sequence is registered.
        """
        for hook in self._boundary_hooks:
            hook()
        start = time.perf_counter()
        latency = self._gov.admission_latency
        try:
            admission = self._admit(seq_id, scope, token_ids, priority, public_prefix_tokens)
        except PolicyDenied:
            latency["denied"].observe(time.perf_counter() - start)
            raise
        except BaseException:
            latency["error"].observe(time.perf_counter() - start)
            raise
        latency["admitted"].observe(time.perf_counter() - start)
        return admission

    def _admit(
        self,
        seq_id: str,
        scope: CacheScope,
        token_ids: Sequence[int],
        priority: int | None,
        public_prefix_tokens: int,
    ) -> Admission:
        """:meth:`admit`, untimed."""
        packed = check_admission(seq_id, scope, token_ids, priority, public_prefix_tokens)
        gov = self._gov
        gov.check_not_purging(scope.tenant)
        gov.check_open()
        if seq_id in self._seqs:
            raise DuplicateSequence(seq_id)
        # Decide and derive the keys before taking the lock: hashing a long prompt
        # must not stall every other tenant's admissions.
        view = gov.admission_view(scope, seq_id, len(packed) // 4)
        adm = gov.decide(view, seq_id, len(packed) // 4, priority)
        deriver = gov.deriver
        plan = gov.plan(view, packed, bool(adm.cache), public_prefix_tokens)
        with gov.lock:
            gov.check_open()
            if seq_id in self._seqs:
                raise DuplicateSequence(seq_id)
            if gov.deriver is not deriver:  # the secret was rotated meanwhile: key anew
                plan = gov.plan(view, packed, bool(adm.cache), public_prefix_tokens)
            deferred: list[Deferred] = []
            hit_ids = self._hits.find_hits(gov.deriver, view, plan, packed, seq_id, deferred)
            block_ids = self._allocate_rest(hit_ids, plan.num_blocks, scope.tenant)
            cached_tokens = len(hit_ids) * self._block_size
            try:
                if gov.offload is not None:  # what the device missed, from the tiers
                    restored = gov.offload.restore(
                        view, plan, block_ids, len(hit_ids), seq_id, deferred
                    )
                    cached_tokens += restored * self._block_size
                self._key_admitted(scope, block_ids, len(hit_ids), plan, adm.priority)
                gov.record_admission(
                    view,
                    seq_id,
                    block_ids,
                    adm,
                    num_tokens=plan.num_tokens,
                    cacheable=plan.cacheable,
                    ttl=plan.ttl,
                    requested_priority=priority,
                    cached_tokens=cached_tokens,
                )
            except BaseException:
                self._give_back(block_ids, len(hit_ids))
                raise
            decision_id = adm.decision.decision_id
            self._seqs[seq_id] = NativeSequence(
                seq_id, view, block_ids, plan, packed, self._block_size, adm.priority, decision_id
            )
        self._settle(seq_id, len(hit_ids), deferred)
        _log.debug(
            "admitted",
            tenant=scope.tenant,
            seq_id=seq_id,
            blocks=len(block_ids),
            cached_tokens=cached_tokens,
            decision_id=decision_id,
        )
        return Admission(
            seq_id=seq_id,
            block_ids=tuple(block_ids),
            cached_tokens=cached_tokens,
            decision_id=decision_id,
            cacheable=plan.cacheable,
            priority=adm.priority,
        )

    def _key_blocks(
        self,
        block_ids: Sequence[int],
        keys: Sequence[bytes],
        priority: int,
        ttl: float | None,
        tenant: str,
    ) -> None:
        """Key OWNED blocks (a duplicate key leaves its block unkeyed) and note their
        retention; they count against ``tenant``'s quota, and their priority lasts the
        tenant's priority duration."""
        indexed = self._pool.set_keys(
            block_ids,
            keys,
            priority=priority,
            duration=self._gov.ledger.eviction.durations.get(tenant),
            group=tenant,
        )
        deadlines = self._gov.ledger.deadlines
        if indexed.count(True) == len(indexed):
            deadlines.keyed(block_ids, ttl)
        else:
            deadlines.keyed([b for b, ok in zip(block_ids, indexed, strict=True) if ok], ttl)

    def _key_admitted(
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
        owners = self._gov.ledger.owners
        if first_new >= prefix or plan.prefix_view is None:
            owners.assign(new_ids, scope)
        else:
            owners.assign(block_ids[first_new:prefix], plan.prefix_view.scope)
            owners.assign(block_ids[prefix:], scope)
        if not plan.cacheable:
            return
        if first_new < prefix:
            self._key_blocks(
                block_ids[first_new:prefix],
                plan.keys[first_new:prefix],
                priority,
                plan.prefix_ttl,
                plan.prefix_view.scope.tenant if plan.prefix_view else scope.tenant,
            )
        start = max(first_new, prefix)
        if plan.num_full > start:
            self._key_blocks(
                block_ids[start : plan.num_full],
                plan.keys[start : plan.num_full],
                priority,
                plan.ttl,
                scope.tenant,
            )

    def _allocate_rest(self, hit_ids: list[int], num_blocks: int, tenant: str) -> list[int]:
        """The block table: the hits, then new blocks (for ``tenant``'s quota); on any
        failure the hits go back."""
        try:
            new_ids = self._pool.allocate(num_blocks - len(hit_ids), group=tenant)
        except BaseException:
            self._give_back(hit_ids, len(hit_ids))
            raise
        self._gov.drain()
        return hit_ids + new_ids

    def _give_back(self, block_ids: list[int], num_hits: int) -> None:
        """Undo an admission's references: new blocks are zeroized, hit blocks cached again."""
        try:
            if block_ids[num_hits:]:
                self._pool.free(block_ids[num_hits:][::-1], cache=False)
            if num_hits:
                self._pool.free(block_ids[:num_hits][::-1])
        finally:
            self._gov.drain()

    def _settle(self, seq_id: str, num_hits: int, deferred: list[Deferred]) -> None:
        """Wait, outside the lock, for the admission's critical events to be durable.

        If one cannot be written anywhere, the admission is undone (as if it had
        failed before it was registered) and the error raised: no reuse unaudited.
        """
        try:
            for pending in deferred:
                pending.wait()
        except BaseException:
            with self._gov.lock:
                seq = self._seqs.pop(seq_id, None)
                if seq is not None:
                    self._give_back(seq.block_ids, num_hits)
            raise

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
        check_seq_id(seq_id)
        packed = pack_tokens(token_ids)
        gov = self._gov
        with gov.lock:
            gov.check_open()
            seq = self._seqs.get(seq_id)
            if seq is None:
                raise UnknownSequence(seq_id)
            if not packed:
                return []
            bs = self._block_size
            total = seq.num_tokens + len(packed) // 4
            needed = -(-total // bs) - len(seq.block_ids)
            new_ids = self._pool.allocate(needed, group=seq.view.scope.tenant) if needed > 0 else []
            gov.drain()
            gov.ledger.owners.assign(new_ids, seq.view.scope)
            seq.block_ids.extend(new_ids)
            tail = seq.tail + packed
            first_full = seq.num_tokens // bs
            completed = total // bs - first_full
            if completed > 0 and seq.cacheable:
                keys = gov.deriver.derive_chain(seq.parent, tail, seq.view.digest, bs, completed)
                self._key_blocks(
                    seq.block_ids[first_full : first_full + completed],
                    keys,
                    seq.priority,
                    seq.ttl,
                    seq.view.scope.tenant,
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
        return self._end(check_seq_id(seq_id), cache=True, reason="released")

    def cancel(self, seq_id: str) -> bool:
        """Release a sequence without caching anything of it (its blocks are zeroized). Idempotent.

        Args:
            seq_id: the sequence.

        Returns:
            True if it was live and is now cancelled, False if it was not live.
        """
        return self._end(check_seq_id(seq_id), cache=False, reason="cancelled")

    def reconcile(self, live_seq_ids: Iterable[str]) -> ReconcileReport:
        """Release every live sequence the caller no longer knows (crashed scheduler, lost work).

        Orphans are released without caching: their KV may be half written.

        Args:
            live_seq_ids: the sequences the caller still runs.

        Returns:
            The orphans released and how many block references they held.
        """
        keep = check_live_ids(live_seq_ids)
        with self._gov.lock:
            self._gov.check_open()
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

        Offload tiers are swept too: objects past their deadline are deleted. The
        sweep's audit event says ``verified`` when every expired block is FREE and
        reads back as zero bytes.

        Returns:
            How many device blocks expired.
        """
        return self._gov.sweep()

    def start_sweeper(self, interval: float) -> None:
        """Run :meth:`sweep` every ``interval`` seconds on a daemon thread until :meth:`close`.

        Args:
            interval: seconds between sweeps (> 0).

        Raises:
            InvalidArgument: interval not a finite number of at least 0.01 seconds
                (``defaults.MIN_SWEEP_INTERVAL``), or a sweeper already runs.
        """
        interval = check_interval(interval)
        with self._gov.lock:
            self._gov.check_open()
            if self._sweeper is not None:
                raise InvalidArgument("interval", interval, "a sweeper already runs")
            self._sweeper = Sweeper(self, interval)
            self._sweeper.start()

    def purge_tenant(self, tenant: str, *, order_id: str | None = None) -> ErasureReport:
        """Erase a tenant from the cache (right to be forgotten).

        Every cached block the tenant wrote (including blocks it published to share groups)
        is evicted and zeroized now and read back to check it is zero; blocks still held by
        running sequences (the tenant's own, or another tenant's that reuses its public
        blocks) cannot be freed: they become unreachable by key and are zeroized when their
        last holder releases them; the tenant's running sequences will cache nothing. New
        admissions for the tenant are refused while this runs. With offload tiers, the
        tenant is crypto-shredded: its data key is destroyed first (every copy in every tier
        is unreadable from then on), then its objects are deleted; the report and the
        erasure event name the destroyed key ids and the deletions per tier. The erasure
        event is durable before this returns, written after the cache lock is released.

        Args:
            tenant: the tenant.
            order_id: the fleet order this purge executes (the event's ``details.order_id``).

        Returns:
            The erasure evidence: ``verified`` only when every block the tenant
            wrote, keyed or not, is FREE now and reads back as zero bytes;
            otherwise ``held_blocks`` says how many are still held by running
            sequences (the erasure event says the same): end or cancel those
            sequences and purge again for a verified report; ``evidence``
            ``"stored"`` or ``"spooled"`` (the audit database did not answer in
            time; the event is replayed into it later).

        Raises:
            InvalidScope: tenant is not a valid identifier.
            KeyStoreUnavailable: the tenant's offload data key could not be
                destroyed (the device blocks are zeroized, the attempt is audited);
                call it again once the key store is back.
            AuditUnavailable: the erasure could not be audited (the blocks are
                zeroized all the same).
        """
        return self._gov.purge_tenant(tenant, self._seqs.values(), order_id=order_id)

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
        order_id: str | None = None,
    ) -> InvalidationReport:
        """Drop every block keyed under a scope matching all the given fields.

        Run it after a weight, adapter, tokenizer or template update. Fields left
        None match anything; at least one must be given. Offload tiers lose the
        objects of every matching scope this worker knows (see docs/offload.md).
        ``order_id`` names the fleet order it executes (the event's ``details.order_id``).

        Returns:
            What was dropped; ``verified`` when every block of a matching scope is
            FREE and reads back as zero bytes, else ``held_blocks`` of them are
            still held by running sequences (zeroized at their release).

        Raises:
            InvalidArgument: no field given, or a value that is not a non-empty string.
        """
        given = (
            model,
            model_revision,
            adapter,
            adapter_revision,
            tokenizer,
            tokenizer_revision,
            template_version,
        )
        wanted = {k: v for k, v in zip(SCOPE_FILTERS, given, strict=True) if v is not None}
        return self._gov.invalidate(wanted, self._seqs.values(), order_id=order_id)

    def rotate_secret(self, new_secret: bytes) -> int:
        """Switch to a new cache-key secret; every old key becomes unreachable.

        Cached blocks keyed with the old secret are evicted and zeroized; blocks
        of running sequences are unindexed and zeroized at release, and those
        sequences cache nothing more (their chains were derived with the old secret).
        Every object of the offload tiers is deleted.

        Args:
            new_secret: at least 32 bytes.

        Returns:
            Blocks evicted and zeroized now (the rotation's audit event names the
            blocks still held, ``held_blocks``, and whether the rest read back zero,
            ``verified``).

        Raises:
            KeySecretError: the new secret is too short (nothing changed).
        """
        return self._gov.rotate_secret(new_secret, self._seqs.values())

    def rotate_secret_report(
        self, new_secret: bytes, *, order_id: str | None = None
    ) -> RotationReport:
        """:meth:`rotate_secret`, with the report of its audit event.

        Args:
            new_secret: at least 32 bytes.
            order_id: the fleet order this rotation executes (``details.order_id``).

        Raises:
            KeySecretError: the new secret is too short (nothing changed).
        """
        return self._gov.rotate_secret_report(new_secret, self._seqs.values(), order_id=order_id)

    # ------------------------------------------------------------------ observation and life

    def stats(self) -> CacheStats:
        """A consistent snapshot of every counter, per tenant and in total.

        Returns:
            The counters, and blocks by state.
        """
        with self._gov.lock:
            return self._gov.stats(
                live_sequences=len(self._seqs), orphans_recovered=self._orphans_recovered
            )

    def close(self) -> None:
        """Cancel live sequences, zeroize the whole pool, flush and close the audit trail.

        Idempotent.
        """
        sweeper = self._sweeper
        if sweeper is not None:
            sweeper.stop()
        gov = self._gov
        with gov.lock:
            if gov.closed:
                return
            try:
                for seq_id in list(self._seqs):
                    self._end(seq_id, cache=False, reason="closed")
                with zeroization_audited(gov.audit):
                    self._pool.close()
                gov.drain()
            finally:
                gov.close()

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

    def _end(self, seq_id: str, *, cache: bool, reason: str) -> bool:
        gov = self._gov
        with gov.lock:
            gov.check_open()
            seq = self._seqs.pop(seq_id, None)
            if seq is None:
                return False
            keep = cache and seq.cacheable
            with zeroization_audited(gov.audit):
                # Tail blocks first, so they sit nearer the LRU end and go before the prefix.
                self._pool.free(seq.block_ids[::-1], cache=keep)
            gov.drain()
            gov.record_end(
                seq.view,
                seq_id,
                EventType.RELEASE if reason == "released" else EventType.LIFECYCLE,
                # the admission event lists the blocks admitted; this adds only
                # those decode growth appended since, and the count of all
                appended=seq.block_ids[seq.admitted_blocks :],
                num_tokens=seq.num_tokens,
                decision_id=seq.decision_id,
                details={"reason": reason, "cached": keep, "blocks": len(seq.block_ids)},
            )
            return True

    def _check_invariants(self) -> None:
        """Check the pool's and the governor's invariants (tests call this).

        Raises:
            InternalError: an invariant does not hold (a bug in kvgov).
        """
        with self._gov.lock:
            self._pool._check_invariants()
            self._gov._check_invariants()
