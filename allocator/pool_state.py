"""The state of a block pool and everything that reads it: :class:`PoolState`.

:class:`~kvgov.allocator.pool.BlockPool` is the public class; it adds the
operations that change state (the hot paths there, revocation and shutdown in
:mod:`kvgov.allocator.pool_erasure`). This module holds the data structures,
the read-only queries, the primitives every state change ends in (queue a
block, drop a cached one, zeroize) and the invariant check.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from kvgov.allocator.events import BlocksCached, BlocksEvicted, BlocksZeroized, PoolEvent
from kvgov.allocator.eviction import EvictionQueue
from kvgov.allocator.metadata import (
    CACHED_CODE,
    DIRTY_CODE,
    FREE_CODE,
    BlockState,
    BlockTable,
    state_of,
)
from kvgov.allocator.observer import EvictedBlocks, EvictionObserver
from kvgov.allocator.spec import KVSpec, positive_int
from kvgov.allocator.zeroize import coalesce_runs, make_zeroizer
from kvgov.defaults import MAX_PRIORITY
from kvgov.exceptions import (
    BlockStateError,
    InternalError,
    InvalidSpec,
    PoolClosed,
    UnknownBlock,
)

__all__ = ["PoolCounts", "PoolState"]


def _state_name(count: int) -> str:
    return state_of(count).name


@dataclass(frozen=True, slots=True)
class PoolCounts:
    """How many blocks are in each state; the four always sum to ``num_blocks``.

    Attributes:
        free: zeroed, ready to hand out.
        owned: held by at least one sequence.
        cached: unreferenced, keyed, evictable.
        dirty: waiting for zeroization (non-zero only after a zeroization failure).
    """

    free: int
    owned: int
    cached: int
    dirty: int


def _word_dtype(bytes_per_block: int) -> torch.dtype:
    """Widest integer type whose size divides a block, for byte-exact clears and checks."""
    for dtype in (torch.int64, torch.int32, torch.int16):
        if bytes_per_block % dtype.itemsize == 0:
            return dtype
    return torch.uint8


def resolve_device(device: str | torch.device) -> torch.device:
    """Parse a device and refuse one this machine does not have, before torch asserts.

    Callers that set other things up first (an audit log, an output folder) check the
    device with this before they do, so that a wrong device changes nothing.

    Args:
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, or a torch device.

    Returns:
        The torch device.

    Raises:
        InvalidSpec: not a device torch knows; CUDA asked where torch sees none
            ("CUDA is not available on this machine"), or a CUDA index beyond the
            machine's devices.
    """
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError) as exc:
        raise InvalidSpec("device", device, f"not a torch device: {exc}") from exc
    if dev.type != "cuda":
        return dev
    if not torch.cuda.is_available():
        raise InvalidSpec(
            "device", device, "CUDA is not available on this machine; use device='cpu'"
        )
    count = torch.cuda.device_count()
    if dev.index is not None and dev.index >= count:
        raise InvalidSpec("device", device, f"this machine has {count} CUDA device(s)")
    return dev


class PoolState:
    """The data structures of a block pool and the queries that read them.

    See :class:`~kvgov.allocator.pool.BlockPool` for the layout, the life cycle,
    the invariants and thread safety; this base holds the state they describe
    and checks it in :meth:`_check_invariants`. Not meant to be built on its own.

    Args:
        spec: the KV layout.
        num_blocks: blocks in the pool (> 0).
        device: where the tensor lives (``"cpu"``, ``"cuda"``, ``"cuda:1"``, a torch.device).
        verify: read every zeroized run back and raise ZeroizationError if not all zero.

    Raises:
        InvalidSpec: ``spec`` is not a KVSpec, ``num_blocks`` not a positive int, or
            ``device`` not a device torch knows.
    """

    def __init__(
        self,
        spec: KVSpec,
        num_blocks: int,
        device: str | torch.device = "cpu",
        *,
        verify: bool = False,
    ) -> None:
        if not isinstance(spec, KVSpec):
            raise InvalidSpec("spec", spec, "must be an allocator.KVSpec")
        num_blocks = positive_int("num_blocks", num_blocks)
        dev = resolve_device(device)
        self._spec = spec
        self._num_blocks = num_blocks
        self._bytes_per_block = spec.bytes_per_block
        # torch.zeros: a fresh pool never exposes another allocation's bytes.
        self._tensor = torch.zeros((num_blocks, *spec.block_shape), dtype=spec.dtype, device=dev)
        self._device = self._tensor.device
        self._device_name = str(self._device)
        words = self._tensor.view(num_blocks, -1).view(torch.uint8)
        self._words = words.view(_word_dtype(self._bytes_per_block))
        self._zeroizer = make_zeroizer(self._words, verify)
        self._meta = BlockTable.create(num_blocks)
        # FREE stack; reversed so that a fresh pool hands out 0, 1, 2, ...
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._queue = EvictionQueue()
        self._index: dict[bytes, int] = {}
        self._dirty = 0
        # OWNED blocks whose key was revoked: unkeyed, refuse a new key, zeroized on
        # their last free. A set, because it is almost always empty.
        self._detached: set[int] = set()
        self._events: list[PoolEvent] = []
        # Shown each batch of evicted blocks before it is zeroized (offload); usually None.
        self._observer: EvictionObserver | None = None
        self._lock = threading.Lock()
        self._closed = False

    # ------------------------------------------------------------------ properties

    @property
    def spec(self) -> KVSpec:
        """The KV layout of every block."""
        return self._spec

    @property
    def num_blocks(self) -> int:
        """Blocks in the pool."""
        return self._num_blocks

    @property
    def device(self) -> torch.device:
        """The device the pool tensor lives on (with its index for CUDA)."""
        return self._device

    @property
    def bytes_per_block(self) -> int:
        """Bytes of one block (``spec.bytes_per_block``)."""
        return self._bytes_per_block

    # ------------------------------------------------------------------ views

    def block(self, block_id: int) -> torch.Tensor:
        """Return the view of one block, to write KV into or read it from.

        Args:
            block_id: the block.

        Returns:
            A view ``[num_layers, 2, block_size, num_kv_heads, head_dim]`` sharing the
            pool's memory.

        Raises:
            UnknownBlock: not a block id of this pool.
            PoolClosed: the pool was closed.
        """
        with self._lock:
            self._open()
            self._id(block_id)
            return self._tensor[block_id]

    def layer_view(self, layer: int) -> torch.Tensor:
        """Return one layer of every block, the shape a paged attention kernel reads.

        Args:
            layer: layer index, ``0 <= layer < spec.num_layers``.

        Returns:
            A strided view ``[num_blocks, 2, block_size, num_kv_heads, head_dim]``.

        Raises:
            InvalidSpec: ``layer`` is not a layer index.
            PoolClosed: the pool was closed.
        """
        with self._lock:
            self._open()
            if type(layer) is not int or not 0 <= layer < self._spec.num_layers:
                raise InvalidSpec(
                    "layer", layer, f"must be an int in 0..{self._spec.num_layers - 1}"
                )
            return self._tensor[:, layer]

    def set_eviction_observer(self, observer: EvictionObserver | None) -> None:
        """Show every batch of evicted blocks to ``observer`` before zeroizing it.

        See :mod:`kvgov.allocator.observer`. One observer at a time; None removes it.

        Args:
            observer: called with :class:`~kvgov.allocator.observer.EvictedBlocks`, or None.

        Raises:
            InvalidSpec: ``observer`` is neither callable nor None.
        """
        if observer is not None and not callable(observer):
            raise InvalidSpec("observer", observer, "must be callable or None")
        with self._lock:
            self._observer = observer

    # ------------------------------------------------------------------ introspection

    def take_events(self) -> list[PoolEvent]:
        """Return and clear the events emitted since the last call, oldest first.

        Still works after :meth:`close`, so the closing evidence can be drained.

        Returns:
            The events.
        """
        with self._lock:
            events = self._events
            self._events = []
            return events

    def state(self, block_id: int) -> BlockState:
        """Return a block's state.

        Args:
            block_id: the block.

        Returns:
            Its :class:`BlockState`.

        Raises:
            UnknownBlock: not a block id of this pool.
            PoolClosed: the pool was closed.
        """
        with self._lock:
            self._open()
            self._id(block_id)
            return state_of(self._meta.count[block_id])

    def states(self, block_ids: Sequence[int]) -> list[BlockState]:
        """Return the state of each block.

        Args:
            block_ids: the blocks.

        Returns:
            Their :class:`BlockState`, in the order given.

        Raises:
            UnknownBlock: an id is not a block of this pool.
            PoolClosed: the pool was closed.
        """
        with self._lock:
            self._open()
            ids = list(block_ids)
            self._ids(ids)
            count = self._meta.count
            return [state_of(count[b]) for b in ids]

    def read_back_zero(self, block_ids: Sequence[int]) -> bool:
        """Read blocks back and tell whether every byte is zero (erasure evidence).

        Args:
            block_ids: the blocks.

        Returns:
            True if all of them are all zero bytes.

        Raises:
            UnknownBlock: an id is not a block of this pool.
            PoolClosed: the pool was closed.
        """
        with self._lock:
            self._open()
            ids = list(block_ids)
            self._ids(ids)
            words = self._words
            return not any(bool(words[a:z].any()) for a, z in coalesce_runs(sorted(set(ids))))

    def ref_count(self, block_id: int) -> int:
        """Return how many references a block has (> 0 iff OWNED).

        Args:
            block_id: the block.

        Returns:
            The count.

        Raises:
            UnknownBlock: not a block id of this pool.
            PoolClosed: the pool was closed.
        """
        with self._lock:
            self._open()
            self._id(block_id)
            return max(self._meta.count[block_id], 0)

    def key(self, block_id: int) -> bytes | None:
        """Return a block's cache key, or None if it has none (or it was revoked).

        Args:
            block_id: the block.

        Returns:
            The key.

        Raises:
            UnknownBlock: not a block id of this pool.
            PoolClosed: the pool was closed.
        """
        with self._lock:
            self._open()
            self._id(block_id)
            return self._meta.key[block_id]

    def counts(self) -> PoolCounts:
        """Return how many blocks are in each state.

        Returns:
            The counts.

        Raises:
            PoolClosed: the pool was closed.
        """
        with self._lock:
            self._open()
            free = len(self._free)
            cached = len(self._queue)
            dirty = self._dirty
            return PoolCounts(
                free=free,
                owned=self._num_blocks - free - cached - dirty,
                cached=cached,
                dirty=dirty,
            )

    @property
    def closed(self) -> bool:
        """True once :meth:`close` ran."""
        return self._closed

    # ------------------------------------------------------------------ internals

    def _open(self) -> None:
        if self._closed:
            raise PoolClosed()

    def _id(self, b: object) -> None:
        if type(b) is not int or not 0 <= b < self._num_blocks:
            raise UnknownBlock(b, self._num_blocks)

    def _ids(self, ids: list[int]) -> None:
        nb = self._num_blocks
        for b in ids:
            if type(b) is not int or not 0 <= b < nb:
                raise UnknownBlock(b, nb)

    def _owned(self, ids: list[int], operation: str) -> list[int]:
        """Return the count of each id (non-empty batch); raise unless all are OWNED ints.

        The check is a few C-level passes over the batch; only a batch that fails
        it is walked in Python to name the first offending id.
        """
        count = self._meta.count
        try:
            ok = set(map(type, ids)) == {int} and min(ids) >= 0
            counts = list(map(count.__getitem__, ids)) if ok else []
            ok = ok and min(counts) > 0
        except IndexError:
            ok = False
        if not ok:
            self._ids(ids)
            for b in ids:
                if count[b] <= 0:
                    raise BlockStateError(b, _state_name(count[b]), operation)
            raise InternalError("batch failed the OWNED check but no block is at fault")
        return counts

    def _cache(self, blocks: list[int]) -> None:
        """Blocks whose count just reached CACHED_CODE: queue them, say so."""
        self._queue.extend(blocks, self._meta.priority)
        self._events.append(BlocksCached(tuple(blocks)))

    def _drop_cached(self, blocks: list[int], reason: str, *, push: bool = True) -> list[int]:
        """Blocks just taken out of the eviction queue: drop their keys, zeroize them
        (see :meth:`_zeroize` for ``push`` and what is returned)."""
        count = self._meta.count
        keys = self._meta.key
        index = self._index
        found: list[bytes | None] = list(map(keys.__getitem__, blocks))
        if None in found:
            raise InternalError(f"CACHED block {blocks[found.index(None)]} has no key")
        dropped: list[bytes] = found  # type: ignore[assignment]  # None excluded just above
        for k in dropped:
            del index[k]
        for b in blocks:
            keys[b] = None
            count[b] = FREE_CODE  # see _zeroize
        self._events.append(BlocksEvicted(tuple(blocks), tuple(dropped), reason))
        observer = self._observer
        if observer is not None:
            try:
                observer(EvictedBlocks(tuple(blocks), tuple(dropped), reason, self._tensor))
            except BaseException:
                self._zeroize(blocks)  # pushed: a failed observer leaves them FREE, never lost
                raise
        return self._zeroize(blocks, push=push)

    def _zeroize(self, blocks: list[int], *, push: bool = True) -> list[int]:
        """Clear distinct blocks that left every structure, then put them on the free stack.

        The caller has already taken the blocks out of the key index and the
        eviction queue and set their count to FREE_CODE (the state they are in
        once this returns; nobody can observe the moment between, the lock is
        held). If clearing fails in any way they are re-marked DIRTY and counted,
        so they are never handed out, and the error propagates.

        Returns the blocks ascending. ``push=False`` leaves them off the free stack:
        only for an ``allocate`` that hands every one of them out in the same call.
        """
        ordered = sorted(blocks)
        try:
            seconds = self._zeroizer.zeroize(coalesce_runs(ordered))
        except BaseException:
            count = self._meta.count
            for b in ordered:
                count[b] = DIRTY_CODE
            self._dirty += len(ordered)
            raise
        if push:
            # Pushed descending so the next allocate hands them out ascending.
            self._free.extend(reversed(ordered))
        self._events.append(
            BlocksZeroized(
                tuple(ordered), len(ordered) * self._bytes_per_block, self._device_name, seconds
            )
        )
        return ordered

    def _check_invariants(self, *, check_zero: bool = False) -> None:
        """Check every invariant in the class docstring; raise InternalError on the first broken.

        Args:
            check_zero: also read every FREE block back and check it is all zero (slow).

        Raises:
            InternalError: an invariant does not hold (a bug in kvgov).
            PoolClosed: the pool was closed.
        """
        with self._lock:
            self._open()
            nb = self._num_blocks
            meta = self._meta
            count = meta.count
            keys = meta.key

            def broken(what: str) -> InternalError:
                return InternalError(f"pool invariant broken: {what}")

            if not (len(count) == len(keys) == len(meta.priority) == nb):
                raise broken("metadata arrays differ in length from num_blocks")
            if min(count) < DIRTY_CODE:
                raise broken("a block has an unknown count code")
            n_free = count.count(FREE_CODE)
            n_cached = count.count(CACHED_CODE)
            n_dirty = count.count(DIRTY_CODE)
            n_owned = sum(1 for c in count if c > 0)
            if n_free + n_owned + n_cached + n_dirty != nb:
                raise broken("state counts do not sum to num_blocks")
            free = self._free
            if len(free) != n_free or len(set(free)) != len(free):
                raise broken(f"free stack holds {len(free)} ids for {n_free} FREE blocks")
            for b in free:
                if count[b] != FREE_CODE:
                    raise broken(f"block {b} is on the free stack but {_state_name(count[b])}")
            if len(self._queue) != n_cached:
                raise broken(f"eviction queue holds {len(self._queue)} for {n_cached} CACHED")
            queued: set[int] = set()
            for p, level in self._queue.levels().items():
                if not level:
                    raise broken(f"empty eviction level {p}")
                for b in level:
                    if count[b] != CACHED_CODE or meta.priority[b] != p or b in queued:
                        raise broken(f"block {b} queued at priority {p} wrongly")
                    queued.add(b)
            if len(queued) != n_cached:
                raise broken("eviction queue does not hold exactly the CACHED blocks")
            if self._dirty != n_dirty:
                raise broken(f"dirty counter {self._dirty} but {n_dirty} DIRTY blocks")
            index = self._index
            for b in range(nb):
                c = count[b]
                k = keys[b]
                if k is not None and (c < CACHED_CODE or index.get(k) != b):
                    raise broken(f"block {b} holds a key but is {_state_name(c)} or unindexed")
                if c == CACHED_CODE and k is None:
                    raise broken(f"CACHED block {b} has no key")
                if meta.priority[b] > MAX_PRIORITY:
                    raise broken(f"block {b} has priority {meta.priority[b]}")
            for b in self._detached:
                if count[b] <= 0 or keys[b] is not None:
                    raise broken(f"detached block {b} is {_state_name(count[b])} or keyed")
            for k, b in index.items():
                if keys[b] != k or count[b] < CACHED_CODE:
                    raise broken(f"key index maps to block {b} which does not hold that key")
            if check_zero and free:
                words = self._words
                for a, z in coalesce_runs(sorted(free)):
                    if bool(words[a:z].any()):
                        raise broken(f"a FREE block in {a}..{z - 1} holds non-zero bytes")
