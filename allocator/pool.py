"""The paged KV block pool: :class:`BlockPool`, and the values it returns
(:class:`PoolCounts`, :class:`Revoked`).
"""

from __future__ import annotations

import math
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import NoReturn

import torch

from kvgov.allocator.device import resolve_device
from kvgov.allocator.events import (
    BlocksAllocated,
    BlocksCached,
    BlocksEvicted,
    BlocksHit,
    BlocksKeyed,
    BlocksZeroized,
    PoolEvent,
)
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
from kvgov.allocator.priority import Decay
from kvgov.allocator.quota import CAP, Quota, QuotaQueue, check_quotas
from kvgov.allocator.spec import KVSpec, positive_int
from kvgov.allocator.zeroize import coalesce_runs, make_zeroizer
from kvgov.defaults import DEFAULT_PRIORITY, MAX_PRIORITY, MIN_PRIORITY
from kvgov.exceptions import (
    BlockStateError,
    InternalError,
    InvalidSpec,
    KeyAlreadySet,
    OutOfBlocks,
    PoolClosed,
    UnknownBlock,
)

__all__ = ["BlockPool", "PoolCounts", "Revoked"]


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


class BlockPool:
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
      the middle on a prefix hit); with quotas set, a
      :class:`~kvgov.allocator.quota.QuotaQueue` (one per group and priority, their
      heads in a heap per priority).
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
        clock: seconds, monotonic (priority durations: :meth:`set_keys`).

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
        clock: Callable[[], float] = time.monotonic,
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
        self._queue: EvictionQueue | QuotaQueue = EvictionQueue()
        self._clock = clock
        # Blocks whose priority decays to the default at a deadline (set_keys' duration).
        self._decay = Decay()
        # Quota groups: name -> small int (0: no group), and the quotas by name, or
        # None while no quota is set (then _queue is a plain EvictionQueue).
        self._group_ids: dict[str, int] = {}
        self._group_names: list[str] = [""]
        self._quotas: dict[str, Quota] | None = None
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

    # ------------------------------------------------------------------ hot paths

    def allocate(self, n: int, *, group: str | None = None) -> list[int]:
        """Hand out ``n`` FREE (zeroed) blocks, each with one reference.

        When fewer than ``n`` blocks are FREE, CACHED blocks are evicted first
        (lowest priority, then least recently used; with quotas set, see
        :meth:`set_quotas`), which emits BlocksEvicted and BlocksZeroized before
        BlocksAllocated. The eviction's reason is ``"priority"`` for blocks below
        the highest priority cached, ``"capacity"`` for the others, and with quotas
        ``"cap"`` (the allocating group at its cap evicts its own blocks first) and
        ``"floor_pressure"`` (blocks within a group's floor, taken only when
        nothing else is left). Priorities whose duration has passed decay to the
        default before the victims are chosen.

        Args:
            n: how many blocks (zero or more).
            group: the quota group the blocks are for (e.g. the tenant), or None.

        Returns:
            The block ids, now OWNED.

        Raises:
            InvalidSpec: ``n`` is not an int of zero or more, or ``group`` not a string.
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
            if group is not None and type(group) is not str:
                raise InvalidSpec("group", group, "must be a string or None")
            if n == 0:
                return []
            free = self._free
            short = n - len(free)
            ids: list[int] | None = None
            if short > 0:
                queue = self._queue
                if short > len(queue):
                    raise OutOfBlocks(n, len(free) + len(queue))
                if self._decay:
                    self._decay_due()
                if isinstance(queue, EvictionQueue):
                    batches = queue.pop_reasoned(short)
                else:
                    batches = queue.choose(short, self._group_ids.get(group, 0) if group else 0)
                if short == n and len(batches) == 1:
                    # Every block comes from eviction: hand the zeroized blocks out
                    # directly, ascending, as a push onto the empty free stack and a
                    # pop of all of it would.
                    ids = self._drop_cached(batches[0][1], batches[0][0], push=False)
                else:
                    for reason, blocks in batches:
                        self._drop_cached(blocks, reason)
            if ids is None:
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
            if cached and self._quotas:
                self._enforce_caps(cached)

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
        duration: float | None = None,
        group: str | None = None,
    ) -> list[bool]:
        """Give OWNED blocks their (write-once) cache keys and index them.

        Args:
            block_ids: OWNED, unkeyed blocks (no repeats).
            keys: one non-empty ``bytes`` key per block.
            priority: eviction priority 0..100 once CACHED (lower is evicted first).
            duration: seconds after which ``priority`` decays to the default
                (``kvgov.defaults.DEFAULT_PRIORITY``), counted from now; None: never.
            group: the quota group the blocks count against (e.g. the tenant), or None.

        Returns:
            Per block, True if its key was indexed; False if another block already
            holds that key (earlier in the index or earlier in this batch): the
            block then stays unkeyed and is zeroized when freed.

        Raises:
            InvalidSpec: lengths differ, a key is not non-empty bytes, ``priority`` is
                not an int in 0..100, ``duration`` not a positive finite number, or
                ``group`` not a non-empty string.
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
        if duration is not None and (
            type(duration) not in (int, float) or not 0 < duration < math.inf
        ):
            raise InvalidSpec("duration", duration, "must be a positive finite number of seconds")
        if group is not None and (type(group) is not str or not group):
            raise InvalidSpec("group", group, "must be a non-empty string or None")
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
            gid = self._group_id(group) if group is not None else 0
            bgroup = meta.group
            out: list[bool] = []
            keyed: list[int] = []
            for b, k in zip(ids, ks, strict=True):
                if k in index:
                    out.append(False)
                    continue
                index[k] = b
                bkeys[b] = k
                prio[b] = priority
                bgroup[b] = gid
                keyed.append(b)
                out.append(True)
            decay = self._decay
            if duration is not None and priority != DEFAULT_PRIORITY:
                at = self._clock() + duration
                for b in keyed:
                    decay.set(b, at)
            elif decay:
                for b in keyed:
                    decay.clear(b)
            if keyed:
                self._events.append(BlocksKeyed(tuple(keyed)))
            return out

    def set_key(
        self,
        block_id: int,
        key: bytes,
        *,
        priority: int = DEFAULT_PRIORITY,
        duration: float | None = None,
        group: str | None = None,
    ) -> bool:
        """Key one block: :meth:`set_keys` for a single block.

        Args:
            block_id: an OWNED, unkeyed block.
            key: its non-empty cache key.
            priority: eviction priority 0..100.
            duration: as :meth:`set_keys`.
            group: as :meth:`set_keys`.

        Returns:
            True if the key was indexed, False if another block holds it.

        Raises:
            InvalidSpec: as :meth:`set_keys`.
            UnknownBlock: as :meth:`set_keys`.
            BlockStateError: as :meth:`set_keys`.
            KeyAlreadySet: as :meth:`set_keys`.
            PoolClosed: the pool was closed.
        """
        return self.set_keys([block_id], [key], priority=priority, duration=duration, group=group)[
            0
        ]

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

    # ------------------------------------------------------------------ quotas

    def set_quotas(self, quotas: Mapping[str, Quota] | None) -> None:
        """Set every group's floor and cap on CACHED blocks (replacing the earlier ones).

        Groups over their new cap lose their excess at once (BlocksEvicted, reason
        ``"cap"``). An empty mapping or None removes every quota: eviction is plain
        priority/LRU again. See :mod:`kvgov.allocator.quota` for the order.

        Args:
            quotas: group -> :class:`~kvgov.allocator.quota.Quota`, or None.

        Raises:
            InvalidQuota: a quota is malformed or the floors add up to more than the
                pool (nothing changed).
            ZeroizationError: a block evicted for its cap failed verification.
            PoolClosed: the pool was closed.
        """
        checked = check_quotas(quotas or {}, self._num_blocks)
        with self._lock:
            self._open()
            old = self._queue
            order = old.pop(len(old))  # plain eviction order, oldest first per level
            if checked:
                ids = {self._group_id(g): q for g, q in checked.items()}
                queue: EvictionQueue | QuotaQueue = QuotaQueue(
                    self._meta.group, self._num_blocks, ids
                )
            else:
                queue = EvictionQueue()
            self._queue = queue
            self._quotas = checked or None
            prio = self._meta.priority
            for p in sorted({prio[b] for b in order}):
                queue.extend([b for b in order if prio[b] == p], prio)
            if order and checked:
                self._enforce_caps(order)

    def quotas(self) -> dict[str, Quota]:
        """The quotas in force, by group (empty: none)."""
        with self._lock:
            return dict(self._quotas or {})

    def cached_by_group(self) -> dict[str, int]:
        """CACHED blocks per group that has any ("" for blocks keyed without a group)."""
        with self._lock:
            names = self._group_names
            group = self._meta.group
            if isinstance(self._queue, QuotaQueue):
                return {names[g]: c for g, c in self._queue.counts().items()}
            return dict(Counter(names[group[b]] for b in self._queue))

    def _group_id(self, name: str) -> int:
        gid = self._group_ids.get(name)
        if gid is None:
            gid = self._group_ids[name] = len(self._group_names)
            self._group_names.append(name)
        return gid

    def _enforce_caps(self, blocks: list[int]) -> None:
        """Evict, for each group of ``blocks`` over its cap, its excess (reason ``"cap"``)."""
        queue = self._queue
        if not isinstance(queue, QuotaQueue) or not queue.went_over():
            return  # no group went over its cap (the rule): nothing to look at per block
        group = self._meta.group
        for gid in dict.fromkeys(group[b] for b in blocks):
            excess = queue.excess(gid)
            if excess:
                self._drop_cached(queue.take_own(gid, excess), CAP)

    def _decay_due(self) -> None:
        """Lower every CACHED block whose priority duration passed to the default,
        at the most recently used end of the default level."""
        due = self._decay.due(self._clock())
        if not due:
            return
        count = self._meta.count
        prio = self._meta.priority
        keys = self._meta.key
        queue = self._queue
        for b in due:
            if keys[b] is None or prio[b] == DEFAULT_PRIORITY:
                continue
            if count[b] == CACHED_CODE:
                queue.remove(b, prio[b])
                prio[b] = DEFAULT_PRIORITY
                queue.extend((b,), prio)
            else:
                prio[b] = DEFAULT_PRIORITY

    # ------------------------------------------------------------------ erasure
    # Blocks taken out of the cache on a caller's word rather than on allocation
    # pressure: evict (retention expiry), revoke (purge, invalidation, secret
    # rotation), zeroize (erasure evidence, retries).

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
        self._decay = Decay()
        self._quotas = None
        self._index = {}
        self._dirty = 0
        self._detached = set()
        self._observer = None

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
            if isinstance(self._queue, QuotaQueue):
                self._queue.check()
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


def _check_reason(reason: object) -> None:
    """Refuse an eviction reason that is not a non-empty string (nothing changed yet)."""
    if not isinstance(reason, str) or not reason:
        raise InvalidSpec("reason", reason, "must be a non-empty string")
