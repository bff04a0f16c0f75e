"""Tests for allocator.eviction: priority then LRU order, O(1) removal from the middle."""

from __future__ import annotations

import pytest

from kvgov.allocator.eviction import EvictionQueue


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
