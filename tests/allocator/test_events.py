"""Tests for allocator.events: events are small immutable objects read by name."""

from __future__ import annotations

import pytest

from kvgov.allocator.events import (
    BlocksAllocated,
    BlocksEvicted,
    BlocksHit,
    BlocksKeyed,
    BlocksZeroized,
)


@pytest.mark.parametrize(
    "event",
    [
        BlocksAllocated((1, 2)),
        BlocksKeyed((1,)),
        BlocksHit((3,)),
        BlocksEvicted((4,), (b"k",), "capacity"),
        BlocksZeroized((5, 6), 64, "cpu", 0.001),
    ],
)
def test_events_are_frozen(event: object) -> None:
    """No event field can be reassigned."""
    with pytest.raises(AttributeError):
        event.block_ids = ()  # type: ignore[attr-defined]


def test_events_use_slots() -> None:
    """Events carry no per-instance __dict__."""
    assert not hasattr(BlocksZeroized((1,), 1, "cpu", 0.0), "__dict__")


def test_events_compare_by_value() -> None:
    """Two events with the same fields are equal."""
    assert BlocksEvicted((1,), (b"a",), "expired") == BlocksEvicted((1,), (b"a",), "expired")


def test_events_of_different_types_never_compare_equal() -> None:
    """Same fields, different event type: not equal, and distinct in a set."""
    allocated, hit = BlocksAllocated((1, 2)), BlocksHit((1, 2))
    assert allocated != hit
    assert not allocated == hit  # noqa: SIM201 - __eq__ itself is under test
    assert len({allocated, hit, BlocksAllocated((1, 2))}) == 2
    assert hash(allocated) == hash(BlocksAllocated((1, 2)))
