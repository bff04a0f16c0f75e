"""Tests for allocator.eviction: priority then LRU order, O(1) removal from the middle."""

from __future__ import annotations

import random

import pytest

from kvgov.allocator.eviction import CAPACITY, PRIORITY, EvictionQueue


def _prio(values: dict[int, int], size: int = 16) -> bytearray:
    prio = bytearray([50]) * size
    for b, p in values.items():
        prio[b] = p
    return prio


def test_pop_is_lru_within_a_priority() -> None:
    """Blocks of one priority leave in the order they were queued."""
    q = EvictionQueue()
    q.extend([3, 1, 2], _prio({}))
    assert q.pop(3) == [3, 1, 2]
    assert len(q) == 0


def test_lower_priority_goes_first() -> None:
    """All blocks of a lower priority are evicted before any of a higher one."""
    q = EvictionQueue()
    prio = _prio({1: 90, 2: 10, 3: 50, 4: 10, 5: 0})
    q.extend([1, 2, 3, 4, 5], prio)
    assert list(q) == [5, 2, 4, 3, 1]
    assert q.pop(2) == [5, 2]
    assert q.pop(3) == [4, 3, 1]


def test_pop_spans_levels_and_leaves_rest() -> None:
    """A pop larger than the lowest level continues into the next level."""
    q = EvictionQueue()
    q.extend([1, 2], _prio({1: 1, 2: 1, 3: 2, 4: 2}))
    q.extend([3, 4], _prio({1: 1, 2: 1, 3: 2, 4: 2}))
    assert q.pop(3) == [1, 2, 3]
    assert q.levels() == {2: (4,)}


def test_remove_from_the_middle() -> None:
    """Removing a block from the middle keeps the order of the others."""
    q = EvictionQueue()
    q.extend([1, 2, 3], _prio({}))
    q.remove(2, 50)
    assert list(q) == [1, 3]
    assert len(q) == 2


def test_removing_last_block_of_a_level_drops_the_level() -> None:
    """A level with no blocks left disappears."""
    q = EvictionQueue()
    q.extend([1], _prio({1: 7}))
    q.remove(1, 7)
    assert q.levels() == {}


def test_requeued_block_goes_to_the_mru_end() -> None:
    """A block removed and queued again is evicted last."""
    q = EvictionQueue()
    q.extend([1, 2, 3], _prio({}))
    q.remove(1, 50)
    q.extend([1], _prio({}))
    assert q.pop(3) == [2, 3, 1]


def test_pop_more_than_held_is_a_bug() -> None:
    """Popping more blocks than are queued raises ValueError and changes nothing."""
    q = EvictionQueue()
    q.extend([1], _prio({}))
    with pytest.raises(ValueError):
        q.pop(2)
    assert list(q) == [1]


def test_remove_unqueued_block_is_a_bug() -> None:
    """Removing a block that is not queued at that level raises KeyError."""
    q = EvictionQueue()
    with pytest.raises(KeyError):
        q.remove(1, 50)


@pytest.mark.parametrize("seed", range(6))
def test_pop_reasoned_takes_what_sorting_would_with_its_reasons(seed: int) -> None:
    """Random queues and takes: pop_reasoned gives the blocks of plain (priority, age)
    order, those below the highest level present as "priority", the rest "capacity"."""
    rng = random.Random(seed)
    n_blocks = 64
    prio = bytearray([50]) * n_blocks
    q = EvictionQueue()
    queued: list[int] = []  # oldest first
    free = list(range(n_blocks))
    for _ in range(300):
        if free and rng.random() < 0.55:
            ids = [free.pop(rng.randrange(len(free))) for _ in range(min(len(free), 4))]
            for b in ids:
                prio[b] = rng.choice((0, 10, 50, 90, 100))
            q.extend(ids, prio)
            queued.extend(ids)
        elif queued:
            n = rng.randint(0, min(10, len(queued)))
            order = sorted(queued, key=lambda b: (prio[b], queued.index(b)))[:n]
            top = max(prio[b] for b in queued)
            want: list[tuple[str, list[int]]] = []
            for b in order:
                why = PRIORITY if prio[b] < top else CAPACITY
                if want and want[-1][0] == why:
                    want[-1][1].append(b)
                else:
                    want.append((why, [b]))
            assert q.pop_reasoned(n) == want
            for b in order:
                queued.remove(b)
                free.append(b)
        assert len(q) == len(queued)
