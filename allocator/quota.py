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

Structure: one ``OrderedDict`` of block ids (oldest first) per (group, priority)
that holds blocks, filed by priority; the priorities that hold blocks in a sorted
list (the highest is the top, for the reasons); a count per group; a stamp per
block (a counter taken when it is queued, kept as its value in its list) that
orders blocks of different groups within a priority; and per priority a heap of
its lists' heads by stamp, kept from one allocation to the next (an entry is
brought up to date only when it reaches the top). Choosing ``n`` victims walks the
priorities up from the lowest; where several groups' lists are eligible at one, it
takes *runs* off the heap: the list with the oldest head gives every block older
than the next list's head in one go (a request's blocks are queued together, so a
run is usually the whole request). Cost: O(r log L + n) for r runs from L lists,
never a scan of the cache, and no work for a list that gives nothing.
"""

from __future__ import annotations

import heapq
from bisect import insort
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from itertools import islice

from kvgov.exceptions import InternalError, InvalidQuota

from .eviction import CAPACITY, PRIORITY

__all__ = ["CAP", "FLOOR_PRESSURE", "PRESSURE_REASONS", "Quota", "QuotaQueue", "check_quotas"]

#: A list's key in QuotaQueue._mark is ``group * _SPAN + priority`` (priorities are 0..100).
_SPAN = 128

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

    __slots__ = (
        "_caps",
        "_clock",
        "_count",
        "_floors",
        "_groups",
        "_heads",
        "_live",
        "_mark",
        "_over",
        "_prios",
        "_quotas",
        "_size",
    )

    def __init__(self, groups: list[int], num_blocks: int, quotas: Mapping[int, Quota]) -> None:
        self._groups = groups
        self._clock = 0
        self._quotas = dict(quotas)
        #: group -> its floor (groups with one) and its cap (groups with one)
        self._floors = {g: q.floor for g, q in quotas.items() if q.floor}
        self._caps = {g: q.cap for g, q in quotas.items() if q.cap is not None}
        #: priority -> group -> that group's blocks at that priority, oldest first, each
        #: with its stamp (only lists that hold blocks, only priorities that hold lists)
        self._live: dict[int, dict[int, OrderedDict[int, int]]] = {}
        #: the priorities of _live, ascending
        self._prios: list[int] = []
        #: priority -> a heap of (stamp, group) of that priority's lists, each list's
        #: entry no newer than its head (kept lazily: a list's entry is fixed when it
        #: reaches the top, see _clean), and _mark: per list (group * _SPAN + priority)
        #: the stamp of its one current entry (others are stale and dropped on sight)
        self._heads: dict[int, list[tuple[int, int]]] = {}
        self._mark: dict[int, int] = {}
        #: group -> its CACHED blocks
        self._count: dict[int, int] = {}
        #: whether a group went over its cap since :meth:`went_over` last looked
        self._over = False
        self._size = 0

    def __len__(self) -> int:
        return self._size

    def __iter__(self) -> Iterator[int]:
        """Yield block ids in plain eviction order (priority, then age), ignoring quotas."""
        for ids in self._merged().values():
            yield from ids

    def _merged(self) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for p in self._prios:
            stamped = sorted((s, b) for q in self._live[p].values() for b, s in q.items())
            out[p] = [b for _, b in stamped]
        return out

    def levels(self) -> dict[int, tuple[int, ...]]:
        """Each non-empty priority level and its block ids, oldest first (all groups)."""
        return {p: tuple(ids) for p, ids in self._merged().items()}

    def check(self) -> None:
        """Every list that holds blocks is filed at its priority, counted, and has its one
        current heap entry, no newer than its head; nothing else is filed.

        Raises:
            InternalError: it is not so (a bug in kvgov).
        """
        counts: dict[int, int] = {}
        marks: dict[int, int] = {}
        for p, live in self._live.items():
            heads = set(self._heads.get(p, ()))
            for g, q in live.items():
                key = g * _SPAN + p
                s = self._mark.get(key)
                if not q or s is None or (s, g) not in heads or s > next(iter(q.values())):
                    raise InternalError(f"group {g}'s list at priority {p} is misfiled")
                counts[g] = counts.get(g, 0) + len(q)
                marks[key] = s
        if sorted(self._live) != self._prios or set(self._heads) != set(self._live):
            raise InternalError("the quota queue's priorities are misfiled")
        if marks != self._mark or counts != self.counts() or sum(counts.values()) != self._size:
            raise InternalError("the quota queue's counts are wrong")

    def count(self, group: int) -> int:
        """How many CACHED blocks ``group`` has."""
        return self._count.get(group, 0)

    def counts(self) -> dict[int, int]:
        """CACHED blocks per group that has any."""
        return {g: c for g, c in self._count.items() if c}

    def extend(self, block_ids: Iterable[int], priority: bytearray) -> None:
        """Queue blocks that just became CACHED, most recently used last."""
        ids = block_ids if isinstance(block_ids, list) else list(block_ids)
        if not ids:
            return
        groups = self._groups
        clock = self._clock
        self._clock = clock + len(ids)
        g0 = groups[ids[0]]
        wanted = bytes(map(priority.__getitem__, ids))
        p0 = wanted[0]
        if wanted.count(p0) == len(ids) and list(map(groups.__getitem__, ids)).count(g0) == len(
            ids
        ):  # the rule: one request's blocks
            self._put(g0, p0, ids, clock)
            return
        runs: dict[tuple[int, int], list[int]] = {}
        stamps: dict[tuple[int, int], list[int]] = {}
        for i, (b, p) in enumerate(zip(ids, wanted, strict=True)):
            key = (groups[b], p)
            runs.setdefault(key, []).append(b)
            stamps.setdefault(key, []).append(clock + i)
        for (g, p), run in runs.items():
            self._put(g, p, run, stamps[g, p])

    def _put(self, group: int, priority: int, ids: list[int], stamps: int | list[int]) -> None:
        """Append ``ids`` to ``group``'s list at ``priority``, stamped ``stamps`` (the
        first of consecutive stamps, or one each)."""
        live = self._live.get(priority)
        if live is None:
            live = self._live[priority] = {}
            insort(self._prios, priority)
        q = live.get(group)
        new = q is None
        if q is None:
            q = live[group] = OrderedDict()
        if isinstance(stamps, int):
            first = stamps
            # a loop of stores beats OrderedDict.update (see EvictionQueue.extend)
            for b in ids:
                q[b] = stamps
                stamps += 1
        else:
            first = stamps[0]
            for b, st in zip(ids, stamps, strict=True):
                q[b] = st
        if new:  # the list's entry in its priority's heap
            heads = self._heads.get(priority)
            if heads is None:
                heads = self._heads[priority] = []
            self._mark[group * _SPAN + priority] = first
            heapq.heappush(heads, (first, group))
            if len(heads) > 2 * len(live) + 16:  # mostly stale entries: rebuild
                self._reheap(priority)
        n = len(ids)
        self._size += n
        c = self._count.get(group, 0) + n
        self._count[group] = c
        cap = self._caps.get(group)
        if cap is not None and c > cap:
            self._over = True

    def _gone(self, priority: int, group: int) -> None:
        """Group ``group``'s list at ``priority`` is empty: forget it."""
        live = self._live[priority]
        del live[group]
        del self._mark[group * _SPAN + priority]
        if not live:
            del self._live[priority]
            del self._heads[priority]
            self._prios.remove(priority)

    def _reheap(self, priority: int) -> None:
        """Rebuild a priority's heap from its lists' heads (stale entries gone)."""
        mark = self._mark
        heads: list[tuple[int, int]] = []
        for g, q in self._live[priority].items():
            s = next(iter(q.values()))
            mark[g * _SPAN + priority] = s
            heads.append((s, g))
        heapq.heapify(heads)
        self._heads[priority] = heads

    def _clean(self, priority: int, heads: list[tuple[int, int]]) -> tuple[int, int] | None:
        """The heap's top once it is a list's current entry at its head's stamp: stale
        entries dropped, an entry behind its list's head moved up. None: empty."""
        live = self._live.get(priority)
        if live is None:  # the priority's last list just emptied
            return None
        mark = self._mark
        while heads:
            s, g = heads[0]
            key = g * _SPAN + priority
            if mark.get(key) != s:
                heapq.heappop(heads)  # stale: its list emptied or was re-entered since
                continue
            h = next(iter(live[g].values()))
            if h == s:
                return heads[0]
            mark[key] = h
            heapq.heapreplace(heads, (h, g))
        return None

    def _take(self, priority: int, group: int, q: OrderedDict[int, int], n: int) -> list[int]:
        """Remove and return the ``n`` oldest blocks of ``q`` (``group``'s at ``priority``)."""
        if n == len(q):
            ids = list(q)
            self._gone(priority, group)
        else:
            ids = list(islice(q, n))
            for b in ids:
                del q[b]
        self._count[group] -= n
        self._size -= n
        return ids

    def remove(self, block_id: int, priority: int) -> None:
        """Take one block out (a hit, an evict, a revoke): O(1)."""
        g = self._groups[block_id]
        q = self._live[priority][g]
        del q[block_id]
        if not q:
            self._gone(priority, g)
        self._count[g] -= 1
        self._size -= 1

    def pop(self, n: int) -> list[int]:
        """Remove and return ``n`` blocks in plain eviction order, ignoring quotas (close)."""
        if n > self._size:
            raise ValueError(f"cannot pop {n} blocks from a queue of {self._size}")
        batches: list[tuple[str, list[int]]] = []
        self._merge(n, 0, batches, floors=False, reason=CAPACITY)
        return [b for _, ids in batches for b in ids]

    def excess(self, group: int) -> int:
        """How many CACHED blocks ``group`` holds beyond its cap (0 when none)."""
        cap = self._caps.get(group)
        if cap is None:
            return 0
        return max(0, self._count.get(group, 0) - cap)

    def went_over(self) -> bool:
        """Whether a group went over its cap since the last call (then the caller asks
        :meth:`excess` of the groups it queued blocks for); resets the flag."""
        over, self._over = self._over, False
        return over

    def take_own(self, group: int, n: int) -> list[int]:
        """Remove and return ``group``'s next ``n`` blocks in eviction order (its cap)."""
        if n > self._count.get(group, 0):
            raise ValueError(f"cannot take {n} blocks of group {group}")
        out: list[int] = []
        live = self._live
        for p in list(self._prios):  # a copy: a level goes when its last list empties
            q = live[p].get(group)
            if q is not None:
                t = min(n - len(out), len(q))
                out.extend(self._take(p, group, q, t))
                if len(out) == n:
                    break
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
        cap = self._caps.get(group)
        if n and cap is not None:
            have = self._count.get(group, 0)
            if have >= cap:
                take = min(n, have)
                if take:
                    out.append((CAP, self.take_own(group, take)))
                    n -= take
        if not n:
            return out
        top = self._prios[-1]
        n = self._merge(n, top, out, floors=True, reason=None)
        if n:
            self._merge(n, top, out, floors=False, reason=FLOOR_PRESSURE)
        return out

    def _merge(
        self,
        n: int,
        top: int,
        out: list[tuple[str, list[int]]],
        *,
        floors: bool,
        reason: str | None,
    ) -> int:
        """Pop up to ``n`` blocks in (priority, stamp) order across groups, each group
        giving only what is beyond its floor when ``floors``; append them to ``out``
        by reason (``reason``, or by priority against ``top`` when None); return how
        many are still wanted."""
        count = self._count
        floor_of = self._floors if floors else None
        live = self._live
        for p in list(self._prios):  # a copy: a level goes when its last list empties
            why = reason or (PRIORITY if p < top else CAPACITY)
            at = live[p]
            if len(at) == 1:
                ((g, q),) = at.items()
                limit = len(q)
                if floor_of:
                    f = floor_of.get(g)
                    if f and count[g] - f < limit:
                        limit = count[g] - f
                if limit > 0:
                    t = min(n, limit)
                    _add(out, why, self._take(p, g, q, t))
                    n -= t
            else:
                n = self._merge_level(p, n, floor_of, why, out)
            if not n:
                break
        return n

    def _merge_level(
        self,
        priority: int,
        n: int,
        floor_of: dict[int, int] | None,
        why: str,
        out: list[tuple[str, list[int]]],
    ) -> int:
        """Several groups' lists at one priority merged oldest first, a run at a time
        (each group giving only what is beyond its floor when ``floor_of``); returns how
        many blocks are still wanted. The heap of the lists' heads is the priority's
        own, kept between calls: no work per list that gives nothing."""
        count = self._count
        live = self._live[priority]
        heads = self._heads[priority]
        held: list[tuple[int, int]] = []  # lists at their floor, out of the heap meanwhile
        while n:
            top = self._clean(priority, heads)
            if top is None:
                break
            g = top[1]
            q = live[g]
            limit = len(q)
            if floor_of:
                f = floor_of.get(g)
                if f and count[g] - f < limit:
                    limit = count[g] - f
                if limit <= 0:
                    held.append(heapq.heappop(heads))
                    continue
            heapq.heappop(heads)
            most = min(n, limit)
            nxt = self._clean(priority, heads)
            t = most
            if nxt is not None:  # every block older than the next list's head
                bound = nxt[0]
                for i, st in enumerate(q.values()):
                    if i == most or st > bound:
                        t = i
                        break
            left = len(q) - t
            _add(out, why, self._take(priority, g, q, t))
            n -= t
            if left:  # (a list emptied is gone, with its entry)
                s = next(iter(q.values()))
                self._mark[g * _SPAN + priority] = s
                heapq.heappush(heads, (s, g))
        for entry in held:
            heapq.heappush(heads, entry)
        return n


def _add(out: list[tuple[str, list[int]]], reason: str, ids: list[int]) -> None:
    if out and out[-1][0] == reason:
        out[-1][1].extend(ids)
    else:
        out.append((reason, ids))
