"""Typed events the pool emits, drained with :meth:`BlockPool.take_events`.

One event per call (or per batch), never one per block: each carries the block
ids it covers as a tuple. The allocator knows nothing of tenants or audit; the
govern layer drains these right after each call, attaches the scope it knows,
and hands them to the audit trail.

Order within one call is the order things happened: an ``allocate`` that had to
evict emits :class:`BlocksEvicted` (reason ``"capacity"``), then
:class:`BlocksZeroized`, then :class:`BlocksAllocated`.

Events are immutable named tuples, not frozen dataclasses: an allocation that
evicts builds three of them, and a frozen dataclass's ``__init__`` (one
``object.__setattr__`` per field) cost about 2.5x a tuple's, a tenth of the
whole eviction path per block. Equality still tells event types apart: two
events are equal only when they are of the same type with equal fields.
"""

from __future__ import annotations

from typing import Any, NamedTuple


def _same_type_eq(self: tuple[Any, ...], other: object) -> bool:
    return type(self) is type(other) and tuple.__eq__(self, other)


def _same_type_ne(self: tuple[Any, ...], other: object) -> bool:
    return not _same_type_eq(self, other)


def _typed_hash(self: tuple[Any, ...]) -> int:
    return hash((type(self).__name__, tuple.__hash__(self)))


__all__ = [
    "BlocksAllocated",
    "BlocksCached",
    "BlocksEvicted",
    "BlocksHit",
    "BlocksKeyed",
    "BlocksZeroized",
    "PoolEvent",
]


class BlocksAllocated(NamedTuple):
    """FREE (zeroed) blocks were handed out by ``allocate``, each with one reference.

    Attributes:
        block_ids: the blocks, in the order returned to the caller.
    """

    block_ids: tuple[int, ...]


class BlocksKeyed(NamedTuple):
    """OWNED blocks were given a cache key and entered the key index (``set_keys``).

    Attributes:
        block_ids: the blocks whose key was indexed (not those refused as duplicates).
    """

    block_ids: tuple[int, ...]


class BlocksHit(NamedTuple):
    """``lookup`` found these blocks by key and took a reference on each.

    Attributes:
        block_ids: the blocks, in key order (the longest leading run that hit).
    """

    block_ids: tuple[int, ...]


class BlocksCached(NamedTuple):
    """OWNED keyed blocks lost their last reference and became CACHED (``free``).

    Retention starts here: the governor gives each block its deadline (the
    time of this event plus the block's retention) when it sees this event.

    Attributes:
        block_ids: the blocks, in the order they entered the eviction queue.
    """

    block_ids: tuple[int, ...]


class BlocksEvicted(NamedTuple):
    """CACHED blocks lost their key and went DIRTY (they are zeroized right after).

    Attributes:
        block_ids: the blocks, in eviction order.
        keys: the key each block held, same order.
        reason: ``"capacity"`` (allocation pressure), ``"closed"`` (pool
            closed), or the caller's reason given to ``evict`` or ``revoke``
            (``"expired"``, ``"purged"``, ...).
    """

    block_ids: tuple[int, ...]
    keys: tuple[bytes, ...]
    reason: str


class BlocksZeroized(NamedTuple):
    """Blocks were overwritten with zeros (and, with ``verify=True``, read back as zero).

    kvgov's own pool emits it only after the zeros are in memory: on CUDA after
    the pool's stream finished the batch (``state`` ``"done"``). A pool whose
    bytes live in another process (vLLM's: the KV tensors are in its workers)
    emits it when the zeroing is *ordered* (``state`` ``"ordered"``: the blocks
    go to the workers with the next step, which zeroes them before that step's
    forward pass, so before anyone can write or read them); the binding writes
    the "done" audit event when that step has come back. Either way the blocks
    have left their owner and may be handed out from now on.

    Attributes:
        block_ids: the blocks, ascending.
        nbytes: bytes overwritten (or to overwrite, when ordered).
        device: the pool's device, e.g. ``"cpu"`` or ``"cuda:0"``.
        seconds: time the zeroing took: host wall time on CPU, device time between
            two events around the batch on CUDA (verification read-back excluded);
            0.0 when only ordered.
        state: ``"done"`` (the zeros are in memory) or ``"ordered"``.
    """

    block_ids: tuple[int, ...]
    nbytes: int
    device: str
    seconds: float
    state: str = "done"


#: Any event the pool emits.
PoolEvent = (
    BlocksAllocated | BlocksKeyed | BlocksHit | BlocksCached | BlocksEvicted | BlocksZeroized
)

for _event in (
    BlocksAllocated,
    BlocksKeyed,
    BlocksHit,
    BlocksCached,
    BlocksEvicted,
    BlocksZeroized,
):
    setattr(_event, "__eq__", _same_type_eq)  # noqa: B010 - NamedTuple bodies take no dunders
    setattr(_event, "__ne__", _same_type_ne)  # noqa: B010
    setattr(_event, "__hash__", _typed_hash)  # noqa: B010
del _event
