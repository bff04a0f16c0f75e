"""Errors of the block pool (``kvgov.allocator``).

Import them from :mod:`kvgov.exceptions`, never from here.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvgov.exceptions.base import KVGovError


class AllocatorError(KVGovError):
    """Root of errors raised by the block pool (``allocator``)."""


class InvalidSpec(AllocatorError, ValueError):
    """A KV layout or capacity input is nonsense (zero or negative size, unknown dtype).

    Args:
        field: the offending field.
        value: the value given.
        reason: why it is refused and what is accepted.
    """

    def __init__(self, field: str, value: object, reason: str) -> None:
        self.field = field
        self.value = value
        self.reason = reason
        super().__init__(f"invalid {field}={value!r}: {reason}")


class OutOfBlocks(AllocatorError):
    """More blocks were asked for than are free or can be evicted.

    Args:
        requested: blocks asked for.
        available: blocks that were free or evictable at the time.
    """

    def __init__(self, requested: int, available: int) -> None:
        self.requested = requested
        self.available = available
        super().__init__(
            f"requested {requested} blocks but only {available} are free or evictable; "
            "release finished sequences or create the cache with more blocks"
        )


class UnknownBlock(AllocatorError, IndexError):
    """A block id is not in ``range(num_blocks)``.

    Args:
        block_id: the id given.
        num_blocks: the pool size.
    """

    def __init__(self, block_id: object, num_blocks: int) -> None:
        self.block_id = block_id
        self.num_blocks = num_blocks
        super().__init__(f"unknown block id {block_id!r}: valid ids are 0..{num_blocks - 1}")


class BlockStateError(AllocatorError):
    """An operation needs a block in another state (freeing a FREE block, keying a CACHED one).

    Args:
        block_id: the block.
        state: the state it is in.
        operation: what was attempted.
    """

    def __init__(self, block_id: int, state: str, operation: str) -> None:
        self.block_id = block_id
        self.state = state
        self.operation = operation
        super().__init__(f"cannot {operation} block {block_id}: it is {state}")


class KeyAlreadySet(AllocatorError):
    """A block's cache key is write-once and was already set.

    Args:
        block_id: the block.
    """

    def __init__(self, block_id: int) -> None:
        self.block_id = block_id
        super().__init__(f"block {block_id} already carries a cache key; keys are write-once")


class ZeroizationError(AllocatorError):
    """A zeroized block range was read back and is not all zero (security invariant).

    Args:
        block_ids: the blocks that failed verification.
    """

    def __init__(self, block_ids: Sequence[int]) -> None:
        self.block_ids = tuple(block_ids)
        super().__init__(
            f"zeroization verification failed for blocks {list(self.block_ids)[:16]}: "
            "freed KV bytes are still readable; stop serving from this device"
        )


class PoolClosed(AllocatorError):
    """The pool (or cache) was closed; its memory is zeroized and gone."""

    def __init__(self) -> None:
        super().__init__("the pool is closed; create a new one")


class InvalidQuota(AllocatorError, ValueError):
    """A cache quota (a group's floor or cap) is malformed, or the floors add up to
    more than the pool: nothing was changed.

    Attributes:
        group: the group at fault, or None when the quotas together are (the floors' sum).
        reason: what is wrong.
    """

    def __init__(self, group: object, reason: str) -> None:
        self.group = group
        self.reason = reason
        where = f"quota of {group!r}" if group is not None else "quotas"
        super().__init__(f"invalid {where}: {reason}")
