"""The replay floor: older write times refused, floors pruned after their deadline, capped."""

from __future__ import annotations

import pytest

from kvgov.exceptions import ObjectReplayed
from kvgov.offload.replay import ReplayFloor


def test_objects_older_than_the_floor_are_refused() -> None:
    """Below the floor is a replay; at or above it is accepted; floors only rise."""
    floor = ReplayFloor()
    floor.raise_to("t", b"k", 100, 1_000)
    floor.check("t", b"k", 100)
    floor.check("t", b"k", 150)
    floor.check("u", b"k", 1)  # another tier, another floor
    with pytest.raises(ObjectReplayed, match="old copy"):
        floor.check("t", b"k", 99)
    floor.raise_to("t", b"k", 50, 1_000)
    with pytest.raises(ObjectReplayed):
        floor.check("t", b"k", 99)


def test_floors_are_pruned_after_their_latest_deadline() -> None:
    """prune(now) forgets floors whose deadline has passed, and only those."""
    floor = ReplayFloor()
    floor.raise_to("t", b"a", 100, 1_000)
    floor.raise_to("t", b"b", 100, 2_000)
    floor.raise_to("t", b"a", 100, 500)  # the latest deadline is kept
    assert floor.prune(999) == 0 and floor.prune(1_000) == 1 and len(floor) == 1
    floor.check("t", b"a", 1)


def test_the_map_is_capped_dropping_the_floor_raised_longest_ago() -> None:
    """Past max_entries the least recently raised floor goes first."""
    floor = ReplayFloor(max_entries=2)
    floor.raise_to("t", b"a", 100, 1_000)
    floor.raise_to("t", b"b", 100, 1_000)
    floor.raise_to("t", b"a", 101, 1_000)
    floor.raise_to("t", b"c", 100, 1_000)
    assert len(floor) == 2
    floor.check("t", b"b", 1)  # b was dropped
    with pytest.raises(ObjectReplayed):
        floor.check("t", b"a", 1)
