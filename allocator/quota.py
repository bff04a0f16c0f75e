"""Per-group floors and caps on CACHED blocks: :class:`Quota`, and the eviction
queue that honours them, :class:`QuotaQueue`.

A *group* is whatever the caller keys blocks under (the governor uses the
tenant). A quota says how many of a group's CACHED blocks stay cached:

* ``cap``: the most CACHED blocks the group keeps. A group that goes over it
  (its blocks freed, or a lower cap set) loses its own lowest-priority, least
  recently used blocks at once (reason :data:`CAP`); a group *at* its cap that
  allocates evicts its own cached blocks first (reason :data:`CAP`), another
  group's only when it has none left (running requests are never refused).
* ``floor``: that many of the group's CACHED blocks (its highest-priority, most
  recently used ones) are evicted only when nothing else can be (reason
  :data:`FLOOR_PRESSURE`).

Eviction order otherwise is the plain one: lowest priority first, least recently
used within a priority, across all groups (reasons ``"priority"`` and
``"capacity"``, as in :class:`~kvgov.allocator.eviction.EvictionQueue`).

Structure: one :class:`~kvgov.allocator.eviction.EvictionQueue` per group and a
stamp per block (a counter taken when it is cached) that orders blocks of
different groups within a priority. Choosing ``n`` victims merges the groups'
heads in a heap: O(g + n log g) for g groups, never a scan of the cache.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from kvgov.exceptions import InvalidQuota

from .eviction import CAPACITY, PRIORITY, EvictionQueue

__all__ = ["CAP", "FLOOR_PRESSURE", "PRESSURE_REASONS", "Quota", "QuotaQueue", "check_quotas"]

#: Eviction reason: the block's group is at or over its cap.
CAP = "cap"
#: Eviction reason: the block was within its group's floor, and nothing else was left.
FLOOR_PRESSURE = "floor_pressure"
#: The reasons of an eviction the pool chose under allocation pressure (not a
#: caller's evict or revoke): these are the ones offered to offload tiers.
PRESSURE_REASONS = frozenset({CAPACITY, PRIORITY, CAP, FLOOR_PRESSURE})


@dataclass(frozen=True, slots=True)
class Quota:
    """One group's floor and cap, in blocks.

    Attributes:
        floor: CACHED blocks kept unless nothing else can be evicted (0: none).
        cap: the most CACHED blocks the group keeps (None: no cap).
    """

    floor: int = 0
    cap: int | None = None


def check_quotas(quotas: Mapping[str, Quota], num_blocks: int) -> dict[str, Quota]:
    """Validate quotas against a pool of ``num_blocks`` blocks.

    Args:
        quotas: group -> quota.
        num_blocks: the pool's size.

    Returns:
        A copy, as a plain dict.

    Raises:
        InvalidQuota: a group is not a non-empty string, a floor or cap is not a
            non-negative int, a floor is above its cap, or the floors add up to more
            than the pool.
    """
    out: dict[str, Quota] = {}
    for group, q in quotas.items():
        if not isinstance(group, str) or not group:
            raise InvalidQuota(group, "a quota's group must be a non-empty string")
        if not isinstance(q, Quota):
            raise InvalidQuota(group, f"expected a Quota, got {type(q).__name__}")
        if type(q.floor) is not int or q.floor < 0:
            raise InvalidQuota(group, f"floor {q.floor!r} is not a non-negative int")
        if q.cap is not None and (type(q.cap) is not int or q.cap < 0):
            raise InvalidQuota(group, f"cap {q.cap!r} is not a non-negative int")
        if q.cap is not None and q.floor > q.cap:
            raise InvalidQuota(group, f"floor {q.floor} is above its cap {q.cap}")
        out[group] = q
    total = sum(q.floor for q in out.values())
    if total > num_blocks:
        raise InvalidQuota(
            None, f"the floors add up to {total} blocks, more than the pool's {num_blocks}"
        )
    return out


class QuotaQueue:
    """CACHED blocks per group, in eviction order, with floors and caps.

    It has :class:`~kvgov.allocator.eviction.EvictionQueue`'s interface (so the
    pool's lookup, evict and invariant checks are unchanged) plus
    :meth:`choose` (victims for an allocation) and :meth:`excess` (a group over
    its cap). Groups are small ints (0: no group) that the pool maps from names;
    ``groups`` is the pool's per-block group array, read when a block is queued.

    Not thread safe on its own: the pool calls it under its lock.
    """

    __slots__ = ("_clock", "_groups", "_queues", "_quotas", "_size", "_stamp")

    def __init__(self, groups: list[int], num_blocks: int, quotas: Mapping[int, Quota]) -> None:
        self._groups = groups
        self._queues: dict[int, EvictionQueue] = {}
        self._stamp = [0] * num_blocks
        self._clock = 0
        self._quotas = dict(quotas)
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[int]:
        """Yield block ids in plain eviction order (priority, then age), ignoring quotas."""
        stamp = self._stamp
        keyed = [(p, stamp[b], b) for p, ids in self._merged().items() for b in ids]
        for _, _, b in sorted(keyed):
            yield b

    def _merged(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for q in self._queues.values():
            for p, level in q.levels().items():
                out.setdefault(p, []).extend(level)
        stamp = self._stamp
        for ids in out.values():
            ids.sort(key=stamp.__getitem__)
        return out

    def levels(self) -> dict[int, tuple[int, ...]]:
        """Each non-empty priority level and its block ids, oldest first (all groups)."""
        return {p: tuple(ids) for p, ids in sorted(self._merged().items())}

    def count(self, group: int) -> int:
        """How many CACHED blocks ``group`` has."""
        q = self._queues.get(group)
        return len(q) if q is not None else 0

    def counts(self) -> dict[int, int]:
        """CACHED blocks per group that has any."""
        return {g: len(q) for g, q in self._queues.items() if q}

    def extend(self, block_ids: Iterable[int], priority: bytearray) -> None:
        """Queue blocks that just became CACHED, most recently used last."""
        ids = list(block_ids)
        if not ids:
            return
        groups = self._groups
        stamp = self._stamp
        clock = self._clock
        for b in ids:
            stamp[b] = clock
            clock += 1
        self._clock = clock
        g0 = groups[ids[0]]
        if all(groups[b] == g0 for b in ids):
            self._queue(g0).extend(ids, priority)
        else:
            for b in ids:
                self._queue(groups[b]).extend((b,), priority)
        self._size += len(ids)

    def _queue(self, group: int) -> EvictionQueue:
        q = self._queues.get(group)
        if q is None:
            q = self._queues[group] = EvictionQueue()
        return q

    def remove(self, block_id: int, priority: int) -> None:
        """Take one block out (a hit, an evict, a revoke): O(1)."""
        self._queues[self._groups[block_id]].remove(block_id, priority)
        self._size -= 1

    def pop(self, n: int) -> list[int]:
        """Remove and return ``n`` blocks in plain eviction order, ignoring quotas (close)."""
        if n > self._size:
            raise ValueError(f"cannot pop {n} blocks from a queue of {self._size}")
        batches: list[tuple[str, list[int]]] = []
        self._merge(n, {g: len(q) for g, q in self._queues.items()}, 0, batches, CAPACITY)
        return [b for _, ids in batches for b in ids]

    def excess(self, group: int) -> int:
        """How many CACHED blocks ``group`` holds beyond its cap (0 when none)."""
        quota = self._quotas.get(group)
        if quota is None or quota.cap is None:
            return 0
        return max(0, self.count(group) - quota.cap)

    def take_own(self, group: int, n: int) -> list[int]:
        """Remove and return ``group``'s next ``n`` blocks in eviction order (its cap)."""
        q = self._queues[group]
        out = q.pop(n)
        self._size -= n
        return out

    def choose(self, n: int, group: int) -> list[tuple[str, list[int]]]:
        """Remove and return ``n`` victims for an allocation by ``group``, by reason.

        Order: ``group``'s own blocks when it is at or over its cap (:data:`CAP`);
        then every group's blocks beyond its floor, lowest priority first and
        oldest first within a priority (``"priority"`` below the highest level
        cached, ``"capacity"`` at it); then blocks within floors, in the same order
        (:data:`FLOOR_PRESSURE`).

        Args:
            n: how many; at most ``len(self)``.
            group: the allocating group (0: none).

        Returns:
            ``(reason, block ids)`` batches in eviction order, no empty batch.
        """
        if n > self._size:
            raise ValueError(f"cannot choose {n} blocks from a queue of {self._size}")
        out: list[tuple[str, list[int]]] = []
        quota = self._quotas.get(group)
        if n and quota is not None and quota.cap is not None and self.count(group) >= quota.cap:
            take = min(n, self.count(group))
            if take:
                out.append((CAP, self.take_own(group, take)))
                n -= take
        if not n:
            return out
        tops = [t for q in self._queues.values() if (t := q.top()) is not None]
        top = max(tops)
        quotas = self._quotas
        spare = {
            g: len(q) - (quotas[g].floor if g in quotas else 0) for g, q in self._queues.items()
        }
        n = self._merge(n, spare, top, out, reason=None)
        if n:
            spare = {g: len(q) for g, q in self._queues.items()}
            self._merge(n, spare, top, out, reason=FLOOR_PRESSURE)
        return out

    def _merge(
        self,
        n: int,
        spare: dict[int, int],
        top: int,
        out: list[tuple[str, list[int]]],
        reason: str | None,
    ) -> int:
        """Pop up to ``n`` blocks across groups in (priority, stamp) order, each group
        giving at most its ``spare``; append them to ``out`` by reason; return how
        many are still wanted."""
        stamp = self._stamp
        queues = self._queues
        heap: list[tuple[int, int, int]] = []
        for g, s in spare.items():
            if s > 0:
                p, b = queues[g].head()
                heap.append((p, stamp[b], g))
        heapq.heapify(heap)
        while n and heap:
            p, _, g = heapq.heappop(heap)
            q = queues[g]
            b = q.popleft()
            self._size -= 1
            n -= 1
            why = reason or (PRIORITY if p < top else CAPACITY)
            if out and out[-1][0] == why:
                out[-1][1].append(b)
            else:
                out.append((why, [b]))
            spare[g] -= 1
            if spare[g] > 0 and q:
                p2, b2 = q.head()
                heapq.heappush(heap, (p2, stamp[b2], g))
        return n
