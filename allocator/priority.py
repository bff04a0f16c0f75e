"""Priorities that decay: :class:`Decay`, the blocks whose eviction priority falls
back to the default at a deadline.

A retention priority may come with a duration (TensorRT-LLM's
``KvCacheRetentionConfig`` has the same pair): a system prompt kept at priority 90
for an hour, after which it competes as any other block. The pool records the
deadline when the block is keyed and, before it chooses victims, lowers every
block whose deadline passed to the default priority (:meth:`Decay.due`).

Structure: a heap of ``(deadline, block)`` and a dict of each block's current
deadline. Setting a deadline is O(log n); a block re-keyed or cleared leaves a
stale heap entry that :meth:`Decay.due` skips (its deadline no longer matches),
and the heap is rebuilt when stale entries outnumber live ones. Nothing is
scanned per allocation: :meth:`due` looks at the heap's top only.
"""

from __future__ import annotations

import heapq

__all__ = ["Decay"]


class Decay:
    """Block id -> the time its priority decays to the default. Not thread safe: the
    pool calls it under its lock."""

    __slots__ = ("_at", "_heap")

    def __init__(self) -> None:
        self._heap: list[tuple[float, int]] = []
        self._at: dict[int, float] = {}

    def __bool__(self) -> bool:
        return bool(self._at)

    def __len__(self) -> int:
        return len(self._at)

    def set(self, block_id: int, at: float) -> None:
        """Decay ``block_id`` at time ``at`` (replacing any earlier deadline)."""
        self._at[block_id] = at
        heapq.heappush(self._heap, (at, block_id))
        if len(self._heap) > 2 * len(self._at) + 64:
            self._heap = [(t, b) for b, t in self._at.items()]
            heapq.heapify(self._heap)

    def clear(self, block_id: int) -> None:
        """Forget ``block_id``'s deadline, if any."""
        self._at.pop(block_id, None)

    def when(self, block_id: int) -> float | None:
        """The deadline of ``block_id``, or None."""
        return self._at.get(block_id)

    def due(self, now: float) -> list[int]:
        """Remove and return the blocks whose deadline is at or before ``now``."""
        heap = self._heap
        at = self._at
        out: list[int] = []
        while heap and heap[0][0] <= now:
            t, b = heapq.heappop(heap)
            if at.get(b) == t:
                del at[b]
                out.append(b)
        return out
