"""Retention deadlines of cached blocks: :class:`Deadlines`.

The retention policy gives a scope a time to live; a block of that scope may
stay CACHED (unreferenced, reachable by key) for that long after its last
release, and a hit restarts the clock. No pool a serving engine ships keeps
deadlines (vLLM's does not), so the governor keeps them, fed by the pool's
events, and evicts what is due through the pool's ``evict``::

    set_keys  -> keyed(ids, ttl)     remember each block's ttl
    free      -> BlocksCached(ids)   -> cached(ids): deadline = now + ttl
    lookup    -> (nothing)           a hit leaves the deadline stale, see below
    sweep     -> due(now)            -> pool.evict(ids, "expired")

Why a heap of batches: a release caches a sequence's blocks together with one
ttl, so one heap entry ``(deadline, block ids)`` per batch makes a 1,000-block
release one push instead of 1,000. Entries are never removed from the middle:
an entry is stale when its block has been cached again since (its current
deadline differs) and is skipped when popped; a block hit since is still a
candidate, and the pool's ``evict`` ignores it because it is OWNED. When the
heap outgrows twice the pool it is rebuilt from the current deadlines only,
so it stays within ``2 * num_blocks + 64`` entries.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable, Iterable, Sequence

from kvgov.exceptions import InternalError, InvalidArgument

from . import native

__all__ = ["Deadlines"]

_INF = math.inf


class Deadlines:
    """Per-block retention (ttl and current deadline) and a heap of due times.

    Only the governor, under its lock, uses it.

    Args:
        num_blocks: blocks in the pool.
        clock: seconds; deadlines are read off it when blocks become CACHED.
    """

    __slots__ = ("_clock", "_deadline", "_heap", "_limit", "_ttl")

    def __init__(self, num_blocks: int, clock: Callable[[], float]) -> None:
        self._clock = clock
        # Seconds a block may stay CACHED, or None for no limit; set when it is keyed.
        self._ttl: list[float | None] = [None] * num_blocks
        # When the block's current CACHED spell ends; inf while it has none.
        self._deadline: list[float] = [_INF] * num_blocks
        self._heap: list[tuple[float, tuple[int, ...]]] = []
        self._limit = 2 * num_blocks + 64

    def keyed(self, block_ids: Sequence[int], ttl: float | None) -> None:
        """Blocks were given keys with this retention (None: no deadline).

        Raises:
            InvalidArgument: ``ttl`` is negative or not a finite number.
        """
        if ttl is not None and (
            isinstance(ttl, bool)
            or not isinstance(ttl, int | float)
            or not math.isfinite(ttl)
            or ttl < 0
        ):
            raise InvalidArgument("ttl", ttl, "None or a finite number of seconds >= 0")
        native.assign(self._ttl, block_ids, ttl)

    def keyed_cached(self, block_ids: Sequence[int], ttl: float | None) -> None:
        """Blocks were keyed with this retention and are CACHED now: :meth:`keyed`, then
        :meth:`cached` (one heap entry), for a pool whose blocks are cached as they are keyed.

        Raises:
            InvalidArgument: ``ttl`` is negative or not a finite number.
        """
        if ttl is None or not block_ids:
            self.keyed(block_ids, ttl)
            return
        if type(ttl) is not float or not 0.0 <= ttl < _INF:  # nan fails both: checked there
            self.keyed((), ttl)  # raises for a bad ttl, as keyed does
        d = self._clock() + ttl
        native.assign(self._ttl, block_ids, ttl)
        native.assign(self._deadline, block_ids, d)
        heap = self._heap
        heapq.heappush(heap, (d, tuple(block_ids)))
        if len(heap) > self._limit:
            self._rebuild()

    def moved(self, src: int, dst: int) -> None:
        """Block ``src``'s keys moved to ``dst`` (a copy-on-write): ``dst`` takes its ttl."""
        self._ttl[dst] = self._ttl[src]

    def cached(self, block_ids: Sequence[int]) -> None:
        """Blocks just became CACHED: their deadlines start now."""
        ttls = self._ttl
        wanted = list(map(ttls.__getitem__, block_ids))
        if wanted.count(None) == len(wanted):
            return
        groups: dict[float, list[int]] = {}
        if wanted.count(wanted[0]) == len(wanted):
            groups[wanted[0]] = list(block_ids)  # type: ignore[index]  # not None: checked above
        else:
            for b, t in zip(block_ids, wanted, strict=True):
                if t is not None:
                    groups.setdefault(t, []).append(b)
        deadline = self._deadline
        heap = self._heap
        now = self._clock()
        for t, group in groups.items():
            d = now + t
            for b in group:
                deadline[b] = d
            heapq.heappush(heap, (d, tuple(group)))
        if len(heap) > self._limit:
            self._rebuild()

    def deadline(self, block_id: int) -> float:
        """When the block's current CACHED spell ends (seconds); inf while it has none."""
        return self._deadline[block_id]

    def next_due(self) -> float:
        """The earliest pending deadline (``inf`` with none): a sweep is due once it is past.

        Stale entries may make it early, never late; a sweep then finds nothing.
        """
        return self._heap[0][0] if self._heap else _INF

    def due(self, now: float) -> list[int]:
        """Pop every block whose current deadline is ``<= now``, earliest first.

        The caller evicts them; those no longer CACHED (hit since) are left alone
        by the pool and get a new deadline at their next release.
        """
        heap = self._heap
        deadline = self._deadline
        out: list[int] = []
        while heap and heap[0][0] <= now:
            d, group = heapq.heappop(heap)
            for b in group:
                if deadline[b] == d:
                    deadline[b] = _INF
                    out.append(b)
        return out

    def _rebuild(self) -> None:
        """Keep one entry per current deadline; drop the superseded ones."""
        groups: dict[float, list[int]] = {}
        for b, d in enumerate(self._deadline):
            if d != _INF:
                groups.setdefault(d, []).append(b)
        heap = [(d, tuple(group)) for d, group in groups.items()]
        heapq.heapify(heap)
        self._heap = heap

    def _check_invariants(self, cached: Iterable[int]) -> None:
        """Every CACHED block with a ttl has a deadline and a heap entry for it.

        Raises:
            InternalError: it does not (a bug in kvgov).
        """
        live = {(d, b) for d, group in self._heap for b in group}
        for b in cached:
            if self._ttl[b] is not None and (self._deadline[b], b) not in live:
                raise InternalError(f"CACHED block {b} has a ttl but no pending deadline")
