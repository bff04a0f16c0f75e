"""The queue of CACHED blocks in eviction order: :class:`EvictionQueue`."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Iterator
from itertools import islice

__all__ = ["CAPACITY", "PRIORITY", "EvictionQueue"]

#: Eviction reason: allocation pressure took the least recently used block of the
#: highest priority level present (or every level is the same).
CAPACITY = "capacity"
#: Eviction reason: allocation pressure took a block because its priority is lower
#: than that of other cached blocks that stay.
PRIORITY = "priority"


class EvictionQueue:
    """CACHED blocks in eviction order: lowest priority first, least recently used within one.

    Why this structure: eviction pops from the least-recently-used end, caching a
    block appends at the other, and a prefix hit must pull a block out of the
    *middle* of the queue (it is OWNED again and must not be evicted). A
    ``deque`` removes from the middle in O(n); vLLM therefore hand-writes a
    doubly linked list (``FreeKVCacheBlockQueue``). An ``OrderedDict`` *is* a
    doubly linked list plus a hash map, implemented in C: append
    (``q[b] = None``), pop-front (``popitem(last=False)``) and removal by block
    id (``del q[b]``) are all O(1) and allocate no per-block Python node that
    we manage. One ``OrderedDict`` per priority level that has blocks (at most
    101 levels, 0..100); the lowest non-empty level is found with ``min`` over
    the levels present, which is a handful in practice and at most 101.

    Invariants: a block id appears in at most one level; no level is empty;
    ``len(self)`` equals the total number of ids held.

    Not thread safe on its own: the pool calls it under its lock.
    """

    __slots__ = ("_levels", "_size")

    def __init__(self) -> None:
        self._levels: dict[int, OrderedDict[int, None]] = {}
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[int]:
        """Yield block ids in the order they would be evicted."""
        for priority in sorted(self._levels):
            yield from self._levels[priority]

    def levels(self) -> dict[int, tuple[int, ...]]:
        """Return each non-empty priority level and its block ids, LRU first.

        Returns:
            A snapshot mapping priority to block ids.
        """
        return {p: tuple(q) for p, q in sorted(self._levels.items())}

    def extend(self, block_ids: Iterable[int], priority: bytearray) -> None:
        """Append blocks at the most-recently-used end of their level, in the given order.

        Args:
            block_ids: blocks that just became CACHED (not already queued).
            priority: the pool's per-block priority array.
        """
        levels = self._levels
        ids = block_ids if isinstance(block_ids, list | tuple) else list(block_ids)
        if not ids:
            return
        # One priority for the whole batch is the rule (a sequence's blocks): then
        # the level is found once. (A plain loop of stores beats OrderedDict.update,
        # which goes through the generic mapping protocol per key.)
        wanted = bytes(map(priority.__getitem__, ids))
        p = wanted[0]
        if wanted.count(p) == len(ids):
            q = levels.get(p)
            if q is None:
                q = levels[p] = OrderedDict()
            for b in ids:
                q[b] = None
        else:
            for b, p in zip(ids, wanted, strict=True):
                q = levels.get(p)
                if q is None:
                    q = levels[p] = OrderedDict()
                q[b] = None
        self._size += len(ids)

    def remove(self, block_id: int, priority: int) -> None:
        """Take one block out of the queue, wherever it is (O(1)).

        Args:
            block_id: a queued block.
            priority: the level it was queued at.

        Raises:
            KeyError: the block is not queued at that level (a caller bug).
        """
        q = self._levels[priority]
        del q[block_id]
        if not q:
            del self._levels[priority]
        self._size -= 1

    def pop(self, n: int) -> list[int]:
        """Remove and return the next ``n`` blocks in eviction order.

        Args:
            n: how many; at most ``len(self)``.

        Returns:
            The block ids, first evicted first.

        Raises:
            ValueError: ``n`` is more than the queue holds (a caller bug).
        """
        if n > self._size:
            raise ValueError(f"cannot pop {n} blocks from a queue of {self._size}")
        out: list[int] = []
        levels = self._levels
        while len(out) < n:
            _take_oldest(levels, min(levels), n - len(out), out)
        self._size -= n
        return out

    def head(self) -> tuple[int, int]:
        """Return ``(priority, block id)`` of the next block to evict, without removing it.

        Raises:
            ValueError: the queue is empty (a caller bug).
        """
        if not self._levels:
            raise ValueError("head of an empty eviction queue")
        priority = min(self._levels)
        return priority, next(iter(self._levels[priority]))

    def popleft(self) -> int:
        """Remove and return the next block in eviction order (O(levels)).

        Raises:
            ValueError: the queue is empty (a caller bug).
        """
        priority, b = self.head()
        q = self._levels[priority]
        del q[b]
        if not q:
            del self._levels[priority]
        self._size -= 1
        return b

    def top(self) -> int | None:
        """The highest priority level that holds a block, or None when empty."""
        return max(self._levels) if self._levels else None

    def pop_reasoned(self, n: int) -> list[tuple[str, list[int]]]:
        """:meth:`pop` ``n`` blocks, split by why each goes.

        A block below the highest level present goes for its priority
        (:data:`PRIORITY`); one at the highest level for capacity (:data:`CAPACITY`).
        With one level (every cached block at the same priority, the default
        policy) this is one :meth:`pop` and one batch.

        Args:
            n: how many; at most ``len(self)``.

        Returns:
            ``(reason, block ids)`` batches, first evicted first, no empty batch.

        Raises:
            ValueError: ``n`` is more than the queue holds (a caller bug).
        """
        levels = self._levels
        if len(levels) <= 1:
            return [(CAPACITY, self.pop(n))] if n else []
        if n > self._size:
            raise ValueError(f"cannot pop {n} blocks from a queue of {self._size}")
        top = max(levels)
        # Below the top, level by level (one, as a rule: the lowest holds enough); no
        # count of what is below the top first, which would visit every level.
        low: list[int] = []
        while len(low) < n:
            priority = min(levels)
            if priority == top:
                break
            _take_oldest(levels, priority, n - len(low), low)
        self._size -= len(low)
        out = [(PRIORITY, low)] if low else []
        if len(low) < n:
            out.append((CAPACITY, self.pop(n - len(low))))
        return out


def _take_oldest(
    levels: dict[int, OrderedDict[int, None]], priority: int, want: int, out: list[int]
) -> None:
    """Move up to ``want`` of level ``priority``'s blocks, oldest first, into ``out``; a
    level emptied is dropped."""
    q = levels[priority]
    if want >= len(q):
        out.extend(q)
        del levels[priority]
    else:
        head = list(islice(q, want))
        for b in head:
            del q[b]
        out.extend(head)
