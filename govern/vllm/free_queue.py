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

Cost: a free appends a batch to the list of its key (one pass over the batch reads
each block's key, and stamps it under quotas; then vLLM's append); a hit removes the
block from its list in O(1); an allocation walks up the priorities that hold free
cached blocks (a sorted list kept as lists fill and empty, so the top priority, for
the reasons, is its last), taking from the one list there is at each without
quotas. With quotas, several groups' lists at one priority are merged by the time
each block was freed (a per-block stamp), a *run* at a time: the list with the
oldest head gives every block freed before the next list's head in one take (a
request's blocks are freed together, so a run is usually a whole request). The
lists' heads wait in a heap per priority kept from one allocation to the next: a
list's entry is pushed when it starts holding blocks and brought up to date only
when it reaches the top (a hit or a partial take leaves it behind its head; one
that emptied is dropped there), and the heap is rebuilt from the heads before its
stale entries outnumber them. O(r log L + n) for n blocks in r runs from L lists,
never a scan of the cache, and nothing for a list that gives nothing.
A tenant that goes over its cap (blocks freed, a lower cap) loses its excess at once
(:meth:`kvgov_trim`, reason ``cap``). Priorities whose duration passed decay to the
default before victims are chosen (a heap of deadlines, :class:`~kvgov.allocator.priority.Decay`).

