"""The paged KV block pool: :class:`BlockPool`.

The class is spread over three modules, each a step of one inheritance line:
:mod:`~kvgov.allocator.pool_state` (the data structures, what reads them, the
invariant check), :mod:`~kvgov.allocator.pool_erasure` (evict, revoke, zeroize,
close) and this one (the hot paths: allocate, free, set_keys, lookup).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import NoReturn

from kvgov.allocator.events import BlocksAllocated, BlocksHit, BlocksKeyed
from kvgov.allocator.metadata import CACHED_CODE, FREE_CODE
from kvgov.allocator.pool_erasure import PoolErasure, Revoked
from kvgov.allocator.pool_state import PoolCounts, _state_name
from kvgov.defaults import DEFAULT_PRIORITY, MAX_PRIORITY, MIN_PRIORITY
from kvgov.exceptions import (
    BlockStateError,
    InternalError,
    InvalidSpec,
    KeyAlreadySet,
    OutOfBlocks,
    PoolClosed,
)

__all__ = ["BlockPool", "PoolCounts", "Revoked"]


class BlockPool(PoolErasure):
    """A fixed pool of KV blocks in one tensor, with refcounts, a prefix key index,
    priority/LRU eviction and batched zeroization.

    Layout: one tensor, block-major, so each block is one contiguous byte range
    and adjacent block ids are adjacent ranges (which is what lets zeroization
    clear a run of blocks with one call)::

        tensor[num_blocks, num_layers, 2, block_size, num_kv_heads, head_dim]
               |           |           |  `-- token slot within the block
               |           |           `----- 0 = key, 1 = value
               |           `----------------- layer
               `----------------------------- block id: bytes [i*B, (i+1)*B), B = bytes_per_block

        block(i)        -> tensor[i]          [num_layers, 2, block_size, heads, dim]
        layer_view(l)   -> tensor[:, l]       [num_blocks, 2, block_size, heads, dim] (strided)

    Retention is not the pool's: a caller that wants cached blocks to expire (the
    governor does) reads BlocksCached events and calls :meth:`evict` with the
    blocks whose deadline passed.

    Life cycle (``BlockState``): FREE -allocate-> OWNED -free-> CACHED (keyed and
    ``cache=True``) or DIRTY; CACHED -lookup-> OWNED; CACHED -evict (capacity,
    or the caller's ``evict`` / ``revoke``)-> DIRTY; DIRTY -zeroize-> FREE.
    Zeroization is eager: a block is zeroized in the same call that makes it
    DIRTY, batched per call (sorted, adjacent ids coalesced, one ``zero_()`` per
    run), so freed KV bytes do not linger; an eviction observer
    (:meth:`set_eviction_observer`) sees evicted blocks' bytes just before. A
    block stays DIRTY, never handed out, only if zeroization failed
    (:class:`~kvgov.exceptions.ZeroizationError`); ``zeroize(ids)`` retries.

    Data structures (all O(1) per block, no per-block Python object on any hot path):

    * FREE blocks: a plain ``list`` used as a stack. Every FREE block is zero,
      so which one is handed out does not matter; ``allocate(n)`` slices ``n``
      off the top in one C-level operation.
    * CACHED blocks: an :class:`~kvgov.allocator.eviction.EvictionQueue` (one
      ``OrderedDict`` per priority level: O(1) append, pop-LRU and removal from
      the middle on a prefix hit).
    * Key index: a ``dict`` from key to block id.
    * Per-block metadata: parallel arrays (:class:`~kvgov.allocator.metadata.BlockTable`).

    Invariants (checked by :meth:`_check_invariants`; a violation is a bug):

    * free + owned + cached + dirty == num_blocks and each block is in exactly
      one state: the free stack holds exactly the FREE blocks, the eviction queue
      exactly the CACHED ones (at their priority level), and the DIRTY counter
      matches;
    * FREE blocks are all zero bytes (checked only when asked: it reads the pool);
    * ref_count > 0 iff OWNED;
    * the key index maps a key only to an OWNED or CACHED block that holds that
      key, every keyed block is in the index, every CACHED block is keyed;
    * a detached (revoked while OWNED) block is OWNED and unkeyed.

    Thread safety: every public method takes one ``threading.Lock`` for its whole
    duration, so concurrent callers see each call as atomic. One lock is enough:
    each call is microseconds of metadata work (plus the zeroing it must finish
    before returning anyway), and a single lock cannot deadlock.

    Bad input raises a typed error and leaves the pool unchanged: every batch is
    validated in full before anything is mutated. A ZeroizationError is not bad
    input: the state changes that led to it stand, and the blocks stay DIRTY.

    Args:
        spec: the KV layout.
        num_blocks: blocks in the pool (> 0).
        device: where the tensor lives (``"cpu"``, ``"cuda"``, ``"cuda:1"``, a torch.device).
        verify: read every zeroized run back and raise ZeroizationError if not all zero.

    Raises:
        InvalidSpec: ``spec`` is not a KVSpec, ``num_blocks`` not a positive int, or
            ``device`` not a device torch knows.
    """

    # ------------------------------------------------------------------ hot paths

    def allocate(self, n: int) -> list[int]:
        """Hand out ``n`` FREE (zeroed) blocks, each with one reference.

        When fewer than ``n`` blocks are FREE, CACHED blocks are evicted first
        (lowest priority, then least recently used), which emits BlocksEvicted
        (reason ``"capacity"``) and BlocksZeroized before BlocksAllocated.

        Args:
            n: how many blocks (zero or more).

        Returns:
            The block ids, now OWNED.

        Raises:
            InvalidSpec: ``n`` is not an int of zero or more.
            OutOfBlocks: fewer than ``n`` blocks are FREE or CACHED.
            ZeroizationError: an evicted block failed verification (it stays DIRTY).
            PoolClosed: the pool was closed.

        An eviction observer that raises makes this raise its error, with the
        evicted blocks zeroized and FREE and nothing allocated.
        """
        with self._lock:
            if self._closed:
                raise PoolClosed()
            if type(n) is not int or n < 0:
                raise InvalidSpec("n", n, "must be an int of zero or more")
            if n == 0:
                return []
            free = self._free
            short = n - len(free)
            if short > 0:
                if short > len(self._queue):
                    raise OutOfBlocks(n, len(free) + len(self._queue))
                if short == n:
                    # Every block comes from eviction: hand the zeroized blocks out
                    # directly, ascending, as a push onto the empty free stack and a
                    # pop of all of it would.
                    ids = self._drop_cached(self._queue.pop(n), "capacity", push=False)
                else:
                    self._drop_cached(self._queue.pop(short), "capacity")
            if short < n:
                ids = free[-n:]
                del free[-n:]
                ids.reverse()
            count = self._meta.count
            for b in ids:
                count[b] = 1
            self._events.append(BlocksAllocated(tuple(ids)))
            return ids

    def free(self, block_ids: Iterable[int], *, cache: bool = True) -> None:
        """Drop one reference per id, in the given order.

        A block whose last reference goes becomes CACHED if it carries a key and
        ``cache`` is true (appended at the most-recently-used end, in the order
        given: pass a sequence's blocks tail first to have its tail evicted
        first; one BlocksCached event lists them); otherwise its key is dropped,
        it goes DIRTY and the call zeroizes all such blocks in one batch before
        returning.

        Args:
            block_ids: blocks to release; an id may repeat up to its ref count.
            cache: keep keyed blocks as CACHED (False: zeroize them now).

        Raises:
            UnknownBlock: an id is not a block of this pool.
            BlockStateError: a block is not OWNED, or is freed more often than it is held.
            ZeroizationError: a zeroized block failed verification (it stays DIRTY).
            PoolClosed: the pool was closed.
        """
        with self._lock:
            if self._closed:
                raise PoolClosed()
            ids = block_ids if type(block_ids) is list else list(block_ids)
            meta = self._meta
            count = meta.count
            keys = meta.key
            cached: list[int] = []
            dirty: list[int] = []
            # One pass validates and decrements; on the first bad id every decrement
            # made so far is undone, so a refused batch leaves the pool unchanged.
            done = 0
            try:
                for done, b in enumerate(ids):  # noqa: B007 (done is read in the handler)
                    c = count[b] - 1  # IndexError / TypeError: not a block id
                    if c < 0 or b < 0:  # not OWNED, or a negative id
                        raise IndexError(b)
                    if c:
                        count[b] = c
                    elif cache and keys[b] is not None:
                        count[b] = CACHED_CODE
                        cached.append(b)
                    else:
                        count[b] = FREE_CODE  # see _zeroize
                        dirty.append(b)
            except (IndexError, TypeError):
                self._undo_free(ids, done, dirty)
            if cached:
                self._cache(cached)
            if dirty:
                index = self._index
                for b in dirty:
                    k = keys[b]
                    if k is not None:
                        del index[k]
                        keys[b] = None
                if self._detached:
                    self._detached.difference_update(dirty)
                self._zeroize(dirty)

    def _undo_free(self, ids: list[int], done: int, dirty: list[int]) -> NoReturn:
        """Give back the references the first ``done`` ids of a refused ``free`` took
        (``dirty``: those among them already marked for zeroization), then raise the
        error for the first bad id."""
        count = self._meta.count
        for b in dirty:
            count[b] = 0
        for b in ids[:done]:
            count[b] += 1
        self._ids(ids)
        for b, times in Counter(ids).items():
            if count[b] <= 0:
                raise BlockStateError(b, _state_name(count[b]), "free")
            if times > count[b]:
                raise BlockStateError(
                    b, f"OWNED with {count[b]} reference(s)", f"free {times} references of"
                )
        raise InternalError("free refused a batch but found no bad id in it")

    def set_keys(
        self,
        block_ids: Sequence[int],
        keys: Sequence[bytes],
        *,
        priority: int = DEFAULT_PRIORITY,
    ) -> list[bool]:
        """Give OWNED blocks their (write-once) cache keys and index them.

        Args:
            block_ids: OWNED, unkeyed blocks (no repeats).
            keys: one non-empty ``bytes`` key per block.
            priority: eviction priority 0..100 once CACHED (lower is evicted first).

        Returns:
            Per block, True if its key was indexed; False if another block already
            holds that key (earlier in the index or earlier in this batch): the
            block then stays unkeyed and is zeroized when freed.

        Raises:
            InvalidSpec: lengths differ, a key is not non-empty bytes, or ``priority`` is
                not an int in 0..100.
            UnknownBlock: an id is not a block of this pool.
            BlockStateError: a block is not OWNED.
            KeyAlreadySet: a block already has (or had, before a revoke) a key, or
                appears twice.
            PoolClosed: the pool was closed.
        """
        if type(priority) is not int or not MIN_PRIORITY <= priority <= MAX_PRIORITY:
            raise InvalidSpec(
                "priority", priority, f"must be an int in {MIN_PRIORITY}..{MAX_PRIORITY}"
            )
        with self._lock:
            if self._closed:
                raise PoolClosed()
            ids = block_ids if type(block_ids) is list else list(block_ids)
            ks = keys if type(keys) is list else list(keys)
            n = len(ids)
            if n != len(ks):
                raise InvalidSpec("keys", len(ks), f"need one key per block ({n})")
            if not ids:
                return []
            self._owned(ids, "set a key on")
            meta = self._meta
            bkeys = meta.key
            if list(map(bkeys.__getitem__, ids)).count(None) != n or not self._detached.isdisjoint(
                ids
            ):
                for b in ids:
                    if bkeys[b] is not None or b in self._detached:
                        raise KeyAlreadySet(b)
            if len(set(ids)) < n:
                seen: set[int] = set()
                for b in ids:
                    if b in seen:
                        raise KeyAlreadySet(b)
                    seen.add(b)
            if set(map(type, ks)) != {bytes} or not all(ks):
                for k in ks:
                    if type(k) is not bytes or not k:
                        raise InvalidSpec("key", k, "a cache key must be non-empty bytes")
            index = self._index
            prio = meta.priority
            out: list[bool] = []
            keyed: list[int] = []
            for b, k in zip(ids, ks, strict=True):
                if k in index:
                    out.append(False)
                    continue
                index[k] = b
                bkeys[b] = k
                prio[b] = priority
                keyed.append(b)
                out.append(True)
            if keyed:
                self._events.append(BlocksKeyed(tuple(keyed)))
            return out

    def set_key(
        self,
        block_id: int,
        key: bytes,
        *,
        priority: int = DEFAULT_PRIORITY,
    ) -> bool:
        """Key one block: :meth:`set_keys` for a single block.

        Args:
            block_id: an OWNED, unkeyed block.
            key: its non-empty cache key.
            priority: eviction priority 0..100.

        Returns:
            True if the key was indexed, False if another block holds it.

        Raises:
            InvalidSpec: as :meth:`set_keys`.
            UnknownBlock: as :meth:`set_keys`.
            BlockStateError: as :meth:`set_keys`.
            KeyAlreadySet: as :meth:`set_keys`.
            PoolClosed: the pool was closed.
        """
        return self.set_keys([block_id], [key], priority=priority)[0]

    def lookup(self, keys: Iterable[bytes]) -> list[int]:
        """Find the longest leading run of keys that are indexed, taking a reference on each.

        Stops at the first key that misses. A CACHED block that hits leaves the
        eviction queue and becomes OWNED; an OWNED one gains a reference.

        Args:
            keys: cache keys in sequence order (e.g. one per full block of a prompt).

        Returns:
            The blocks holding ``keys[0..m)`` for the largest such ``m``.

        Raises:
            InvalidSpec: a key is not bytes (nothing is taken).
            PoolClosed: the pool was closed.
        """
        with self._lock:
            if self._closed:
                raise PoolClosed()
            ks = keys if type(keys) is list else list(keys)
            if ks and set(map(type, ks)) != {bytes}:
                for k in ks:
                    if type(k) is not bytes:
                        raise InvalidSpec("key", k, "a cache key must be bytes")
            index = self._index
            meta = self._meta
            count = meta.count
            prio = meta.priority
            remove = self._queue.remove
            out: list[int] = []
            for k in ks:
                b = index.get(k)
                if b is None:
                    break
                c = count[b]
                if c == CACHED_CODE:
                    remove(b, prio[b])
                    count[b] = 1
                else:
                    count[b] = c + 1
                out.append(b)
            if out:
                self._events.append(BlocksHit(tuple(out)))
            return out
