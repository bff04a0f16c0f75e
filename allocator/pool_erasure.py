"""Revocation and shutdown of a block pool: :class:`PoolErasure`.

The operations that take blocks out of the cache on a caller's word rather
than on allocation pressure: evict (retention expiry), revoke (purge,
invalidation, secret rotation), zeroize (erasure evidence, retries) and close.
:class:`~kvgov.allocator.pool.BlockPool` is the public class that has them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from kvgov.allocator.events import BlocksEvicted, BlocksZeroized
from kvgov.allocator.eviction import EvictionQueue
from kvgov.allocator.metadata import CACHED_CODE, DIRTY_CODE, FREE_CODE, BlockTable
from kvgov.allocator.pool_state import PoolState, _state_name
from kvgov.allocator.zeroize import make_zeroizer
from kvgov.exceptions import BlockStateError, InvalidSpec

__all__ = ["PoolErasure", "Revoked"]


@dataclass(frozen=True, slots=True)
class Revoked:
    """What :meth:`BlockPool.revoke` did.

    Attributes:
        evicted: CACHED blocks evicted, zeroized and FREE now, in the order given.
        detached: OWNED keyed blocks whose key left the index; they are zeroized when
            their last reference is freed.
    """

    evicted: tuple[int, ...]
    detached: tuple[int, ...]


class PoolErasure(PoolState):
    """Evict, revoke, zeroize and close (see :class:`~kvgov.allocator.pool.BlockPool`)."""

    def revoke(self, block_ids: Iterable[int], reason: str) -> Revoked:
        """Make blocks unreachable by key now (purge, invalidation, secret rotation).

        CACHED blocks are evicted (key dropped, DIRTY, zeroized in one batch:
        BlocksEvicted with ``reason``, then BlocksZeroized). OWNED keyed blocks
        have their key removed from the index (no lookup finds them) and are
        zeroized when their last reference is freed. Other blocks are ignored.

        Args:
            block_ids: blocks to revoke; repeats are ignored.
            reason: why, recorded in BlocksEvicted (e.g. ``"purged"``, ``"invalidated"``,
                ``"secret_rotated"``).

        Returns:
            Which blocks were evicted and which detached.

        Raises:
            InvalidSpec: ``reason`` is not a non-empty string.
            UnknownBlock: an id is not a block of this pool.
            ZeroizationError: an evicted block failed verification (it stays DIRTY).
            PoolClosed: the pool was closed.
        """
        _check_reason(reason)
        with self._lock:
            self._open()
            ids = list(block_ids)
            self._ids(ids)
            count = self._meta.count
            keys = self._meta.key
            detached: list[int] = []
            for b in ids:
                k = keys[b]
                if count[b] > 0 and k is not None:
                    del self._index[k]
                    keys[b] = None
                    self._detached.add(b)
                    detached.append(b)
            evicted = self._evict_cached(ids, reason)
            return Revoked(evicted=tuple(evicted), detached=tuple(detached))

    def evict(self, block_ids: Iterable[int], reason: str) -> list[int]:
        """Evict the CACHED blocks among ``block_ids`` now (retention expiry, a caller's choice).

        They lose their key, go DIRTY and are zeroized in one batch (BlocksEvicted
        with ``reason``, then BlocksZeroized). Blocks in any other state, and
        repeats, are ignored: a block hit since the caller chose it stays OWNED.

        Args:
            block_ids: candidate blocks.
            reason: why, recorded in BlocksEvicted (e.g. ``"expired"``).

        Returns:
            The blocks evicted, in the order given (all zeroized and FREE now).

        Raises:
            InvalidSpec: ``reason`` is not a non-empty string.
            UnknownBlock: an id is not a block of this pool (nothing is evicted).
            ZeroizationError: an evicted block failed verification (it stays DIRTY).
            PoolClosed: the pool was closed.
        """
        _check_reason(reason)
        with self._lock:
            self._open()
            ids = list(block_ids)
            self._ids(ids)
            return self._evict_cached(ids, reason)

    def _evict_cached(self, ids: list[int], reason: str) -> list[int]:
        """Take the CACHED blocks among ``ids`` out of the queue, drop and zeroize them."""
        count = self._meta.count
        prio = self._meta.priority
        remove = self._queue.remove
        out: list[int] = []
        for b in ids:
            if count[b] == CACHED_CODE:
                remove(b, prio[b])
                count[b] = FREE_CODE  # see _zeroize; a repeat of b is skipped
                out.append(b)
        if out:
            self._drop_cached(out, reason)
        return out

    def zeroize(self, block_ids: Iterable[int]) -> None:
        """Zeroize DIRTY or FREE blocks now (erasure evidence, or a retry after a failure).

        DIRTY blocks become FREE; FREE blocks are cleared again. One batch, one
        BlocksZeroized event.

        Args:
            block_ids: DIRTY or FREE blocks; repeats are cleared once.

        Raises:
            UnknownBlock: an id is not a block of this pool.
            BlockStateError: a block is OWNED or CACHED (free or revoke it first).
            ZeroizationError: a block failed verification; every block of the batch
                is left DIRTY and will not be handed out.
            PoolClosed: the pool was closed.
        """
        with self._lock:
            self._open()
            ids = list(block_ids)
            self._ids(ids)
            count = self._meta.count
            for b in ids:
                if count[b] >= CACHED_CODE:
                    raise BlockStateError(b, _state_name(count[b]), "zeroize")
            uniq = list(set(ids))
            if not uniq:
                return
            was_dirty = [b for b in uniq if count[b] == DIRTY_CODE]
            if len(was_dirty) < len(uniq):
                # FREE ones come off the free stack first: if clearing fails they
                # must not be handed out.
                was_free = set(uniq).difference(was_dirty)
                self._free[:] = [b for b in self._free if b not in was_free]
            for b in was_dirty:
                count[b] = FREE_CODE  # see _zeroize
            self._dirty -= len(was_dirty)
            self._zeroize(uniq)

    # ------------------------------------------------------------------ shutdown

    def close(self) -> None:
        """Zeroize the whole pool tensor, then release it.

        PyTorch's caching allocator keeps freed device memory inside the process
        and hands it to the next tensor, so the bytes are cleared before the
        tensor is dropped. CACHED blocks are reported evicted (reason
        ``"closed"``), then one BlocksZeroized covers every block. Views obtained
        earlier with :meth:`block` keep the (now zero) storage alive until they
        are dropped. Every later call except :meth:`take_events` and ``close``
        (a no-op) raises PoolClosed.

        Raises:
            ZeroizationError: the pool read back non-zero (the pool is closed anyway).
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            try:
                if self._queue:
                    order = self._queue.pop(len(self._queue))
                    keys = self._meta.key
                    self._events.append(
                        BlocksEvicted(tuple(order), tuple(keys[b] or b"" for b in order), "closed")
                    )
                nb = self._num_blocks
                seconds = self._zeroizer.zeroize([(0, nb)])
                self._events.append(
                    BlocksZeroized(
                        tuple(range(nb)), nb * self._bytes_per_block, self._device_name, seconds
                    )
                )
            finally:
                self._release()

    def _release(self) -> None:
        """Drop every reference the pool holds to its tensor and metadata."""
        empty = torch.empty(0, dtype=self._spec.dtype, device=self._device)
        self._tensor = empty
        self._words = empty.view(torch.uint8).view(1, 0)
        self._zeroizer = make_zeroizer(self._words, False)
        self._meta = BlockTable.create(0)
        self._free = []
        self._queue = EvictionQueue()
        self._index = {}
        self._dirty = 0
        self._detached = set()
        self._observer = None


def _check_reason(reason: object) -> None:
    """Refuse an eviction reason that is not a non-empty string (nothing changed yet)."""
    if not isinstance(reason, str) or not reason:
        raise InvalidSpec("reason", reason, "must be a non-empty string")
