"""Tests for allocator.metadata: state codes and the per-block table."""

from __future__ import annotations

import pytest

from kvgov.allocator.metadata import (
    CACHED_CODE,
    DIRTY_CODE,
    FREE_CODE,
    BlockState,
    BlockTable,
    state_of,
)
from kvgov.defaults import DEFAULT_PRIORITY


@pytest.mark.parametrize(
    ("count", "state"),
    [
        (1, BlockState.OWNED),
        (7, BlockState.OWNED),
        (CACHED_CODE, BlockState.CACHED),
        (FREE_CODE, BlockState.FREE),
        (DIRTY_CODE, BlockState.DIRTY),
    ],
)
def test_state_of_decodes_counts(count: int, state: BlockState) -> None:
    """A positive count is OWNED and each code decodes to its state."""
    assert state_of(count) is state


def test_state_of_refuses_unknown_codes() -> None:
    """A count below the DIRTY code is not a state."""
    with pytest.raises(ValueError):
        state_of(DIRTY_CODE - 1)


def test_table_starts_all_free_and_unkeyed() -> None:
    """A new table has every block FREE, unkeyed, at the default priority."""
    table = BlockTable.create(4)
    assert table.count == [FREE_CODE] * 4
    assert table.key == [None] * 4
    assert list(table.priority) == [DEFAULT_PRIORITY] * 4


def test_table_uses_slots() -> None:
    """The table is a slots dataclass (no __dict__)."""
    assert not hasattr(BlockTable.create(1), "__dict__")
