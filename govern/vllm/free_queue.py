"""vLLM's free block queue in the policy's eviction order: :class:`GovernedFreeQueue`.

vLLM keeps every free block in one ``FreeKVCacheBlockQueue`` (a doubly linked list
threaded through the blocks): blocks freed without a hash at the front (reused
first), cached ones at the back, least recently used first; ``get_new_blocks``
hands out the head, evicting the cached blocks it takes. That order is LRU and
nothing else. Under a policy that sets eviction priorities (0-100, with durations)
or per-tenant floors and caps (:mod:`kvgov.govern.quotas`), the binding re-classes
that queue in place into a :class:`GovernedFreeQueue`, which keeps vLLM's own list
and adds one more vLLM list per *key*:

* a cached block's key is ``group * 128 + priority``: ``group`` is its owner
  tenant's quota group (0 for a tenant with no floor or cap), ``priority`` the
  admission policy's for the request that cached it (:meth:`kvgov_keyed`), until
  its duration passes (a hit changes neither, as in kvgov's own pool);
* vLLM's own list (``self``) holds the blocks without a hash and the cached blocks
  of key :data:`BASE` (group 0, the default priority); every other key has its own
  ``FreeKVCacheBlockQueue`` (vLLM's class, so every list operation is vLLM's O(1)
  code).

So with the default policy (every priority 50, no quota) nothing leaves vLLM's
list and the order is vLLM's, block for block: the binding does not even re-class
the queue until a policy needs it. Otherwise ``popleft_n`` (what ``get_new_blocks``
calls) takes, in this order:

1. the blocks without a hash at the front of vLLM's list (nothing is evicted);
2. when the allocating tenant is at or over its cap: its own cached blocks, lowest
   priority first, least recently used within one (reason ``cap``);
3. every tenant's cached blocks beyond its floor, lowest priority first, least
   recently used within a priority across tenants (reasons ``priority`` below the
   highest priority cached, ``capacity`` at it);
4. cached blocks within floors, in the same order (``floor_pressure``).

Cost: a free appends a batch to the list of its key (one key lookup per block and
vLLM's append); a hit removes the block from its list in O(1); an allocation walks
the few non-empty lists by priority (at most 101 per group), and with quotas merges
the heads of one priority's lists in a heap by the time each block was freed (a
per-block stamp): O(n log L) for n blocks and L lists, never a scan of the cache.
A tenant that goes over its cap (blocks freed, a lower cap) loses its excess at once
(:meth:`kvgov_trim`, reason ``cap``). Priorities whose duration passed decay to the
default before victims are chosen (a heap of deadlines, :class:`~kvgov.allocator.priority.Decay`).

The queue reports the cached blocks it hands out, with their reason, to the pool
(:meth:`~.pool.GovernedBlockPool.kvgov_evicted`) before vLLM drops their hashes.
Only the engine core's thread touches it.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator, Mapping
from typing import Any

from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue

from kvgov.allocator import Quota
from kvgov.allocator.eviction import CAPACITY, PRIORITY
from kvgov.allocator.priority import Decay
from kvgov.allocator.quota import CAP, FLOOR_PRESSURE
from kvgov.defaults import DEFAULT_PRIORITY
from kvgov.exceptions import InternalError

from . import fence

__all__ = ["BASE", "SPAN", "GovernedFreeQueue", "key_of"]

#: Keys per quota group: a key is ``group * SPAN + priority`` (priorities are 0..100).
SPAN = 128
#: The key of vLLM's own list: group 0 (no quota), the default priority.
BASE = DEFAULT_PRIORITY


def key_of(group: int, priority: int) -> int:
    """The key of a cached block of quota ``group`` at eviction ``priority``."""
    return group * SPAN + priority


class GovernedFreeQueue(FreeKVCacheBlockQueue):
    """vLLM's free queue, taking cached blocks in the policy's order (module docstring).

    Built only by :meth:`adopt` (re-classing the pool's queue in place).
    """

    @classmethod
    def adopt(cls, pool: Any) -> GovernedFreeQueue:
        """Turn the free queue of ``pool`` (a :class:`~.pool.GovernedBlockPool`) into a
        governed one, in place; idempotent."""
        queue = pool.free_block_queue
        if isinstance(queue, cls):
            return queue
        governed = fence.reclass(queue, cls)
        governed.kvgov_init(pool)
        pool.free_block_queue = governed
        return governed

    def kvgov_init(self, pool: Any) -> None:
        """Set kvgov's fields (every cached block is in vLLM's list, at key BASE, now)."""
        n = len(pool.blocks)
        self.kvgov_pool = pool
        self.kvgov_blocks: list[Any] = pool.blocks
        #: per block id: its key (meaningful while it holds a hash)
        self.kvgov_key: list[int] = [BASE] * n
        #: key -> vLLM list of the free cached blocks of that key (never BASE)
        self.kvgov_levels: dict[int, FreeKVCacheBlockQueue] = {}
        #: free blocks in kvgov_levels (the rest of num_free_blocks are in vLLM's list)
        self.kvgov_in_levels = 0
        #: per quota group (index): its free cached blocks; index 0 unused
        self.kvgov_counts: list[int] = [0]
        #: quota group -> its floor and cap; tenant -> quota group
        self.kvgov_quotas: dict[int, Quota] = {}
        self.kvgov_group_ids: dict[str, int] = {}
        #: per block id, when it was last freed (quota groups' lists are merged by it)
        self.kvgov_stamp: list[int] | None = None
        self.kvgov_clock = 0
        #: the quota group of the allocation in progress (0: none)
        self.kvgov_allocating = 0
        #: whether a group may be over its cap (checked by kvgov_trim)
        self.kvgov_over = False
        self.kvgov_decay = Decay()
        #: whether any block may have a deadline (a flag: cheaper than asking the heap)
        self.kvgov_decaying = False

    # ------------------------------------------------------------------ vLLM's calls

    def append_n(self, blocks: list[Any]) -> None:
        if not blocks:
            return
        key = self.kvgov_key
        if self.kvgov_stamp is not None:
            self._kvgov_stamp(blocks)
        k0 = key[blocks[0].block_id]
        for b in blocks:
            if key[b.block_id] != k0:
                break
        else:  # one key: the rule (a request's blocks)
            self._kvgov_put(k0, blocks)
            return
        by: dict[int, list[Any]] = {}
        for b in blocks:
            by.setdefault(key[b.block_id], []).append(b)
        for k, run in by.items():
            self._kvgov_put(k, run)

    def append(self, block: Any) -> None:
        self.append_n([block])

    def remove(self, block: Any) -> None:
        k = self.kvgov_key[block.block_id]
        if k == BASE or fence.block_hash(block) is None:
            super().remove(block)
            return
        self.kvgov_levels[k].remove(block)
        self.num_free_blocks -= 1
        self.kvgov_in_levels -= 1
        g = k // SPAN
        if g:
            self.kvgov_counts[g] -= 1

    def popleft(self) -> Any:
        if not self.kvgov_in_levels:
            return super().popleft()
        return self.popleft_n(1)[0]

    def popleft_n(self, n: int) -> list[Any]:
        if n <= 0:
            return []
        if n > self.num_free_blocks:
            raise ValueError(f"cannot take {n} blocks from {self.num_free_blocks} free")
        if self.kvgov_decaying:
            self.kvgov_decay_due()
        pool = self.kvgov_pool
        if not self.kvgov_in_levels:  # every free block is in vLLM's list: vLLM's order
            hashed = fence.hashed_ahead(self, n, pool.cached_block_hashes_by_block)
            if hashed:
                pool.kvgov_evicted(hashed, CAPACITY)
            taken: list[Any] = super().popleft_n(n)
            return taken
        out: list[Any] = []
        base_n = self.num_free_blocks - self.kvgov_in_levels
        if base_n:
            lead = fence.leading_unhashed(self, min(n, base_n))
            if lead:
                out = super().popleft_n(lead)
                n -= lead
                base_n -= lead
        if not n:
            return out
        if not self.kvgov_quotas:
            return self._kvgov_by_priority(n, base_n, out)
        batches: list[tuple[str, list[Any]]] = []
        g = self.kvgov_allocating
        quota = self.kvgov_quotas.get(g) if g else None
        if quota is not None and quota.cap is not None and self.kvgov_counts[g] >= quota.cap:
            take = min(n, self.kvgov_counts[g])
            if take:
                batches.append((CAP, self._kvgov_take_group(g, take)))
                n -= take
        if n:
            n = self._kvgov_merge(n, batches, floors=True)
        if n:
            n = self._kvgov_merge(n, batches, floors=False)
        if n:
            raise InternalError(f"the governed free queue is short of {n} blocks")
        for reason, blocks in batches:
            hashed = fence.hashed_blocks(blocks)
            if hashed:
                pool.kvgov_evicted(hashed, reason)
            out.extend(blocks)
        return out

    def get_all_free_blocks(self) -> list[Any]:
        """Every free block, in eviction order (quotas aside)."""
        if not self.kvgov_in_levels:
            blocks: list[Any] = super().get_all_free_blocks()
            return blocks
        return self.kvgov_order()

    def iter_blocks_after(self, cursor: Any) -> Iterator[Any]:
        """The free blocks after ``cursor`` in eviction order (all of them for None)."""
        order = self.get_all_free_blocks()
        start = 0
        if cursor is not None:
            for i, b in enumerate(order):
                if b is cursor:
                    start = i + 1
                    break
            else:
                return
        yield from order[start:]

    # ------------------------------------------------------------------ the binding's calls

    def kvgov_keyed(
        self, block_ids: list[int], priority: int, group: int, deadline: float | None
    ) -> None:
        """Blocks just cached (still owned): their priority, quota group and decay."""
        k = key_of(group, priority)
        key = self.kvgov_key
        for b in block_ids:
            key[b] = k
        if deadline is not None and priority != DEFAULT_PRIORITY:
            decay = self.kvgov_decay
            for b in block_ids:
                decay.set(b, deadline)
            self.kvgov_decaying = True
        elif self.kvgov_decaying:
            decay = self.kvgov_decay
            for b in block_ids:
                decay.clear(b)

    def kvgov_group(self, tenant: str) -> int:
        """The quota group of ``tenant`` (0: no floor or cap)."""
        return self.kvgov_group_ids.get(tenant, 0)

    def kvgov_set_quotas(self, quotas: Mapping[str, Quota]) -> None:
        """Replace the quotas (validated by the caller) and re-file every cached block.

        Each hashed block's group is re-read from its owner's tenant; the free ones
        are re-queued in their eviction order. O(blocks), once per policy change.
        A group then over its cap is trimmed (:meth:`kvgov_trim`).
        """
        order = self.kvgov_order()
        names = sorted(quotas)
        self.kvgov_group_ids = {t: i + 1 for i, t in enumerate(names)}
        self.kvgov_quotas = {i + 1: quotas[t] for i, t in enumerate(names)}
        self.kvgov_counts = [0] * (len(names) + 1)
        self.kvgov_stamp = [0] * len(self.kvgov_blocks) if quotas else None
        table = self.kvgov_pool.kvgov_owner_table
        key = self.kvgov_key
        gids = self.kvgov_group_ids
        for blk in self.kvgov_blocks:
            b = blk.block_id
            owner = table[b] if table is not None else None
            g = gids.get(owner.tenant, 0) if owner is not None else 0
            key[b] = key_of(g, key[b] % SPAN)
        # empty every list, then re-queue in the order they were in
        FreeKVCacheBlockQueue.__init__(self, [])
        self.kvgov_levels = {}
        self.kvgov_in_levels = 0
        unhashed = [b for b in order if fence.block_hash(b) is None]
        hashed = fence.hashed_blocks(order)
        if unhashed:
            super().append_n(unhashed)
        self.append_n(hashed)
        self.kvgov_over = bool(quotas)
        self.kvgov_trim()

    def kvgov_trim(self) -> None:
        """Evict, for each group over its cap, its excess now (reason ``cap``)."""
        if not self.kvgov_over:
            return
        self.kvgov_over = False
        counts = self.kvgov_counts
        for g, quota in self.kvgov_quotas.items():
            if quota.cap is not None and counts[g] > quota.cap:
                victims = self._kvgov_take_group(g, counts[g] - quota.cap)
                self.kvgov_pool.kvgov_drop(victims, CAP)
                super().prepend_n(victims)  # no hash now: reused first

    def kvgov_detach(self, blocks: list[Any]) -> list[Any]:
        """Take the free ``blocks`` (hashed, about to lose their hash) out of the per-key
        lists; those of vLLM's list stay where they are. Returns the ones taken."""
        key = self.kvgov_key
        taken = [b for b in blocks if key[b.block_id] != BASE]
        for b in taken:
            self.remove(b)
        return taken

    def kvgov_to_front(self, blocks: list[Any]) -> None:
        """Put free blocks that lost their hash at the front of vLLM's list."""
        if blocks:
            super().prepend_n(blocks)

    def kvgov_flatten(self) -> None:
        """Every hash was dropped (vLLM's reset): move every list's blocks to vLLM's front."""
        moved: list[Any] = []
        for q in self.kvgov_levels.values():
            if q.num_free_blocks:
                moved.extend(q.popleft_n(q.num_free_blocks))
        self.num_free_blocks -= len(moved)
        self.kvgov_in_levels = 0
        self.kvgov_counts = [0] * len(self.kvgov_counts)
        self.kvgov_decay = Decay()
        self.kvgov_decaying = False
        self.kvgov_to_front(moved)

    def kvgov_decay_due(self) -> None:
        """Lower every block whose priority duration passed to the default; a free one
        moves to the most recently used end of its default list."""
        decay = self.kvgov_decay
        due = decay.due(self.kvgov_pool.kvgov_now())
        if not decay:
            self.kvgov_decaying = False
        key = self.kvgov_key
        blocks = self.kvgov_blocks
        for b in due:
            k = key[b]
            p = k % SPAN
            if p == DEFAULT_PRIORITY:
                continue
            blk = blocks[b]
            if blk.ref_cnt == 0 and fence.block_hash(blk) is not None:
                self.remove(blk)
                key[b] = k - p + DEFAULT_PRIORITY
                self.append_n([blk])
            else:
                key[b] = k - p + DEFAULT_PRIORITY

    def kvgov_order(self) -> list[Any]:
        """Every free block in the order the queue would take them, quotas aside."""
        base = FreeKVCacheBlockQueue.get_all_free_blocks(self)
        lead = 0
        while lead < len(base) and fence.block_hash(base[lead]) is None:
            lead += 1
        runs: dict[int, list[list[Any]]] = {}
        if lead < len(base):
            runs.setdefault(DEFAULT_PRIORITY, []).append(base[lead:])
        for k, q in self.kvgov_levels.items():
            if q.num_free_blocks:
                runs.setdefault(k % SPAN, []).append(q.get_all_free_blocks())
        out: list[Any] = base[:lead]
        stamp = self.kvgov_stamp
        for p in sorted(runs):
            lists = runs[p]
            if len(lists) == 1 or stamp is None:
                for run in lists:
                    out.extend(run)
            else:
                out.extend(heapq.merge(*lists, key=lambda b: stamp[b.block_id]))
        return out

    def kvgov_counts_by_tenant(self) -> dict[str, int]:
        """Free cached blocks per tenant that has a quota."""
        return {t: self.kvgov_counts[g] for t, g in self.kvgov_group_ids.items()}

    def kvgov_check(self) -> None:
        """Every free block is in the list of its key; the counts add up.

        Raises:
            InternalError: they do not (a bug in kvgov).
        """
        key = self.kvgov_key
        base = FreeKVCacheBlockQueue.get_all_free_blocks(self)
        total = len(base)
        for b in base:
            if fence.block_hash(b) is not None and key[b.block_id] != BASE:
                raise InternalError(f"block {b.block_id} of key {key[b.block_id]} in vLLM's list")
        counts = [0] * len(self.kvgov_counts)
        for k, q in self.kvgov_levels.items():
            blocks = q.get_all_free_blocks()
            if len(blocks) != q.num_free_blocks:
                raise InternalError(f"list {k} holds {len(blocks)}, counts {q.num_free_blocks}")
            for b in blocks:
                if key[b.block_id] != k or fence.block_hash(b) is None or b.ref_cnt:
                    raise InternalError(f"block {b.block_id} misfiled in list {k}")
            total += len(blocks)
            if k // SPAN:
                counts[k // SPAN] += len(blocks)
        if total != self.num_free_blocks:
            raise InternalError(f"{total} free blocks, counted {self.num_free_blocks}")
        if total - len(base) != self.kvgov_in_levels or counts[1:] != self.kvgov_counts[1:]:
            raise InternalError("the governed free queue's counts are wrong")

    # ------------------------------------------------------------------ internals

    def _kvgov_stamp(self, blocks: list[Any]) -> None:
        stamp = self.kvgov_stamp
        assert stamp is not None
        c = self.kvgov_clock
        for b in blocks:
            stamp[b.block_id] = c
            c += 1
        self.kvgov_clock = c

    def _kvgov_put(self, k: int, blocks: list[Any]) -> None:
        if k == BASE:
            super().append_n(blocks)
            return
        q = self.kvgov_levels.get(k)
        if q is None:
            q = self.kvgov_levels[k] = FreeKVCacheBlockQueue([])
        q.append_n(blocks)
        n = len(blocks)
        self.num_free_blocks += n
        self.kvgov_in_levels += n
        g = k // SPAN
        if g:
            c = self.kvgov_counts[g] + n
            self.kvgov_counts[g] = c
            quota = self.kvgov_quotas.get(g)
            if quota is not None and quota.cap is not None and c > quota.cap:
                self.kvgov_over = True

    def _kvgov_pop(self, k: int, q: FreeKVCacheBlockQueue, n: int) -> list[Any]:
        """Take ``n`` blocks from the head of list ``q`` (of key ``k``; ``self``: vLLM's)."""
        if q is self:
            blocks: list[Any] = super().popleft_n(n)
            return blocks
        blocks = q.popleft_n(n)
        self.num_free_blocks -= n
        self.kvgov_in_levels -= n
        g = k // SPAN
        if g:
            self.kvgov_counts[g] -= n
        return blocks

    def _kvgov_take_group(self, g: int, n: int) -> list[Any]:
        """Take ``group``'s next ``n`` cached blocks: lowest priority first, LRU within one."""
        out: list[Any] = []
        lo = g * SPAN
        for k in sorted(k for k in self.kvgov_levels if lo <= k < lo + SPAN):
            q = self.kvgov_levels[k]
            t = min(n - len(out), q.num_free_blocks)
            if t:
                out.extend(self._kvgov_pop(k, q, t))
            if len(out) == n:
                break
        return out

    def _kvgov_by_priority(self, n: int, base_n: int, out: list[Any]) -> list[Any]:
        """:meth:`popleft_n` without quotas: one list per priority (key), lowest first."""
        levels = self.kvgov_levels
        keys = [k for k, q in levels.items() if q.num_free_blocks]
        if base_n:
            keys.append(BASE)
        keys.sort()
        top = keys[-1]
        report = self.kvgov_pool.kvgov_evicted
        for k in keys:
            if k == BASE:
                t = n if n < base_n else base_n
                blocks: list[Any] = super().popleft_n(t)
                hashed = fence.hashed_blocks(blocks)
            else:
                q = levels[k]
                size = q.num_free_blocks
                t = n if n < size else size
                blocks = hashed = q.popleft_n(t)
                self.num_free_blocks -= t
                self.kvgov_in_levels -= t
            if hashed:
                report(hashed, PRIORITY if k < top else CAPACITY)
            out.extend(blocks)
            n -= t
            if not n:
                return out
        raise InternalError(f"the governed free queue is short of {n} blocks")

    def _kvgov_merge(self, n: int, batches: list[tuple[str, list[Any]]], *, floors: bool) -> int:
        """Take up to ``n`` cached blocks, lowest priority first and LRU within a priority
        across lists; with ``floors`` each quota group gives only what is beyond its floor.
        Appends them to ``batches`` by reason; returns how many are still wanted."""
        lists: dict[int, list[tuple[int, FreeKVCacheBlockQueue]]] = {}
        base_n = self.num_free_blocks - self.kvgov_in_levels
        if base_n:
            lists[DEFAULT_PRIORITY] = [(BASE, self)]
        for k, q in self.kvgov_levels.items():
            if q.num_free_blocks:
                lists.setdefault(k % SPAN, []).append((k, q))
        if not lists:
            return n
        top = max(lists)
        counts = self.kvgov_counts
        quotas = self.kvgov_quotas
        spare = list(counts)
        if floors:
            for g, quota in quotas.items():
                spare[g] = max(0, counts[g] - quota.floor)
        for p in sorted(lists):
            reason = (PRIORITY if p < top else CAPACITY) if floors else FLOOR_PRESSURE
            at = lists[p]
            if len(at) == 1:
                k, q = at[0]
                g = k // SPAN
                size = base_n if q is self else q.num_free_blocks
                t = min(n, size, spare[g]) if g else min(n, size)
                if t:
                    _add(batches, reason, self._kvgov_pop(k, q, t))
                    n -= t
                    if g:
                        spare[g] -= t
            else:
                n = self._kvgov_merge_level(n, at, spare, reason, batches, base_n)
            if not n:
                break
        return n

    def _kvgov_merge_level(
        self,
        n: int,
        at: list[tuple[int, FreeKVCacheBlockQueue]],
        spare: list[int],
        reason: str,
        batches: list[tuple[str, list[Any]]],
        base_n: int,
    ) -> int:
        """One priority's lists (several quota groups), merged by the time each block was freed."""
        stamp = self.kvgov_stamp
        if stamp is None:
            raise InternalError("several lists at one priority without quotas")
        left = {k: (base_n if q is self else q.num_free_blocks) for k, q in at}
        heap: list[tuple[int, int, FreeKVCacheBlockQueue]] = []
        for k, q in at:
            g = k // SPAN
            if left[k] and (not g or spare[g] > 0):
                head = fence.first_free(q)
                heap.append((stamp[head.block_id], k, q))
        heapq.heapify(heap)
        while n and heap:
            _, k, q = heapq.heappop(heap)
            g = k // SPAN
            _add(batches, reason, self._kvgov_pop(k, q, 1))
            n -= 1
            left[k] -= 1
            if g:
                spare[g] -= 1
            if left[k] and (not g or spare[g] > 0):
                head = fence.first_free(q)
                heapq.heappush(heap, (stamp[head.block_id], k, q))
        return n


def _add(batches: list[tuple[str, list[Any]]], reason: str, blocks: list[Any]) -> None:
    if batches and batches[-1][0] == reason:
        batches[-1][1].extend(blocks)
    else:
        batches.append((reason, blocks))
