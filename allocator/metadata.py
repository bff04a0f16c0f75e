"""Block states and per-block metadata.

Metadata is kept as parallel arrays indexed by block id (one ``list`` or
``bytearray`` per field) rather than one object per block. Why: a pool holds
up to millions of blocks and the hot paths (allocate, free, lookup) touch a few
fields of many blocks per call. Parallel arrays mean no per-block Python object
is created at start-up or on any hot path, a field read is one C-level index
into a compact array, and a batch loop binds each array to a local once; where
a whole batch can be checked at once it is, with C-level passes (``map``,
``min``, ``set``) instead of a Python loop per block. The arrays are still
declared in one slots dataclass (:class:`BlockTable`) with a comment per field
saying what it means and who may change it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from kvgov.defaults import DEFAULT_PRIORITY

__all__ = [
    "CACHED_CODE",
    "DIRTY_CODE",
    "FREE_CODE",
    "BlockState",
    "BlockTable",
    "state_of",
]


class BlockState(IntEnum):
    """Life-cycle state of a block (see docs/architecture.md)::

        FREE --allocate--> OWNED --free, keyed--> CACHED --evict/expire/revoke--+
         ^                   |                                                  |
         |                   +--free, unkeyed or cache=False--+                 |
         |                                                    v                 v
         +------------------------- zeroize (batched) <---- DIRTY <-------------+

    FREE blocks are all zero bytes. A block is DIRTY only between losing its
    contents' owner and being zeroized, which the pool does at once and in
    batches; it stays DIRTY (and is never handed out) only if zeroization failed.
    """

    FREE = 0
    OWNED = 1
    CACHED = 2
    DIRTY = 3


#: Codes of the non-OWNED states in :attr:`BlockTable.count` (OWNED is any count >= 1).
CACHED_CODE = 0
FREE_CODE = -1
DIRTY_CODE = -2


def state_of(count: int) -> BlockState:
    """Decode a :attr:`BlockTable.count` value into a :class:`BlockState`.

    Args:
        count: the block's count entry.

    Returns:
        OWNED for a count >= 1, else the state its code names.

    Raises:
        ValueError: ``count`` is below ``DIRTY_CODE`` (not a code).
    """
    if count > 0:
        return BlockState.OWNED
    if count == CACHED_CODE:
        return BlockState.CACHED
    if count == FREE_CODE:
        return BlockState.FREE
    if count == DIRTY_CODE:
        return BlockState.DIRTY
    raise ValueError(f"not a block count code: {count}")


@dataclass(slots=True)
class BlockTable:
    """Per-block metadata of one pool, as parallel arrays indexed by block id.

    Every field is changed only by :class:`~kvgov.allocator.pool.BlockPool` while it
    holds its lock; nothing else writes them.
    """

    # State and reference count in one int: >= 1 is OWNED with that many live
    # references; CACHED_CODE (0) is CACHED (no reference, keyed, evictable);
    # FREE_CODE (-1) is FREE; DIRTY_CODE (-2) is DIRTY. One array answers both
    # questions the hot paths ask ("is it OWNED?", "is this the last reference?")
    # with one read, and a last free leaves 0, which is CACHED.
    # Changed by allocate (-1 -> 1), lookup (+1, or 0 -> 1), free (-1 per reference),
    # zeroization (-> -1, or -> -2 if it failed) after a last free without a key,
    # an eviction, an expiry or a revoke.
    count: list[int]
    # Cache key, or None. Write-once: set by set_keys on an OWNED unkeyed block, only
    # while it is in the key index; dropped (None) when the block is evicted, revoked,
    # or freed with cache=False.
    key: list[bytes | None]
    # Eviction priority 0..100 (lower goes first), set by set_keys with the key.
    # Meaningful only while the block is keyed.
    priority: bytearray
    # Quota group (the pool's small int for a name such as a tenant; 0: none), set
    # by set_keys with the key. Meaningful only while the block is keyed.
    group: list[int]

    @classmethod
    def create(cls, num_blocks: int) -> BlockTable:
        """All blocks FREE, unkeyed.

        Args:
            num_blocks: blocks in the pool.

        Returns:
            The table.
        """
        return cls(
            count=[FREE_CODE] * num_blocks,
            key=[None] * num_blocks,
            priority=bytearray([DEFAULT_PRIORITY]) * num_blocks,
            group=[0] * num_blocks,
        )
