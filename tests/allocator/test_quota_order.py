"""QuotaQueue's eviction order against a model written the plain way (sorting).

The model keeps every CACHED block with its group, priority and a stamp taken when
it is queued, and answers every question by sorting them: a group's own order is
(priority, stamp); victims beyond floors are the first ``count - floor`` blocks of
each group's own order, merged by (priority, stamp); then the blocks within floors
in the same order. :class:`~kvgov.allocator.quota.QuotaQueue` must give the same
blocks, in the same order, for the same reasons, under random traffic: batches of
one group or of several, at one priority or several, hits in the middle, caps,
floors and both.
"""

from __future__ import annotations

import random

import pytest

from kvgov.allocator.eviction import CAPACITY, PRIORITY
from kvgov.allocator.quota import CAP, FLOOR_PRESSURE, Quota, QuotaQueue

N = 96
QUOTAS: dict[str, dict[int, Quota]] = {
    "none": {},
    "caps": {1: Quota(cap=12), 2: Quota(cap=5)},
    "floors": {3: Quota(floor=14), 4: Quota(floor=6)},
    "both": {1: Quota(cap=14), 2: Quota(floor=9, cap=20), 3: Quota(floor=12)},
    "zero cap": {1: Quota(cap=0), 2: Quota(floor=4)},
}
GROUPS = (0, 1, 2, 3, 4)
PRIORITIES = (0, 10, 50, 50, 90, 100)


class Model:
    """Every CACHED block: id -> (group, priority, stamp); questions answered by sorting."""

    def __init__(self, quotas: dict[int, Quota]) -> None:
        self.quotas = quotas
        self.blocks: dict[int, tuple[int, int, int]] = {}
        self.clock = 0

    def extend(self, ids: list[int], group: list[int], prio: bytearray) -> None:
        for b in ids:
            self.blocks[b] = (group[b], prio[b], self.clock)
            self.clock += 1

    def remove(self, b: int) -> None:
        del self.blocks[b]

    def order(self, group: int | None = None) -> list[int]:
        items = [(p, s, b) for b, (g, p, s) in self.blocks.items() if group in (None, g)]
        return [b for _, _, b in sorted(items)]

    def count(self, group: int) -> int:
        return sum(1 for g, _, _ in self.blocks.values() if g == group)

    def excess(self, group: int) -> int:
        q = self.quotas.get(group)
        return 0 if q is None or q.cap is None else max(0, self.count(group) - q.cap)

    def take_own(self, group: int, n: int) -> list[int]:
        out = self.order(group)[:n]
        for b in out:
            del self.blocks[b]
        return out

    def choose(self, n: int, group: int) -> list[tuple[str, list[int]]]:
        out: list[tuple[str, list[int]]] = []

        def add(reason: str, b: int) -> None:
            if out and out[-1][0] == reason:
                out[-1][1].append(b)
            else:
                out.append((reason, [b]))

        q = self.quotas.get(group)
        if n and q is not None and q.cap is not None and self.count(group) >= q.cap:
            for b in self.take_own(group, min(n, self.count(group))):
                add(CAP, b)
                n -= 1
        if not n:
            return out
        top = max(p for _, p, _ in self.blocks.values())
        eligible: list[tuple[int, int, int]] = []
        for g in {g for g, _, _ in self.blocks.values()}:
            floor = self.quotas[g].floor if g in self.quotas else 0
            own = self.order(g)
            spare = max(0, len(own) - floor)
            eligible.extend((self.blocks[b][1], self.blocks[b][2], b) for b in own[:spare])
        for p, _, b in sorted(eligible)[:n]:
            del self.blocks[b]
            add(PRIORITY if p < top else CAPACITY, b)
            n -= 1
        for b in self.order()[:n]:
            del self.blocks[b]
            add(FLOOR_PRESSURE, b)
        return out


@pytest.mark.parametrize("quotas", list(QUOTAS), ids=list(QUOTAS))
@pytest.mark.parametrize("seed", range(8))
def test_quota_queue_chooses_what_sorting_would(quotas: str, seed: int) -> None:
    rng = random.Random(seed)
    group = [0] * N
    prio = bytearray([50]) * N
    queue = QuotaQueue(group, N, QUOTAS[quotas])
    model = Model(QUOTAS[quotas])
    free = list(range(N))
    rng.shuffle(free)
    for _ in range(600):
        roll = rng.random()
        if free and roll < 0.5:  # a batch becomes CACHED: one group and priority, or mixed
            k = min(len(free), rng.randint(1, 8))
            ids = [free.pop() for _ in range(k)]
            mixed = rng.random() < 0.25
            g, p = rng.choice(GROUPS), rng.choice(PRIORITIES)
            for b in ids:
                group[b] = rng.choice(GROUPS) if mixed else g
                prio[b] = rng.choice(PRIORITIES) if mixed else p
            queue.extend(ids, prio)
            model.extend(ids, group, prio)
            for gid in dict.fromkeys(group[b] for b in ids):
                excess = queue.excess(gid)
                assert excess == model.excess(gid)
                if excess:
                    assert queue.take_own(gid, excess) == model.take_own(gid, excess)
        elif model.blocks and roll < 0.65:  # a hit in the middle
            b = rng.choice(sorted(model.blocks))
            queue.remove(b, prio[b])
            model.remove(b)
        elif model.blocks:  # an allocation evicts
            n = rng.randint(1, min(12, len(model.blocks)))
            g = rng.choice(GROUPS)
            assert queue.choose(n, g) == model.choose(n, g)
        queue.check()
        assert len(queue) == len(model.blocks)
        assert list(queue) == model.order()
        for g in GROUPS:
            assert queue.count(g) == model.count(g)
        free = sorted(set(range(N)) - model.blocks.keys())  # the rest are free again
        rng.shuffle(free)
    rest = queue.pop(len(queue))
    assert rest == model.order()


def test_a_list_that_empties_and_refills_again_and_again_keeps_one_current_heap_entry() -> None:
    """A group's list that a hit empties and a free fills, over and over (no allocation
    in between to clean the heap), leaves stale heap entries; the heap is rebuilt from
    the lists' heads before they outnumber them, and the order stays sorting's."""
    group = [0] * N
    prio = bytearray([10]) * N
    quotas = {1: Quota(floor=2), 2: Quota(cap=40)}
    queue = QuotaQueue(group, N, quotas)
    model = Model(quotas)
    for b in range(8):  # group 2 holds blocks at the same priority throughout
        group[b] = 2
    queue.extend(list(range(8)), prio)
    model.extend(list(range(8)), group, prio)
    for i in range(200):
        b = 8 + i % 4
        group[b] = 1
        queue.extend([b], prio)
        model.extend([b], group, prio)
        queue.remove(b, prio[b])  # a hit: group 1's list is empty again
        model.remove(b)
        queue.check()
    queue.extend([20, 21, 22], prio)
    model.extend([20, 21, 22], group, prio)
    assert queue.choose(9, 0) == model.choose(9, 0)
    queue.check()
