"""vLLM's block pool, governed: :class:`GovernedBlockPool` and :class:`VllmPoolAdapter`.

vLLM's scheduler allocates, looks up, caches and frees blocks in its own
``BlockPool``; the KV bytes live in the workers' tensors. The binding changes
none of that. :class:`GovernedBlockPool` is vLLM's pool with a post-pass on
the methods where a block changes hands, which

* orders every block that leaves an owner zeroed: freed without a hash (its KV
  is intact at the front of vLLM's free queue, the next block vLLM hands out),
  evicted for capacity (vLLM evicts lazily as it hands a cached block out),
  evicted on request (purge, invalidation, expiry, a KV connector), reset. The
  ids go out with the next step's ``SchedulerOutput.new_block_ids_to_zero``;
  the worker zeroes them before that step's forward pass, so before any new
  owner writes them or anyone reads them. One exception, as in vLLM: a block
  handed in the same step to an *asynchronous* KV-connector load is left out of
  that step (the zeroing would race the load, which overwrites it); its new
  owner holds it, and it is zeroed when it leaves that owner (``kvgov_defer_zero``);
* reports what the governor needs as kvgov's allocator events: blocks cached
  (``BlocksCached``: their retention starts), evicted (``BlocksEvicted``) and
  ordered zeroed (``BlocksZeroized``, state ``"ordered"``). Allocations and hits
  are not reported: the binding sees them where vLLM commits them (the manager's
  ``allocate_slots``), with the request they belong to.

:class:`VllmPoolAdapter` is the same pool seen through the governor's
:class:`~kvgov.govern.protocol.ObservedPool` protocol. States, as the governor
sees them (``ref`` is vLLM's reference count, ``hash`` its prefix-cache hash)::

    OWNED   ref > 0                     (with or without a hash)
    CACHED  ref == 0, hash              (findable, evictable)
    FREE    ref == 0, no hash           (its zeroing is ordered, if it ever held KV)
    DIRTY   never: a block is ordered zeroed in the same call that takes it from its
            owner, and no one can write or read it before the worker zeroes it

Block 0 is vLLM's null block (a placeholder never handed out); it counts as FREE.

The pool is adopted in place (``adopt``): the coordinator, the managers and
every ``KVCacheBlock.pool`` already point at vLLM's object, so re-classing it
changes no reference and patches no module. Its free queue is adopted the same
way when an eviction policy needs it (:class:`~.free_queue.GovernedFreeQueue`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from vllm.v1.core.block_pool import BlockPool
from vllm.v1.core.kv_cache_utils import KVCacheBlock, get_block_hash

from kvgov.allocator import (
    BlocksCached,
    BlocksEvicted,
    BlockState,
    BlocksZeroized,
    PoolCounts,
    PoolEvent,
    Quota,
    Revoked,
)
from kvgov.allocator.quota import check_quotas
from kvgov.exceptions import InvalidSpec, UnknownBlock, UnsupportedEngine

from . import fence
from .fence import block_hash
from .free_queue import GovernedFreeQueue

__all__ = ["GovernedBlockPool", "KeyedHook", "MovedHook", "VllmPoolAdapter"]

#: Called with (request, block ids, the first one's position) when vLLM caches a
#: request's full blocks.
KeyedHook = Callable[[Any, list[int], int], None]
#: Called with (source id, destination id) when vLLM moves a cached entry (copy-on-write).
MovedHook = Callable[[int, int], None]


class GovernedBlockPool(BlockPool):
    """vLLM's ``BlockPool`` plus zeroing orders and kvgov's pool events.

    Behaviour is vLLM's, but for two things: a request the binding marked not
    cacheable caches nothing, and once the policy sets a priority other than the
    default or a quota, the free queue takes cached blocks in the policy's order
    (:meth:`kvgov_queue`, :mod:`.free_queue`). Without a binding attached (vLLM's
    own pool tests build it directly) it is a pure observer.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.kvgov_init()

    def kvgov_init(self) -> None:
        """Set kvgov's fields on the pool (a built pool, or one just adopted)."""
        # Ids ordered zeroed, not yet handed to a step, and who owned each when it was
        # ordered (the binding's owner table, read then); only this pool appends, the
        # binding takes them (take_zero_orders).
        self.kvgov_zero: list[int] = []
        self.kvgov_zero_owners: list[Any] = []
        # Orders taken back before a step carried them (kvgov_defer_zero): per block id, the
        # owners whose zeroing now waits for the block's next order (its next release).
        self.kvgov_deferred: dict[int, list[Any]] = {}
        # The governor's block -> owner table (None without a binding); read, never written.
        self.kvgov_owner_table: list[Any] | None = None
        # kvgov events since the adapter last took them, oldest first.
        self.kvgov_events: list[PoolEvent] = []
        # Where in kvgov_events the pending report of freed blocks is (_kvgov_order_zero).
        self.kvgov_open_free: int | None = None
        # The binding's hook for newly cached blocks (their retention); None: none.
        self.kvgov_keyed: KeyedHook | None = None
        # The binding's hook for a cached entry moved to another block (copy-on-write):
        # (source id, destination id); None: none.
        self.kvgov_moved: MovedHook | None = None
        # Bytes one block holds in the workers, and where (for zeroization events).
        self.kvgov_bytes_per_block = 0
        self.kvgov_device = "vllm-worker"
        # The free queue in the policy's order, once a policy needs one (kvgov_queue).
        self.kvgov_governed: GovernedFreeQueue | None = None
        # The binding's clock (priority durations).
        self.kvgov_now: Callable[[], float] = time.time

    @classmethod
    def adopt(cls, pool: BlockPool) -> GovernedBlockPool:
        """Turn the pool vLLM built into a governed one, in place (see the module docstring)."""
        if isinstance(pool, cls):
            return pool
        governed = fence.reclass(pool, cls)
        governed.kvgov_init()
        return governed

    def kvgov_queue(self) -> GovernedFreeQueue:
        """The free queue in the policy's eviction order: vLLM's, re-classed on first need
        (a priority other than the default, or quotas); see :mod:`.free_queue`."""
        queue = self.kvgov_governed
        if queue is None:
            queue = self.kvgov_governed = GovernedFreeQueue.adopt(self)
        return queue

    def kvgov_set_quotas(self, quotas: Mapping[str, Quota]) -> None:
        """Apply validated per-tenant floors and caps (empty: none); a tenant over its new
        cap loses its excess now (reason ``cap``)."""
        if not quotas and self.kvgov_governed is None:
            return
        self.kvgov_queue().kvgov_set_quotas(quotas)

    def take_zero_orders(self) -> tuple[list[int], list[tuple[int, Any]]]:
        """The block ids ordered zeroed since the last call, and whose zeroing each carries.

        Returns:
            The ids, each once (for the next step's output), and the (id, owner) pairs
            the step's zeroing completes: per id the owner it had when it was ordered
            (None without a binding), plus the owners of orders deferred on it earlier
            (:meth:`kvgov_defer_zero`).
        """
        ids, owners = self.kvgov_zero, self.kvgov_zero_owners
        self.kvgov_zero, self.kvgov_zero_owners = [], []
        if len(set(ids)) < len(ids):  # ordered twice before a step carried it: once is enough
            first: dict[int, Any] = {}
            for i, owner in zip(ids, owners, strict=True):
                first.setdefault(i, owner)
            ids, owners = list(first), list(first.values())
        pairs = list(zip(ids, owners, strict=True))
        deferred = self.kvgov_deferred
        if deferred:
            for i in ids:
                earlier = deferred.pop(i, None)
                if earlier is not None:
                    pairs.extend((i, owner) for owner in earlier)
        return ids, pairs

    def kvgov_defer_zero(self, block_ids: Iterable[int]) -> list[int]:
        """Take back the pending zero orders of ``block_ids``: an async KV load fills them.

        vLLM leaves out of a step's zeroing the blocks an asynchronous KV-connector
        load writes (the host-submitted read would race the zeroing). A block that
        left its owner and was handed to such a load in the same step is therefore
        not zeroed by that step: the load overwrites it, and its new owner holds it
        until it leaves again, when it is ordered zeroed like any block that leaves
        an owner (no one else can get it before). The owners whose orders are taken
        back are kept, so that next order's step completes their zeroing too.

        Returns:
            The ids whose orders were taken back (those not pending are left).
        """
        want = set(block_ids)
        if not want or not self.kvgov_zero:
            return []
        keep_ids: list[int] = []
        keep_owners: list[Any] = []
        taken: list[int] = []
        for i, owner in zip(self.kvgov_zero, self.kvgov_zero_owners, strict=True):
            if i in want:
                self.kvgov_deferred.setdefault(i, []).append(owner)
                taken.append(i)
            else:
                keep_ids.append(i)
                keep_owners.append(owner)
        if taken:
            self.kvgov_zero, self.kvgov_zero_owners = keep_ids, keep_owners
        return list(dict.fromkeys(taken))

    # ------------------------------------------------------------------ post-passes

    def get_new_blocks(self, num_blocks: int) -> list[KVCacheBlock]:
        # With caching on vLLM evicts lazily here: it hands out the first n blocks of
        # its free queue, dropping the hash of those that still have one. Peek at them
        # first (one walk, cheaper than wrapping the per-block eviction call). A governed
        # queue chooses and reports them itself, with their reasons.
        if (
            self.enable_caching
            and self.kvgov_governed is None
            and 0 < num_blocks <= self.free_block_queue.num_free_blocks
        ):
            evicted = fence.hashed_ahead(
                self.free_block_queue, num_blocks, self.cached_block_hashes_by_block
            )
            if evicted:
                self.kvgov_evicted(evicted, "capacity")
        blocks: list[KVCacheBlock] = super().get_new_blocks(num_blocks)
        return blocks

    def cache_full_blocks(
        self,
        request: Any,
        blocks: list[KVCacheBlock],
        num_cached_blocks: int,
        num_full_blocks: int,
        *args: Any,
        **kwargs: Any,
    ) -> None:
        state = fence.governance_of(request)
        if state is not None and not state.cacheable:
            return  # purged, invalidated or rotated while running: keep nothing more
        super().cache_full_blocks(
            request, blocks, num_cached_blocks, num_full_blocks, *args, **kwargs
        )
        if num_full_blocks > num_cached_blocks:
            ids = fence.hashed_block_ids(blocks[num_cached_blocks:num_full_blocks])
            if ids and self.kvgov_keyed is not None:
                self.kvgov_keyed(request, ids, num_cached_blocks)

    def free_blocks(self, ordered_blocks: Iterable[KVCacheBlock]) -> None:
        blocks = ordered_blocks if isinstance(ordered_blocks, list) else list(ordered_blocks)
        super().free_blocks(blocks)
        # still owned, the placeholder, or another pool's (it reports its own): left out
        cached, freed = fence.split_freed(blocks, self)
        if cached:
            self.kvgov_events.append(BlocksCached(tuple(cached)))
        if freed:
            self._kvgov_order_zero(freed, merge=True)
        queue = self.kvgov_governed
        if queue is not None and queue.kvgov_over:  # a tenant went over its cap
            queue.kvgov_trim()

    def evict_blocks(self, block_ids: set[int]) -> None:
        """vLLM's public eviction (KV connectors); kvgov's own goes through :meth:`kvgov_evict`."""
        self.kvgov_evict(block_ids, "engine")

    def reset_prefix_cache(self) -> bool:
        hashed = [b for b in self.blocks if block_hash(b) is not None and not b.is_null]
        keys = [block_hash(b) for b in hashed]
        if not super().reset_prefix_cache():
            return False
        if hashed:
            ids = [b.block_id for b in hashed]
            self.kvgov_events.append(
                BlocksEvicted(tuple(ids), tuple(get_block_hash(k) for k in keys), "reset")
            )
            self._kvgov_order_zero(ids)
        if self.kvgov_governed is not None:
            self.kvgov_governed.kvgov_flatten()
        return True

    # Paths the governed configurations never take (the scheduler refuses the configs
    # that would): under a binding they refuse rather than run ungoverned; a bare pool
    # (vLLM's own pool tests) keeps vLLM's behaviour.

    def unpin_blocks(self, *args: Any, **kwargs: Any) -> None:
        self._kvgov_refuse("HiSparse pinned blocks", "run without HiSparse")
        super().unpin_blocks(*args, **kwargs)

    def cache_partial_block(
        self,
        request: Any,
        block: KVCacheBlock,
        num_tokens: int,
        kv_cache_group_id: int,
        block_size: int,
        *args: Any,
        **kwargs: Any,
    ) -> Any:
        """vLLM's partial entry (Mamba "align" mode keys a state block at a prompt or
        checkpoint boundary with it); governed where the entry is a whole block's key.

        With the hash block size equal to the block size (the only configuration the
        governed scheduler starts), the entry is the request's block hash at a block
        boundary: a key in the request's scope, on a block the request holds, given the
        request's retention like :meth:`cache_full_blocks`. A request marked not
        cacheable keys nothing (a re-keyed checkpoint block loses its old keys: its
        bytes are about to change).

        Raises:
            UnsupportedEngine: under a binding, a hash block size below the block size
                (a real partial-block entry).
        """
        if block_size != self.hash_block_size:
            self._kvgov_refuse(
                "partial-block prefix caching (a hash block size below the block size)",
                "use one KV cache group whose block size is the hash block size",
            )
        state = fence.governance_of(request)
        if state is not None and not state.cacheable:
            replace = args[0] if args else kwargs.get("replace_existing_hashes", False)
            if replace and not block.is_null:
                fence.evict_cached_block(self, block)
            return None
        key = super().cache_partial_block(
            request, block, num_tokens, kv_cache_group_id, block_size, *args, **kwargs
        )
        if key is not None and self.kvgov_keyed is not None and not block.is_null:
            # its position: the full blocks before it (past any public prefix)
            self.kvgov_keyed(request, [block.block_id], num_tokens // block_size)
        return key

    def move_block_hashes(self, src_block: KVCacheBlock, dst_block: KVCacheBlock) -> None:
        """vLLM's copy-on-write of a cached entry: ``src_block``'s hashes move to
        ``dst_block``, which the worker fills with a copy of ``src_block`` this step.

        The owner, retention and eviction order move with the hashes (the binding's
        ``kvgov_moved`` hook): ``dst_block`` holds ``src_block``'s owner's bytes under
        its keys. ``src_block`` stays with the request that holds it, now unhashed: when
        it leaves that owner it is ordered zeroed like any unhashed block.
        """
        super().move_block_hashes(src_block, dst_block)
        if self.kvgov_moved is not None and block_hash(dst_block) is not None:
            self.kvgov_moved(src_block.block_id, dst_block.block_id)

    def _kvgov_refuse(self, what: str, fix: str) -> None:
        if self.kvgov_owner_table is not None:  # a binding governs this pool
            raise UnsupportedEngine(what, fix)

    # ------------------------------------------------------------------ kvgov's side

    def kvgov_evict(self, block_ids: Iterable[int], reason: str) -> tuple[list[int], list[int]]:
        """Drop the hash of every hashed block among ``block_ids``.

        Unreferenced ones leave their owner now (BlocksEvicted, then zeroing
        ordered); referenced ones stay with their holders, unreachable by key, and
        are ordered zeroed when the last holder frees them (no hash then).

        Returns:
            The blocks evicted (now FREE) and those detached (still OWNED).

        Raises:
            UnknownBlock: an id is not a block of this pool (nothing was evicted).
        """
        blocks = self.blocks
        n = len(blocks)
        extra = self.cached_block_hashes_by_block
        hashed: list[KVCacheBlock] = []
        seen: set[int] = set()
        for i in block_ids:
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < n:
                raise UnknownBlock(i, n)
            b = blocks[i]
            if i in seen or b.is_null:
                continue
            seen.add(i)
            if block_hash(b) is not None or (extra and i in extra):
                hashed.append(b)
        free_now = [b for b in hashed if b.ref_cnt == 0]
        if free_now:
            self.kvgov_evicted(free_now, reason)
        queue = self.kvgov_governed
        moved = queue.kvgov_detach(free_now) if queue is not None and free_now else []
        for b in hashed:
            fence.evict_cached_block(self, b)
        if moved:  # out of the per-priority lists: no hash now, reused first
            queue.kvgov_to_front(moved)  # type: ignore[union-attr]
        return [b.block_id for b in free_now], [b.block_id for b in hashed if b.ref_cnt]

    def kvgov_drop(self, blocks: list[KVCacheBlock], reason: str) -> None:
        """Evict free cached blocks the governed queue took out of its lists (a cap):
        report them, order them zeroed, drop their hashes."""
        self.kvgov_evicted(blocks, reason)
        for b in blocks:
            fence.evict_cached_block(self, b)

    def kvgov_evicted(self, blocks: list[KVCacheBlock], reason: str) -> None:
        """Report cached blocks leaving their owner (called before vLLM drops their hash)."""
        ids = [b.block_id for b in blocks]
        keys = tuple(get_block_hash(k) if (k := block_hash(b)) else b"" for b in blocks)
        self.kvgov_events.append(BlocksEvicted(tuple(ids), keys, reason))
        self._kvgov_order_zero(ids)

    def _kvgov_order_zero(self, ids: list[int], *, merge: bool = False) -> None:
        """Order ``ids`` zeroed: queue them for the next step, report BlocksZeroized (ordered).

        ``merge`` (frees only): fold them into the pending report of freed blocks, so the
        requests a step finishes make one report (one audit event per owner), not one
        each. Safe: the governor reassigns an owner only after draining every report
        before it, and a freed block has no pending eviction report that must come first.
        """
        self.kvgov_zero.extend(ids)
        table = self.kvgov_owner_table
        if table is None:
            self.kvgov_zero_owners.extend([None] * len(ids))
        else:
            self.kvgov_zero_owners.extend([table[i] for i in ids])
        events = self.kvgov_events
        at = self.kvgov_open_free
        if merge and at is not None and at < len(events):
            merged = tuple(sorted(events[at].block_ids + tuple(ids)))
            events[at] = BlocksZeroized(
                merged, len(merged) * self.kvgov_bytes_per_block, self.kvgov_device, 0.0, "ordered"
            )
            return
        events.append(
            BlocksZeroized(
                tuple(sorted(ids)),
                len(ids) * self.kvgov_bytes_per_block,
                self.kvgov_device,
                0.0,
                "ordered",
            )
        )
        if merge:
            self.kvgov_open_free = len(events) - 1


class VllmPoolAdapter:
    """The governed vLLM pool as the governor's :class:`~kvgov.govern.protocol.ObservedPool`.

    vLLM's scheduler allocates, frees, looks up and keys blocks itself; the
    governor only observes (``take_events``), evicts and revokes (purge,
    invalidation, retention) and reads states. The adapter has none of the calls
    a binding that drives its pool makes (:class:`~kvgov.govern.protocol.DrivenPool`).

    Args:
        pool: the governed pool.
        bytes_per_block: bytes of KV one block holds across its layers, per worker.
    """

    __slots__ = ("_bytes_per_block", "_pool")

    def __init__(self, pool: GovernedBlockPool, bytes_per_block: int) -> None:
        self._pool = pool
        self._bytes_per_block = bytes_per_block
        pool.kvgov_bytes_per_block = bytes_per_block

    @property
    def num_blocks(self) -> int:
        """Blocks in vLLM's pool, its null block included."""
        return int(self._pool.num_gpu_blocks)

    @property
    def bytes_per_block(self) -> int:
        """Bytes of KV one block holds across its layers, per worker."""
        return self._bytes_per_block

    def set_quotas(self, quotas: Mapping[str, Quota] | None) -> None:
        """Every tenant's floor and cap on CACHED blocks, enforced in vLLM's free queue
        (:mod:`.free_queue`); None or empty: none.

        Raises:
            InvalidQuota: a quota is malformed or the floors add up to more than the
                pool (nothing changed).
        """
        self._pool.kvgov_set_quotas(check_quotas(quotas or {}, self.num_blocks))

    def evict(self, block_ids: Iterable[int], reason: str) -> list[int]:
        """Evict the CACHED blocks among ``block_ids`` (retention expiry); others are left.

        Raises:
            InvalidSpec: ``reason`` is not a non-empty string.
            UnknownBlock: an id is not a block of the pool.
        """
        _check_reason(reason)
        blocks = self._pool.blocks
        ids = list(block_ids)
        for i in ids:
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < len(blocks):
                raise UnknownBlock(i, len(blocks))
        cached = [i for i in ids if blocks[i].ref_cnt == 0]
        return self._pool.kvgov_evict(cached, reason)[0]

    def revoke(self, block_ids: Iterable[int], reason: str) -> Revoked:
        """Evict the CACHED blocks among ``block_ids``, unhash the OWNED ones (purge, invalidation).

        Raises:
            InvalidSpec: ``reason`` is not a non-empty string.
            UnknownBlock: an id is not a block of the pool.
        """
        _check_reason(reason)
        evicted, detached = self._pool.kvgov_evict(block_ids, reason)
        return Revoked(evicted=tuple(evicted), detached=tuple(detached))

    def states(self, block_ids: Sequence[int]) -> list[BlockState]:
        """Per block, its state now (see the module docstring)."""
        blocks = self._pool.blocks
        out = []
        for i in block_ids:
            b = blocks[i]
            if b.ref_cnt > 0 and not b.is_null:
                out.append(BlockState.OWNED)
            elif block_hash(b) is not None and not b.is_null:
                out.append(BlockState.CACHED)
            else:
                out.append(BlockState.FREE)
        return out

    def counts(self) -> PoolCounts:
        """Blocks in each state (DIRTY is always 0)."""
        states = self.states(range(self.num_blocks))
        return PoolCounts(
            free=states.count(BlockState.FREE),
            owned=states.count(BlockState.OWNED),
            cached=states.count(BlockState.CACHED),
            dirty=0,
        )

    def read_back_zero(self, block_ids: Sequence[int]) -> bool | None:
        """None: the bytes live in the workers, which this process cannot read."""
        return None

    def take_events(self) -> list[PoolEvent]:
        """kvgov events since the last call, oldest first."""
        pool = self._pool
        events, pool.kvgov_events = pool.kvgov_events, []
        pool.kvgov_open_free = None
        return events


def _check_reason(reason: object) -> None:
    if not isinstance(reason, str) or not reason:
        raise InvalidSpec("reason", reason, "must be a non-empty string")