The queue reports the cached blocks it hands out, with their reason, to the pool
(:meth:`~.pool.GovernedBlockPool.kvgov_evicted`) before vLLM drops their hashes.
Only the engine core's thread touches it.
"""

from __future__ import annotations

import heapq
import sys
from bisect import insort
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

__all__ = ["BASE", "NO_CAP", "SPAN", "GovernedFreeQueue", "key_of"]

#: Keys per quota group: a key is ``group * SPAN + priority`` (priorities are 0..100).
SPAN = 128
#: The key of vLLM's own list: group 0 (no quota), the default priority.
BASE = DEFAULT_PRIORITY
#: The cap of a quota group without one (more blocks than any pool holds).
NO_CAP = sys.maxsize


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
        #: key -> vLLM list of the free cached blocks of that key (never BASE); a list
        #: made once is kept, empty or not
        self.kvgov_levels: dict[int, FreeKVCacheBlockQueue] = {}
        #: priority -> key -> the lists of kvgov_levels at that priority that hold blocks
        #: (only priorities that have one); vLLM's own list is never here
        self.kvgov_live: dict[int, dict[int, FreeKVCacheBlockQueue]] = {}
        #: the priorities of kvgov_live, ascending
        self.kvgov_prios: list[int] = []
        #: with quotas: priority -> a heap of (stamp, key) of that priority's lists, each
        #: list's entry no newer than its head (kept lazily: fixed when it reaches the
        #: top, see _kvgov_clean); kvgov_mark: per list (key) the stamp of its one
        #: current entry (any other entry of it is stale, dropped on sight)
        self.kvgov_heads: dict[int, list[tuple[int, int]]] = {}
        self.kvgov_mark: dict[int, int] = {}
        #: free blocks in kvgov_levels (the rest of num_free_blocks are in vLLM's list)
        self.kvgov_in_levels = 0
        #: per quota group (index): its free cached blocks, floor and cap (NO_CAP: none);
        #: index 0 (no quota) unused
        self.kvgov_counts: list[int] = [0]
        self.kvgov_floors: list[int] = [0]
        self.kvgov_caps: list[int] = [NO_CAP]
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
        k0 = key[blocks[0].block_id]
        stamp = self.kvgov_stamp
        mixed = False
        if stamp is None:
            for b in blocks:
                if key[b.block_id] != k0:
                    mixed = True
                    break
        else:  # one pass stamps the blocks and checks their keys
            c = self.kvgov_clock
            for b in blocks:
                i = b.block_id
                stamp[i] = c
                c += 1
                if key[i] != k0:
                    mixed = True
            self.kvgov_clock = c
        if not mixed:  # one key: the rule (a request's blocks)
            if k0 == BASE:
                FreeKVCacheBlockQueue.append_n(self, blocks)
                return
            q = self.kvgov_levels.get(k0)
            if q is not None and q.num_free_blocks and stamp is None:
                # the common case without quotas, inline: a list that holds blocks
                # already (filed), group 0 (no counts, no cap)
                q.append_n(blocks)
                n = len(blocks)
                self.num_free_blocks += n
                self.kvgov_in_levels += n
            else:
                self._kvgov_put(k0, blocks)
            return
        by: dict[int, list[Any]] = {}
        for b in blocks:
            by.setdefault(key[b.block_id], []).append(b)
        for k, run in by.items():
            if k == BASE:
                super().append_n(run)
            else:
                self._kvgov_put(k, run)

    def append(self, block: Any) -> None:
        self.append_n([block])

    def remove(self, block: Any) -> None:
        k = self.kvgov_key[block.block_id]
        if k == BASE or fence.block_hash(block) is None:
            super().remove(block)
            return
        q = self.kvgov_levels[k]
        q.remove(block)
        if not q.num_free_blocks:
            self._kvgov_gone(k)
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
        if self.kvgov_decaying:
            self.kvgov_decay_due()
        in_levels = self.kvgov_in_levels
        # The rule when nothing is evicted: blocks without a hash (freed unkeyed) at the
        # front of vLLM's list serve it, as vLLM's own popleft_n would.
        if (
            in_levels
            and 0 < n <= self.num_free_blocks - in_levels
            and fence.leading_unhashed(self, n) == n
        ):
            taken: list[Any] = FreeKVCacheBlockQueue.popleft_n(self, n)
            return taken
        if n <= 0:
            return []
        if n > self.num_free_blocks:
            raise ValueError(f"cannot take {n} blocks from {self.num_free_blocks} free")
        if not in_levels:  # every free block is in vLLM's list: vLLM's order
            pool = self.kvgov_pool
            hashed = fence.hashed_ahead(self, n, pool.cached_block_hashes_by_block)
            if hashed:
                pool.kvgov_evicted(hashed, CAPACITY)
            taken = FreeKVCacheBlockQueue.popleft_n(self, n)
            return taken
        out: list[Any] = []
        base_n = self.num_free_blocks - in_levels
        if base_n:
            lead = fence.leading_unhashed(self, n if n < base_n else base_n)
            if lead:
                out = FreeKVCacheBlockQueue.popleft_n(self, lead)
                n -= lead
                base_n -= lead
        if not self.kvgov_quotas:
            return self._kvgov_by_priority(n, base_n, out)
        batches: list[tuple[str, list[Any]]] = []
        in_base = base_n  # (level lists hold only hashed blocks, vLLM's may hold others)
        g = self.kvgov_allocating
        if g and self.kvgov_counts[g] >= self.kvgov_caps[g]:
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
        report = self.kvgov_pool.kvgov_evicted
        from_base = in_base != self.num_free_blocks - self.kvgov_in_levels
        for reason, blocks in batches:
            hashed = fence.hashed_blocks(blocks) if from_base else blocks
            if hashed:
                report(hashed, reason)
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
        k = group * SPAN + priority
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

    def kvgov_moved(self, src: int, dst: int) -> None:
        """Block ``src``'s keys moved to ``dst`` (still owned): ``dst`` takes its priority,
        quota group and decay."""
        k = self.kvgov_key[src]
        self.kvgov_keyed([dst], k % SPAN, k // SPAN, self.kvgov_decay.when(src))

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
        self.kvgov_floors = [0] + [quotas[t].floor for t in names]
        self.kvgov_caps = [NO_CAP] + [_cap(quotas[t]) for t in names]
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
        self.kvgov_live = {}
        self.kvgov_prios = []
        self.kvgov_heads = {}
        self.kvgov_mark = {}
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
        caps = self.kvgov_caps
        for g in self.kvgov_quotas:
            if counts[g] > caps[g]:
                victims = self._kvgov_take_group(g, counts[g] - caps[g])
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
        self.kvgov_live = {}
        self.kvgov_prios = []
        self.kvgov_heads = {}
        self.kvgov_mark = {}
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
        """Every free block is in the list of its key; the counts add up; the lists that
        hold blocks, and only they, are filed by priority.

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
        live: dict[int, dict[int, Any]] = {}
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
            if blocks:
                live.setdefault(k % SPAN, {})[k] = q
        if total != self.num_free_blocks:
            raise InternalError(f"{total} free blocks, counted {self.num_free_blocks}")
        if total - len(base) != self.kvgov_in_levels or counts[1:] != self.kvgov_counts[1:]:
            raise InternalError("the governed free queue's counts are wrong")
        if live != self.kvgov_live or self.kvgov_prios != sorted(live):
            raise InternalError("the governed free queue's lists by priority are wrong")
        stamp = self.kvgov_stamp
        marks: dict[int, int] = {}
        if stamp is not None:
            for p, at in live.items():
                heads = set(self.kvgov_heads.get(p, ()))
                for k, q in at.items():
                    h = self.kvgov_mark.get(k)
                    if h is None or (h, k) not in heads or h > stamp[fence.first_free(q).block_id]:
                        raise InternalError(f"list {k} has no current entry in its heap")
                    marks[k] = h
        if marks != self.kvgov_mark or not set(self.kvgov_heads) <= set(live):
            raise InternalError("the governed free queue's heaps are wrong")

    # ------------------------------------------------------------------ internals

    def _kvgov_put(self, k: int, blocks: list[Any]) -> None:
        """Append ``blocks`` to the list of key ``k`` (not BASE)."""
        q = self.kvgov_levels.get(k)
        if q is None:
            q = self.kvgov_levels[k] = FreeKVCacheBlockQueue([])
        filed = q.num_free_blocks > 0
        q.append_n(blocks)
        if not filed:
            self._kvgov_file(k, q, blocks[0])
        n = len(blocks)
        self.num_free_blocks += n
        self.kvgov_in_levels += n
        g = k // SPAN
        if g:
            c = self.kvgov_counts[g] + n
            self.kvgov_counts[g] = c
            if c > self.kvgov_caps[g]:
                self.kvgov_over = True

    def _kvgov_file(self, k: int, q: FreeKVCacheBlockQueue, head: Any) -> None:
        """The list ``q`` of key ``k`` just started holding blocks (``head`` first): file
        it at its priority, and under quotas give it its entry in the priority's heap."""
        p = k % SPAN
        live = self.kvgov_live.get(p)
        if live is None:
            live = self.kvgov_live[p] = {}
            insort(self.kvgov_prios, p)
        live[k] = q
        stamp = self.kvgov_stamp
        if stamp is not None:
            heads = self.kvgov_heads.get(p)
            if heads is None:
                heads = self.kvgov_heads[p] = []
            h = stamp[head.block_id]
            self.kvgov_mark[k] = h
            heapq.heappush(heads, (h, k))
            if len(heads) > 2 * len(live) + 16:  # mostly stale entries: rebuild
                self._kvgov_reheap(p)

    def _kvgov_gone(self, k: int) -> None:
        """The list of key ``k`` holds no block now: unfile it."""
        p = k % SPAN
        live = self.kvgov_live[p]
        del live[k]
        self.kvgov_mark.pop(k, None)
        if not live:
            del self.kvgov_live[p]
            self.kvgov_heads.pop(p, None)
            self.kvgov_prios.remove(p)

    def _kvgov_reheap(self, p: int) -> None:
        """Rebuild priority ``p``'s heap from its lists' heads (stale entries gone)."""
        stamp = self.kvgov_stamp
        assert stamp is not None
        mark = self.kvgov_mark
        heads: list[tuple[int, int]] = []
        for k, q in self.kvgov_live[p].items():
            h = stamp[fence.first_free(q).block_id]
            mark[k] = h
            heads.append((h, k))
        heapq.heapify(heads)
        self.kvgov_heads[p] = heads

    def _kvgov_clean(self, p: int, heads: list[tuple[int, int]]) -> tuple[int, int] | None:
        """The top of priority ``p``'s heap once it is a list's current entry at its
        head's stamp: stale entries dropped, an entry behind its list's head moved up.
        None: no list left."""
        live = self.kvgov_live.get(p)
        if live is None:
            return None
        stamp = self.kvgov_stamp
        assert stamp is not None
        mark = self.kvgov_mark
        while heads:
            s, k = heads[0]
            if mark.get(k) != s:
                heapq.heappop(heads)  # stale: its list emptied or was re-entered since
                continue
            h = stamp[fence.first_free(live[k]).block_id]
            if h == s:
                return heads[0]
            mark[k] = h
            heapq.heapreplace(heads, (h, k))
        return None

    def _kvgov_pop(self, k: int, q: FreeKVCacheBlockQueue, n: int) -> list[Any]:
        """Take ``n`` blocks from the head of level list ``q`` (of key ``k``)."""
        blocks: list[Any] = q.popleft_n(n)
        if not q.num_free_blocks:
            self._kvgov_gone(k)
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
        live = self.kvgov_live
        for p in list(self.kvgov_prios):  # a copy: a priority goes when its lists empty
            q = live[p].get(lo + p)
            if q is not None:
                t = min(n - len(out), q.num_free_blocks)
                out.extend(self._kvgov_pop(lo + p, q, t))
                if len(out) == n:
                    break
        return out

    def _kvgov_order(self, base_n: int) -> tuple[list[int], int]:
        """The priorities that hold free cached blocks, ascending (vLLM's list counts at
        the default priority when it holds ``base_n`` blocks), and the highest of them."""
        prios = self.kvgov_prios
        if base_n and BASE not in self.kvgov_live:
            prios = prios.copy()
            insort(prios, BASE)
        return prios, (prios[-1] if prios else -1)

    def _kvgov_by_priority(self, n: int, base_n: int, out: list[Any]) -> list[Any]:
        """:meth:`popleft_n` without quotas: one list per priority (key), lowest first."""
        prios = self.kvgov_prios
        if prios[0] < BASE or not base_n:  # (in_levels > 0: some level list holds blocks)
            # The lowest list is a level list (below the default, or vLLM's holds no
            # block); as a rule it holds the n wanted (a flood under durable blocks).
            k = prios[0]
            q = self.kvgov_levels[k]
            size = q.num_free_blocks
            if size >= n:
                top = prios[-1] if not base_n or prios[-1] > BASE else BASE
                blocks: list[Any] = q.popleft_n(n)
                if size == n:
                    self._kvgov_gone(k)
                self.num_free_blocks -= n
                self.kvgov_in_levels -= n
                self.kvgov_pool.kvgov_evicted(blocks, PRIORITY if k < top else CAPACITY)
                out.extend(blocks)
                return out
        prios, top = self._kvgov_order(base_n)
        report = self.kvgov_pool.kvgov_evicted
        levels = self.kvgov_levels
        for k in list(prios):  # a copy: a priority goes when its list empties
            if k == BASE:
                t = n if n < base_n else base_n
                blocks = FreeKVCacheBlockQueue.popleft_n(self, t)
                hashed = fence.hashed_blocks(blocks)
            else:
                q = levels[k]
                size = q.num_free_blocks
                t = n if n < size else size
                blocks = hashed = q.popleft_n(t)
                if t == size:
                    self._kvgov_gone(k)
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
        base_n = self.num_free_blocks - self.kvgov_in_levels
        prios, top = self._kvgov_order(base_n)
        counts = self.kvgov_counts
        floor_of = self.kvgov_floors
        for p in list(prios):  # a copy: a priority goes when its lists empty
            reason = (PRIORITY if p < top else CAPACITY) if floors else FLOOR_PRESSURE
            live = self.kvgov_live.get(p)
            with_base = base_n if p == BASE else 0
            if (len(live) if live else 0) + (1 if with_base else 0) > 1:
                n = self._kvgov_merge_level(p, n, reason, batches, floors, with_base)
            elif with_base:
                t = n if n < base_n else base_n
                _add(batches, reason, FreeKVCacheBlockQueue.popleft_n(self, t))
                n -= t
            elif live:
                ((k, q),) = live.items()
                limit = q.num_free_blocks
                g = k // SPAN
                if floors and g and counts[g] - floor_of[g] < limit:
                    limit = counts[g] - floor_of[g]
                if limit > 0:
                    t = n if n < limit else limit
                    _add(batches, reason, self._kvgov_pop(k, q, t))
                    n -= t
            if not n:
                break
        return n

    def _kvgov_merge_level(
        self,
        p: int,
        n: int,
        reason: str,
        batches: list[tuple[str, list[Any]]],
        floors: bool,
        base_n: int,
    ) -> int:
        """Priority ``p``'s lists (several quota groups; vLLM's own too when it holds
        ``base_n`` blocks) merged by the time each block was freed, a run at a time: the
        list whose head is oldest gives every block freed before the next list's head.
        With ``floors`` a group gives only what is beyond its floor. The heap of the
        lists' heads is the priority's own, kept between calls: no work per list that
        gives nothing. Returns how many blocks are still wanted."""
        stamp = self.kvgov_stamp
        if stamp is None:
            raise InternalError("several lists at one priority without quotas")
        live = self.kvgov_live[p]
        heads = self.kvgov_heads[p]
        mark = self.kvgov_mark
        counts = self.kvgov_counts
        floor_of = self.kvgov_floors
        held: list[tuple[int, int]] = []  # lists at their floor, out of the heap meanwhile
        b_head = stamp[fence.first_free(self).block_id] if base_n else 0
        while n:
            top = self._kvgov_clean(p, heads)
            if top is not None and floors:
                g = top[1] // SPAN
                if g and counts[g] - floor_of[g] <= 0:
                    held.append(heapq.heappop(heads))
                    continue
            if base_n and (top is None or (b_head, BASE) < top):  # vLLM's list's turn
                most = n if n < base_n else base_n
                t = (
                    most
                    if top is None
                    else fence.head_run(self, most, stamp, top[0], top[1] > BASE)
                )
                _add(batches, reason, FreeKVCacheBlockQueue.popleft_n(self, t))
                n -= t
                base_n -= t
                if base_n:
                    b_head = stamp[fence.first_free(self).block_id]
                continue
            if top is None:
                break
            heapq.heappop(heads)
            k = top[1]
            q = live[k]
            g = k // SPAN
            limit = q.num_free_blocks
            if floors and g and counts[g] - floor_of[g] < limit:
                limit = counts[g] - floor_of[g]
            most = n if n < limit else limit
            bound = self._kvgov_clean(p, heads)
            if base_n and (bound is None or (b_head, BASE) < bound):
                bound = (b_head, BASE)
            t = most if bound is None else fence.head_run(q, most, stamp, bound[0], k < bound[1])
            left = q.num_free_blocks - t
            _add(batches, reason, self._kvgov_pop(k, q, t))
            n -= t
            if left:  # (a list emptied is gone, with its entry)
                h = stamp[fence.first_free(q).block_id]
                mark[k] = h
                heapq.heappush(heads, (h, k))
        for entry in held:
            heapq.heappush(heads, entry)
        return n


def _cap(quota: Quota) -> int:
    return NO_CAP if quota.cap is None else quota.cap


def _add(batches: list[tuple[str, list[Any]]], reason: str, blocks: list[Any]) -> None:
    if batches and batches[-1][0] == reason:
        batches[-1][1].extend(blocks)
    else:
        batches.append((reason, blocks))
