"""Tests for allocator.pool: the block life cycle, eviction, zeroization, errors, threads."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from kvgov.allocator import (
    BlockPool,
    BlocksAllocated,
    BlocksEvicted,
    BlocksHit,
    BlocksKeyed,
    BlockState,
    BlocksZeroized,
    KVSpec,
    PoolCounts,
    Revoked,
)
from kvgov.allocator.zeroize import CpuZeroizer
from kvgov.exceptions import (
    BlockStateError,
    InvalidSpec,
    KeyAlreadySet,
    OutOfBlocks,
    PoolClosed,
    UnknownBlock,
    ZeroizationError,
)

SPEC = KVSpec(num_layers=2, num_kv_heads=2, head_dim=4, block_size=4)


class Clock:
    """A settable clock for TTL tests."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def make_pool(num_blocks: int = 8, **kwargs: object) -> BlockPool:
    return BlockPool(SPEC, num_blocks, **kwargs)  # type: ignore[arg-type]


def fill(pool: BlockPool, block_ids: list[int], value: float = 3.0) -> None:
    for b in block_ids:
        pool.block(b).fill_(value)


def is_zero(pool: BlockPool, block_id: int) -> bool:
    return not bool(pool.block(block_id).view(torch.uint8).any())


def snapshot(pool: BlockPool) -> tuple[object, ...]:
    n = pool.num_blocks
    return (
        pool.counts(),
        [pool.state(i) for i in range(n)],
        [pool.ref_count(i) for i in range(n)],
        [pool.key(i) for i in range(n)],
        list(pool._queue),
        pool._free[:],
    )


def cached_pool(keys: list[bytes], **kwargs: object) -> tuple[BlockPool, list[int]]:
    """A pool whose first len(keys) blocks are keyed and CACHED."""
    pool = make_pool(**kwargs)
    ids = pool.allocate(len(keys))
    pool.set_keys(ids, keys)
    pool.free(ids)
    pool.take_events()
    return pool, ids


# ---------------------------------------------------------------------- construction


def test_pool_tensor_is_block_major_and_contiguous_per_block() -> None:
    """Block i is one contiguous byte range starting at i * bytes_per_block."""
    pool = make_pool(4)
    base = pool.block(0).data_ptr()
    for i in range(4):
        view = pool.block(i)
        assert view.shape == (2, 2, 4, 2, 4)
        assert view.is_contiguous()
        assert view.data_ptr() - base == i * pool.bytes_per_block
    assert pool.bytes_per_block == SPEC.bytes_per_block == 256


def test_layer_view_aliases_the_blocks() -> None:
    """layer_view(l) is [num_blocks, 2, block_size, heads, dim] sharing memory with block()."""
    pool = make_pool(4)
    view = pool.layer_view(1)
    assert view.shape == (4, 2, 4, 2, 4)
    view[2].fill_(5.0)
    assert bool((pool.block(2)[1] == 5.0).all())
    assert not bool(pool.block(2)[0].any())


def test_new_pool_is_zero_and_free() -> None:
    """A new pool has every block FREE and zero, on the requested device."""
    pool = make_pool(4)
    assert pool.counts() == PoolCounts(free=4, owned=0, cached=0, dirty=0)
    assert all(is_zero(pool, i) for i in range(4))
    assert pool.device == torch.device("cpu")
    assert pool.spec is SPEC and pool.num_blocks == 4
    pool._check_invariants(check_zero=True)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((SPEC, 0), "num_blocks"),
        ((SPEC, -3), "num_blocks"),
        ((SPEC, True), "num_blocks"),
        ((SPEC, 4.0), "num_blocks"),
        (("spec", 4), "spec"),
        ((SPEC, 4, "tpu:9"), "device"),
    ],
)
def test_construction_refuses_nonsense(args: tuple[object, ...], field: str) -> None:
    """Bad spec, block count or device raise InvalidSpec naming the argument."""
    with pytest.raises(InvalidSpec) as info:
        BlockPool(*args)  # type: ignore[arg-type]
    assert info.value.field == field


@pytest.mark.parametrize("layer", [-1, 2, True, 1.0])
def test_layer_view_refuses_bad_layers(layer: object) -> None:
    """A layer outside 0..num_layers-1 (or not an int) raises InvalidSpec."""
    with pytest.raises(InvalidSpec):
        make_pool().layer_view(layer)  # type: ignore[arg-type]


@pytest.mark.parametrize("block_id", [-1, 8, True, 1.0, "1"])
def test_accessors_refuse_unknown_blocks(block_id: object) -> None:
    """block(), state(), ref_count() and key() raise UnknownBlock for a bad id."""
    pool = make_pool()
    for accessor in (pool.block, pool.state, pool.ref_count, pool.key):
        with pytest.raises(UnknownBlock):
            accessor(block_id)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- allocate / free


def test_allocate_hands_out_free_blocks_with_one_reference() -> None:
    """allocate(n) returns n FREE blocks, now OWNED with one reference, in one event."""
    pool = make_pool()
    ids = pool.allocate(3)
    assert ids == [0, 1, 2]
    assert all(pool.state(b) is BlockState.OWNED and pool.ref_count(b) == 1 for b in ids)
    assert pool.take_events() == [BlocksAllocated((0, 1, 2))]
    assert pool.allocate(0) == []
    assert pool.take_events() == []


def test_free_unkeyed_block_is_zeroized_and_free_again() -> None:
    """Freeing an unkeyed block zeroizes it at once (one event) and makes it FREE."""
    pool = make_pool()
    ids = pool.allocate(2)
    fill(pool, ids)
    pool.take_events()
    pool.free(ids)
    assert all(pool.state(b) is BlockState.FREE and is_zero(pool, b) for b in ids)
    (event,) = pool.take_events()
    assert isinstance(event, BlocksZeroized)
    assert event.block_ids == (0, 1)
    assert event.nbytes == 2 * pool.bytes_per_block
    assert event.device == "cpu"
    assert event.seconds >= 0.0


def test_free_keyed_block_is_cached_and_keeps_its_bytes() -> None:
    """A keyed block whose last reference goes is CACHED with its KV intact."""
    pool = make_pool()
    (b,) = pool.allocate(1)
    fill(pool, [b], 2.0)
    pool.set_key(b, b"k")
    pool.free([b])
    assert pool.state(b) is BlockState.CACHED
    assert pool.key(b) == b"k"
    assert bool((pool.block(b) == 2.0).all())


def test_free_with_cache_false_drops_the_key_and_zeroizes() -> None:
    """free(cache=False) drops a keyed block's key and zeroizes it."""
    pool = make_pool()
    (b,) = pool.allocate(1)
    fill(pool, [b])
    pool.set_key(b, b"k")
    pool.free([b], cache=False)
    assert pool.state(b) is BlockState.FREE and pool.key(b) is None and is_zero(pool, b)
    assert pool.lookup([b"k"]) == []


def test_shared_block_stays_owned_until_its_last_reference() -> None:
    """A block with two references stays OWNED after one free and is CACHED after two."""
    pool = make_pool()
    (b,) = pool.allocate(1)
    pool.set_key(b, b"k")
    assert pool.lookup([b"k"]) == [b]
    assert pool.ref_count(b) == 2
    pool.free([b])
    assert pool.state(b) is BlockState.OWNED and pool.ref_count(b) == 1
    pool.free([b])
    assert pool.state(b) is BlockState.CACHED and pool.ref_count(b) == 0


def test_free_may_repeat_an_id_up_to_its_references() -> None:
    """An id held twice may be freed twice in one call."""
    pool = make_pool()
    (b,) = pool.allocate(1)
    pool.set_key(b, b"k")
    pool.lookup([b"k"])
    pool.free([b, b])
    assert pool.state(b) is BlockState.CACHED


def test_free_accepts_any_iterable() -> None:
    """free() takes a tuple or generator as well as a list."""
    pool = make_pool()
    ids = pool.allocate(3)
    pool.free(tuple(ids[:1]))
    pool.free(b for b in ids[1:])
    assert pool.counts().free == 8


# ---------------------------------------------------------------------- keys and lookup


def test_set_keys_indexes_and_reports_duplicates() -> None:
    """set_keys returns per block whether its key was indexed; a held key is refused."""
    pool = make_pool()
    ids = pool.allocate(4)
    assert pool.set_keys(ids[:2], [b"a", b"b"]) == [True, True]
    assert pool.set_keys(ids[2:], [b"a", b"c"]) == [False, True]
    assert pool.key(ids[2]) is None and pool.key(ids[3]) == b"c"
    events = pool.take_events()
    assert events[1:] == [BlocksKeyed((0, 1)), BlocksKeyed((3,))]


def test_duplicate_key_within_one_batch_keeps_the_first() -> None:
    """Two blocks given the same key in one batch: the first is indexed, the second not."""
    pool = make_pool()
    ids = pool.allocate(2)
    assert pool.set_keys(ids, [b"x", b"x"]) == [True, False]
    assert pool.lookup([b"x"]) == [ids[0]]


def test_unindexed_block_is_zeroized_when_freed() -> None:
    """A block refused a duplicate key is unkeyed, so freeing it zeroizes it."""
    pool = make_pool()
    ids = pool.allocate(2)
    pool.set_keys(ids, [b"x", b"x"])
    fill(pool, ids)
    pool.free(ids)
    assert pool.state(ids[0]) is BlockState.CACHED
    assert pool.state(ids[1]) is BlockState.FREE and is_zero(pool, ids[1])


def test_lookup_takes_the_longest_leading_run() -> None:
    """lookup stops at the first miss and takes one reference on each hit."""
    pool, ids = cached_pool([b"a", b"b", b"c"])
    assert pool.lookup([b"a", b"b", b"zz", b"c"]) == ids[:2]
    assert [pool.state(b) for b in ids] == [BlockState.OWNED, BlockState.OWNED, BlockState.CACHED]
    assert pool.take_events() == [BlocksHit(tuple(ids[:2]))]
    assert pool.lookup([b"zz", b"a"]) == []
    assert pool.take_events() == []


def test_lookup_hit_protects_the_block_from_eviction() -> None:
    """A block taken by lookup leaves the eviction queue."""
    pool, ids = cached_pool([b"a", b"b"])
    pool.lookup([b"a"])
    pool.allocate(6)
    assert pool.allocate(1) == [ids[1]]  # only b was evictable
    with pytest.raises(OutOfBlocks):
        pool.allocate(1)


def test_set_key_single_form() -> None:
    """set_key keys one block and says whether it was indexed."""
    pool = make_pool()
    a, b = pool.allocate(2)
    assert pool.set_key(a, b"k", priority=5, ttl=1.0) is True
    assert pool.set_key(b, b"k") is False


# ---------------------------------------------------------------------- eviction order


def test_eviction_order_is_priority_then_lru_exactly() -> None:
    """Allocation pressure evicts lowest priority first, least recently freed first within one."""
    pool = make_pool(8)
    ids = pool.allocate(8)
    pool.set_keys([0, 1, 2], [b"k0", b"k1", b"k2"], priority=50)
    pool.set_keys([3, 4], [b"k3", b"k4"], priority=10)
    pool.set_keys([5, 6, 7], [b"k5", b"k6", b"k7"], priority=90)
    pool.free([2, 0, 7, 4, 1, 3, 6, 5])
    assert list(pool._queue) == [4, 3, 2, 0, 1, 7, 6, 5]
    pool.take_events()
    order = [pool.allocate(1)[0] for _ in ids]
    assert order == [4, 3, 2, 0, 1, 7, 6, 5]


def test_tail_blocks_are_evicted_in_the_order_the_caller_freed_them() -> None:
    """Freeing a sequence tail first makes its tail the first evicted."""
    pool = make_pool(4)
    seq = pool.allocate(4)
    pool.set_keys(seq, [b"p0", b"p1", b"p2", b"p3"])
    pool.free(list(reversed(seq)))
    assert pool.allocate(2) == [2, 3]
    events = pool.take_events()
    evicted = [e for e in events if isinstance(e, BlocksEvicted)]
    assert evicted == [BlocksEvicted((3, 2), (b"p3", b"p2"), "capacity")]


def test_eviction_events_come_before_the_allocation() -> None:
    """An evicting allocate emits BlocksEvicted, then BlocksZeroized, then BlocksAllocated."""
    pool, ids = cached_pool([b"a", b"b"])
    pool.allocate(6)
    pool.take_events()
    got = pool.allocate(2)
    events = pool.take_events()
    assert [type(e) for e in events] == [BlocksEvicted, BlocksZeroized, BlocksAllocated]
    assert events[0] == BlocksEvicted(tuple(ids), (b"a", b"b"), "capacity")
    assert events[1].block_ids == tuple(sorted(ids))  # type: ignore[union-attr]
    assert events[2] == BlocksAllocated(tuple(got))
    assert pool.lookup([b"a"]) == []


def test_allocate_uses_free_blocks_before_evicting() -> None:
    """While FREE blocks remain, no CACHED block is evicted."""
    pool, ids = cached_pool([b"a"])
    pool.allocate(7)
    assert pool.state(ids[0]) is BlockState.CACHED


def test_out_of_blocks_reports_requested_and_available() -> None:
    """Asking for more than FREE plus CACHED raises OutOfBlocks with both counts."""
    pool, _ = cached_pool([b"a", b"b"])
    pool.allocate(3)
    with pytest.raises(OutOfBlocks) as info:
        pool.allocate(6)
    assert (info.value.requested, info.value.available) == (6, 5)


# ---------------------------------------------------------------------- TTL and expiry


def test_expire_evicts_blocks_past_their_deadline() -> None:
    """A CACHED block expires ttl seconds after it became CACHED, by the injected clock."""
    clock = Clock()
    pool = make_pool(clock=clock)
    a, b, c = pool.allocate(3)
    pool.set_keys([a, b], [b"a", b"b"], ttl=10.0)
    pool.set_key(c, b"c")  # no ttl
    clock.now = 5.0
    fill(pool, [a, b, c])
    pool.free([a, b, c])  # deadlines 15
    pool.take_events()
    assert pool.expire(now=14.9) == []
    clock.now = 15.0
    assert pool.expire() == [a, b]
    assert is_zero(pool, a) and is_zero(pool, b)
    assert pool.state(c) is BlockState.CACHED
    events = pool.take_events()
    assert events[0] == BlocksEvicted((a, b), (b"a", b"b"), "expired")
    assert isinstance(events[1], BlocksZeroized)
    assert pool.expire(now=1e9) == []


def test_a_hit_restarts_the_ttl() -> None:
    """A block looked up and freed again gets a new deadline; the old one is ignored."""
    clock = Clock()
    pool = make_pool(clock=clock)
    (a,) = pool.allocate(1)
    pool.set_key(a, b"a", ttl=10.0)
    pool.free([a])  # deadline 10
    clock.now = 8.0
    pool.lookup([b"a"])
    pool.free([a])  # deadline 18
    assert pool.expire(now=12.0) == []
    assert pool.expire(now=18.0) == [a]


def test_owned_blocks_do_not_expire() -> None:
    """An OWNED block is not evicted by expire, however old its deadline."""
    clock = Clock()
    pool = make_pool(clock=clock)
    (a,) = pool.allocate(1)
    pool.set_key(a, b"a", ttl=1.0)
    pool.free([a])
    pool.lookup([b"a"])
    assert pool.expire(now=100.0) == []
    assert pool.state(a) is BlockState.OWNED


def test_expiry_heap_is_compacted() -> None:
    """Stale expiry entries from many hits are dropped once the heap outgrows the pool."""
    pool = make_pool(2)
    (a,) = pool.allocate(1)
    pool.set_key(a, b"a", ttl=100.0)
    pool.free([a])
    for _ in range(200):
        pool.lookup([b"a"])
        pool.free([a])
    assert len(pool._expiry) <= 2 * 2 + 64
    pool._check_invariants()


# ---------------------------------------------------------------------- revoke


def test_revoke_evicts_cached_and_detaches_owned() -> None:
    """revoke evicts CACHED blocks now and unindexes OWNED keyed ones; others are ignored."""
    pool = make_pool()
    a, b, c, _d = pool.allocate(4)
    pool.set_keys([a, b], [b"a", b"b"])
    fill(pool, [a, b])
    pool.free([a])
    pool.take_events()
    result = pool.revoke([a, b, c, a], "purged")
    assert result == Revoked(evicted=(a,), detached=(b,))
    assert pool.state(a) is BlockState.FREE and is_zero(pool, a)
    assert pool.lookup([b"a"]) == [] and pool.lookup([b"b"]) == []
    assert pool.key(b) is None and pool.state(b) is BlockState.OWNED
    events = pool.take_events()
    assert events[0] == BlocksEvicted((a,), (b"a",), "purged")
    pool.free([b])
    assert pool.state(b) is BlockState.FREE and is_zero(pool, b)


def test_detached_block_refuses_a_new_key() -> None:
    """Keys are write-once: a block whose key was revoked cannot be keyed again."""
    pool = make_pool()
    (b,) = pool.allocate(1)
    pool.set_key(b, b"k")
    pool.revoke([b], "secret_rotated")
    with pytest.raises(KeyAlreadySet):
        pool.set_key(b, b"k2")


def test_revoke_needs_a_reason() -> None:
    """An empty or non-string reason raises InvalidSpec."""
    pool = make_pool()
    for reason in ("", None, 3):
        with pytest.raises(InvalidSpec):
            pool.revoke([0], reason)  # type: ignore[arg-type]


# ---------------------------------------------------------------------- zeroize


def test_zeroize_reclears_free_blocks_and_emits_one_event() -> None:
    """zeroize() on FREE blocks clears them again in one batch and leaves them FREE."""
    pool = make_pool()
    pool.zeroize([5, 3, 4, 3])
    (event,) = pool.take_events()
    assert isinstance(event, BlocksZeroized) and event.block_ids == (3, 4, 5)
    assert pool.counts().free == 8
    assert sorted(pool.allocate(8)) == list(range(8))


@pytest.mark.parametrize("state", ["owned", "cached"])
def test_zeroize_refuses_live_blocks(state: str) -> None:
    """zeroize() on an OWNED or CACHED block raises BlockStateError and changes nothing."""
    pool = make_pool()
    (b,) = pool.allocate(1)
    if state == "cached":
        pool.set_key(b, b"k")
        pool.free([b])
    before = snapshot(pool)
    with pytest.raises(BlockStateError):
        pool.zeroize([1, b])
    assert snapshot(pool) == before


class _NoOpZeroizer(CpuZeroizer):
    """Simulates a device whose clears silently do nothing."""

    def _clear(self, start: int, stop: int) -> None:
        pass


def _break(pool: BlockPool) -> CpuZeroizer:
    good = pool._zeroizer
    pool._zeroizer = _NoOpZeroizer(pool._words, verify=True)
    assert isinstance(good, CpuZeroizer)
    return good


def test_failed_zeroization_leaves_blocks_dirty_and_unhanded() -> None:
    """A clear that reads back non-zero raises ZeroizationError; the blocks stay DIRTY."""
    pool = make_pool(4, verify=True)
    ids = pool.allocate(2)
    fill(pool, ids)
    good = _break(pool)
    with pytest.raises(ZeroizationError) as info:
        pool.free(ids)
    assert info.value.block_ids == tuple(ids)
    assert pool.counts() == PoolCounts(free=2, owned=0, cached=0, dirty=2)
    assert all(pool.state(b) is BlockState.DIRTY for b in ids)
    pool._check_invariants()
    assert set(pool.allocate(2)).isdisjoint(ids)
    with pytest.raises(OutOfBlocks):
        pool.allocate(1)
    pool._zeroizer = good
    pool.zeroize(ids)
    assert all(pool.state(b) is BlockState.FREE and is_zero(pool, b) for b in ids)
    pool._check_invariants(check_zero=True)


@pytest.mark.parametrize("free_before", [0, 1], ids=["all-evicted", "some-free"])
def test_failed_zeroization_of_an_evicting_allocate_hands_out_nothing(free_before: int) -> None:
    """An allocate that must evict, whose clear fails, raises and hands out no block:
    the evicted blocks stay DIRTY, FREE ones stay FREE (both when every block would
    come from eviction and when some would come from the free stack)."""
    pool = make_pool(4, verify=True)
    ids = pool.allocate(4 - free_before)
    fill(pool, ids)
    pool.set_keys(ids, [bytes([i + 1]) for i in range(len(ids))])
    pool.free(ids)
    pool.take_events()
    _break(pool)
    with pytest.raises(ZeroizationError):
        pool.allocate(free_before + 2)
    assert pool.counts() == PoolCounts(free=free_before, owned=0, cached=len(ids) - 2, dirty=2)
    assert [pool.state(b) for b in ids[:2]] == [BlockState.DIRTY, BlockState.DIRTY]
    pool._check_invariants()


def test_evicting_allocate_hands_out_the_evicted_blocks_ascending() -> None:
    """With no FREE block left, the evicted blocks are the allocation, ascending, zeroed."""
    pool = make_pool(6)
    ids = pool.allocate(6)
    fill(pool, ids)
    pool.set_keys(ids, [bytes([i + 1]) for i in range(6)])
    pool.free([4, 1, 5, 0, 2, 3])
    got = pool.allocate(3)
    assert got == [1, 4, 5]  # the three least recently freed
    assert all(is_zero(pool, b) and pool.ref_count(b) == 1 for b in got)
    assert pool.counts() == PoolCounts(free=0, owned=3, cached=3, dirty=0)
    pool._check_invariants(check_zero=True)


def test_failed_rezeroize_of_free_blocks_takes_them_out_of_service() -> None:
    """If re-clearing FREE blocks fails they become DIRTY and are not handed out."""
    pool = make_pool(4, verify=True)
    fill(pool, [1])
    _break(pool)
    with pytest.raises(ZeroizationError):
        pool.zeroize([1])
    assert pool.state(1) is BlockState.DIRTY
    assert 1 not in pool.allocate(3)
    pool._check_invariants()


# ---------------------------------------------------------------------- remanence


def _fill_then(path: str) -> tuple[BlockPool, list[int]]:
    """Put non-zero KV in two blocks and make them leave ownership by ``path``."""
    clock = Clock()
    pool = make_pool(4, clock=clock, verify=True)
    ids = pool.allocate(2)
    fill(pool, ids, 9.0)
    if path == "free":
        pool.free(ids)
    elif path == "free_uncached":
        pool.set_keys(ids, [b"a", b"b"])
        pool.free(ids, cache=False)
    elif path == "evict":
        pool.set_keys(ids, [b"a", b"b"])
        pool.free(ids)
        pool.allocate(4)  # pressure: both evicted, zeroized, handed out
        return pool, ids
    elif path == "revoke":
        pool.set_keys(ids, [b"a", b"b"])
        pool.free(ids)
        pool.revoke(ids, "purged")
    elif path == "revoke_owned":
        pool.set_keys(ids, [b"a", b"b"])
        pool.revoke(ids, "invalidated")
        pool.free(ids)
    elif path == "expire":
        pool.set_keys(ids, [b"a", b"b"], ttl=1.0)
        pool.free(ids)
        clock.now = 2.0
        pool.expire()
    elif path == "zeroize":
        pool.free(ids)
        fill(pool, ids, 9.0)  # a stray write into FREE blocks: erasure clears it
        pool.zeroize(ids)
    return pool, ids


@pytest.mark.parametrize(
    "path",
    ["free", "free_uncached", "evict", "revoke", "revoke_owned", "expire", "zeroize"],
)
def test_no_kv_bytes_survive_until_reuse(path: str) -> None:
    """By every path out of ownership, every byte is zero before the block is handed out."""
    pool, ids = _fill_then(path)
    if path != "evict":
        assert all(pool.state(b) is BlockState.FREE for b in ids)
        pool._check_invariants(check_zero=True)
        handed = pool.allocate(4)
        assert set(ids) <= set(handed)
    assert all(is_zero(pool, b) for b in ids)
    zeroized = {b for e in pool.take_events() if isinstance(e, BlocksZeroized) for b in e.block_ids}
    assert set(ids) <= zeroized


def test_close_zeroizes_the_whole_tensor_before_release() -> None:
    """close() clears every block (OWNED and CACHED too) before the tensor is dropped."""
    pool = make_pool(4)
    ids = pool.allocate(3)
    pool.set_key(ids[0], b"a")
    pool.free([ids[0]])
    fill(pool, ids, 7.0)
    whole = pool.block(0).untyped_storage()  # keeps the storage alive to inspect it
    raw = torch.empty(0, dtype=torch.uint8).set_(whole)
    assert bool(raw.any())
    pool.close()
    assert not bool(raw.any())
    events = pool.take_events()
    assert events[-2] == BlocksEvicted((ids[0],), (b"a",), "closed")
    last = events[-1]
    assert isinstance(last, BlocksZeroized)
    assert last.block_ids == (0, 1, 2, 3) and last.nbytes == 4 * pool.bytes_per_block
    assert pool.closed


def test_memory_reused_after_close_holds_no_kv() -> None:
    """A tensor allocated after close in the same process does not see the pool's data."""
    big = KVSpec(num_layers=4, num_kv_heads=8, head_dim=128, block_size=16)
    pool = BlockPool(big, 16)
    # a 64-bit pattern, so recycled memory holding other data cannot match it by chance
    # (a 16-bit marker did, about once in four full runs)
    marker = 0x0123_4567_89AB_CDEF
    for b in range(16):
        pool.block(b).view(torch.int64).fill_(marker)
    pool.close()
    fresh = torch.empty(16 * big.bytes_per_block // 8, dtype=torch.int64)
    assert not bool((fresh == marker).any())


def test_closed_pool_refuses_every_call_but_take_events() -> None:
    """After close every method raises PoolClosed; close() again and take_events() work."""
    pool = make_pool()
    pool.close()
    pool.close()
    calls: list[Callable[[], object]] = [
        lambda: pool.allocate(1),
        lambda: pool.free([0]),
        lambda: pool.set_keys([0], [b"a"]),
        lambda: pool.set_key(0, b"a"),
        lambda: pool.lookup([b"a"]),
        lambda: pool.revoke([0], "purged"),
        lambda: pool.expire(),
        lambda: pool.zeroize([0]),
        lambda: pool.block(0),
        lambda: pool.layer_view(0),
        lambda: pool.state(0),
        lambda: pool.ref_count(0),
        lambda: pool.key(0),
        lambda: pool.counts(),
        lambda: pool._check_invariants(),
    ]
    for call in calls:
        with pytest.raises(PoolClosed):
            call()
    assert isinstance(pool.take_events()[-1], BlocksZeroized)


# ---------------------------------------------------------------------- bad input


def _bad_calls() -> list[tuple[str, Callable[[BlockPool], object], type[Exception]]]:
    return [
        ("allocate negative", lambda p: p.allocate(-1), InvalidSpec),
        ("allocate bool", lambda p: p.allocate(True), InvalidSpec),
        ("allocate float", lambda p: p.allocate(2.0), InvalidSpec),  # type: ignore[arg-type]
        ("allocate too many", lambda p: p.allocate(7), OutOfBlocks),
        ("free unknown", lambda p: p.free([0, 99]), UnknownBlock),
        ("free negative", lambda p: p.free([0, -1]), UnknownBlock),
        ("free float", lambda p: p.free([0, 1.0]), UnknownBlock),  # type: ignore[list-item]
        ("free a FREE block", lambda p: p.free([0, 7]), BlockStateError),
        ("free a CACHED block", lambda p: p.free([0, 2]), BlockStateError),
        ("free twice", lambda p: p.free([0, 1, 1]), BlockStateError),
        ("free middle bad", lambda p: p.free([3, 0, 7, 1]), BlockStateError),
        ("key twice", lambda p: p.set_keys([1, 3], [b"z", b"y"]), KeyAlreadySet),
        ("key same block twice", lambda p: p.set_keys([1, 1], [b"y", b"z"]), KeyAlreadySet),
        ("key a CACHED block", lambda p: p.set_keys([1, 2], [b"y", b"z"]), BlockStateError),
        ("key unknown", lambda p: p.set_keys([1, 42], [b"y", b"z"]), UnknownBlock),
        ("key not bytes", lambda p: p.set_keys([1], ["s"]), InvalidSpec),  # type: ignore[list-item]
        ("key empty", lambda p: p.set_keys([1], [b""]), InvalidSpec),
        ("key lengths", lambda p: p.set_keys([1, 3], [b"y"]), InvalidSpec),
        ("priority high", lambda p: p.set_keys([1], [b"y"], priority=101), InvalidSpec),
        ("priority bool", lambda p: p.set_keys([1], [b"y"], priority=True), InvalidSpec),
        ("ttl negative", lambda p: p.set_keys([1], [b"y"], ttl=-1.0), InvalidSpec),
        ("ttl nan", lambda p: p.set_keys([1], [b"y"], ttl=float("nan")), InvalidSpec),
        ("lookup non-bytes", lambda p: p.lookup([b"k2", "k"]), InvalidSpec),  # type: ignore[list-item]
        ("revoke unknown", lambda p: p.revoke([2, 8], "purged"), UnknownBlock),
        ("expire bad now", lambda p: p.expire(now="soon"), InvalidSpec),  # type: ignore[arg-type]
        ("zeroize unknown", lambda p: p.zeroize([7, 8]), UnknownBlock),
        ("zeroize owned", lambda p: p.zeroize([7, 0]), BlockStateError),
    ]


@pytest.mark.parametrize(("name", "call", "error"), _bad_calls(), ids=[c[0] for c in _bad_calls()])
def test_bad_input_raises_typed_error_and_leaves_pool_unchanged(
    name: str, call: Callable[[BlockPool], object], error: type[Exception]
) -> None:
    """Each bad call raises its typed error and the pool is exactly as before."""
    pool = make_pool(8)
    ids = pool.allocate(4)  # 0 and 1 OWNED unkeyed, 2 CACHED, 3 OWNED keyed
    pool.set_keys([2, 3], [b"k2", b"k3"])
    pool.free([2])
    pool.lookup([b"k3"])  # 3 now has two references
    assert ids == [0, 1, 2, 3]
    before = snapshot(pool)
    with pytest.raises(error):
        call(pool)
    assert snapshot(pool) == before
    pool._check_invariants(check_zero=True)


# ---------------------------------------------------------------------- threads


def test_concurrent_callers_keep_the_pool_consistent() -> None:
    """Four threads allocating, keying, looking up and freeing leave every invariant intact."""
    pool = make_pool(64)
    errors: list[BaseException] = []

    def worker(tid: int) -> None:
        try:
            for i in range(300):
                ids = pool.allocate(4)
                key = f"{tid}-{i % 7}".encode()
                pool.set_keys(ids[:1], [key])
                hit = pool.lookup([key])
                pool.free(ids + hit)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert pool.counts().owned == 0
    pool._check_invariants(check_zero=True)


# ---------------------------------------------------------------------- stateful


NUM_BLOCKS = 6
KEYS = st.sampled_from([b"a", b"b", b"c", b"d"])
BLOCK_IDS = st.integers(0, NUM_BLOCKS - 1)
TTLS = st.sampled_from([None, 0.0, 1.0, 3.0, 5.0])


class PoolMachine(RuleBasedStateMachine):
    """Random operation sequences against a model of who holds which references."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.pool = BlockPool(SPEC, NUM_BLOCKS, clock=self.clock, verify=True)
        self.held: list[int] = []  # one entry per reference this model holds
        self.ttl: dict[int, float | None] = {}  # ttl given with each block's key
        self.cached_since: dict[int, float] = {}  # clock when each CACHED block became CACHED

    @initialize(order=st.permutations([0, 1, 2, 3]), ttl=TTLS)
    def warm(self, order: list[int], ttl: float | None) -> None:
        """Start with four CACHED blocks at two priorities, so hits and evictions happen."""
        ids = self.pool.allocate(4)
        self.pool.set_keys(ids[:2], [b"a", b"b"], priority=20, ttl=ttl)
        self.pool.set_keys(ids[2:], [b"c", b"d"], priority=60)
        self.ttl.update({ids[0]: ttl, ids[1]: ttl, ids[2]: None, ids[3]: None})
        self.pool.free([ids[i] for i in order])
        self.cached_since.update(dict.fromkeys(ids, self.clock.now))

    @rule(n=st.integers(0, 3))
    def allocate(self, n: int) -> None:
        counts = self.pool.counts()
        available = counts.free + counts.cached
        if n > available:
            with pytest.raises(OutOfBlocks):
                self.pool.allocate(n)
            return
        before = [self.pool.state(b) for b in range(self.pool.num_blocks)]
        ids = self.pool.allocate(n)
        assert len(set(ids)) == n
        for b in ids:
            assert before[b] in (BlockState.FREE, BlockState.CACHED)
            assert is_zero(self.pool, b)
            self.pool.block(b).fill_(1.5)  # the sequence writes KV
        self.held.extend(ids)

    @precondition(lambda self: bool(self.held))
    @rule(mask=st.integers(1, 2**16), cache=st.booleans())
    def free(self, mask: int, cache: bool) -> None:
        batch = [b for i, b in enumerate(self.held) if mask >> (i % 16) & 1] or self.held[:1]
        self.pool.free(batch, cache=cache)
        for b in batch:
            self.held.remove(b)

    @precondition(lambda self: bool(self.held))
    @rule(
        mask=st.integers(1, 2**NUM_BLOCKS),
        ks=st.lists(KEYS, min_size=NUM_BLOCKS, max_size=NUM_BLOCKS),
        priority=st.integers(0, 100),
        ttl=TTLS,
    )
    def set_keys(self, mask: int, ks: list[bytes], priority: int, ttl: float | None) -> None:
        unkeyed = sorted({b for b in self.held if self.pool.key(b) is None})
        ids = [b for b in unkeyed if mask >> b & 1 and b not in self.pool._detached]
        if not ids:
            return
        keys = ks[: len(ids)]
        result = self.pool.set_keys(ids, keys, priority=priority, ttl=ttl)
        for b, k, ok in zip(ids, keys, result, strict=True):
            assert (self.pool.key(b) == k) is ok
            if ok:
                self.ttl[b] = ttl

    @rule(ks=st.lists(KEYS, min_size=1, max_size=4))
    def lookup(self, ks: list[bytes]) -> None:
        ids = self.pool.lookup(ks)
        assert [self.pool.key(b) for b in ids] == ks[: len(ids)]
        self.held.extend(ids)

    @rule(ids=st.lists(BLOCK_IDS, max_size=4), reason=st.sampled_from(["purged", "x"]))
    def revoke(self, ids: list[int], reason: str) -> None:
        result = self.pool.revoke(ids, reason)
        for b in result.evicted:
            assert self.pool.state(b) is BlockState.FREE and b not in self.held
        for b in result.detached:
            assert self.pool.state(b) is BlockState.OWNED and self.pool.key(b) is None

    @rule(dt=st.sampled_from([0.0, 0.5, 1.0, 2.0, 4.0]))
    def tick_and_expire(self, dt: float) -> None:
        self.clock.now += dt
        now = self.clock.now
        due = set()
        for b, since in self.cached_since.items():
            ttl = self.ttl.get(b)
            if ttl is not None and since + ttl <= now:
                due.add(b)
        evicted = self.pool.expire()
        assert set(evicted) == due
        for b in evicted:
            assert self.pool.state(b) is BlockState.FREE

    @rule(ids=st.lists(BLOCK_IDS, max_size=4))
    def zeroize_free(self, ids: list[int]) -> None:
        free = [b for b in ids if self.pool.state(b) is BlockState.FREE]
        self.pool.zeroize(free)

    @invariant()
    def consistent(self) -> None:
        self.pool._check_invariants(check_zero=True)
        for b in range(self.pool.num_blocks):
            assert self.pool.ref_count(b) == self.held.count(b)
            state = self.pool.state(b)
            if state is BlockState.CACHED:
                self.cached_since.setdefault(b, self.clock.now)
            else:
                self.cached_since.pop(b, None)
            if self.pool.key(b) is None:
                self.ttl.pop(b, None)
        self.pool.take_events()


PoolMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=50, derandomize=True, deadline=None
)
test_pool_state_machine = PoolMachine.TestCase


# ---------------------------------------------------------------- whole-table batches
# free() of a sequence's whole block table: order, mixed keys, shared blocks.


def test_contiguous_keyed_range_is_cached_in_the_order_given() -> None:
    """Freeing blocks 0..5, all keyed, caches them in the given order (LRU order)."""
    pool = make_pool()
    ids = pool.allocate(6)
    pool.set_keys(ids, [bytes([i + 1]) for i in ids])
    pool.free([3, 1, 5, 0, 4, 2])
    assert list(pool._queue) == [3, 1, 5, 0, 4, 2]
    assert all(pool.state(b) is BlockState.CACHED for b in ids)
    pool._check_invariants()


def test_contiguous_unkeyed_range_is_zeroized_and_freed() -> None:
    """Freeing unkeyed blocks 2..5 zeroizes them in one event and makes them FREE."""
    pool = make_pool()
    ids = pool.allocate(6)
    fill(pool, ids)
    pool.take_events()
    pool.free(ids[2:][::-1])
    assert [pool.state(b) for b in ids] == [BlockState.OWNED] * 2 + [BlockState.FREE] * 4
    assert all(is_zero(pool, b) for b in ids[2:]) and not is_zero(pool, ids[0])
    (event,) = pool.take_events()
    assert isinstance(event, BlocksZeroized) and event.block_ids == (2, 3, 4, 5)
    pool._check_invariants(check_zero=True)


def test_contiguous_range_with_mixed_keys_splits_exactly() -> None:
    """Keyed blocks of a contiguous batch are cached, unkeyed ones zeroized."""
    pool = make_pool()
    ids = pool.allocate(4)
    fill(pool, ids)
    pool.set_keys([ids[0], ids[2]], [b"a", b"c"])
    pool.free(ids)
    assert [pool.state(b) for b in ids] == [
        BlockState.CACHED,
        BlockState.FREE,
        BlockState.CACHED,
        BlockState.FREE,
    ]
    assert pool.lookup([b"a"]) == [ids[0]]
    pool._check_invariants(check_zero=True)


def test_contiguous_keyed_range_with_cache_false_drops_every_key() -> None:
    """cache=False on a keyed contiguous batch drops the keys from the index too."""
    pool = make_pool()
    ids = pool.allocate(3)
    pool.set_keys(ids, [b"x", b"y", b"z"])
    pool.free(ids, cache=False)
    assert all(pool.state(b) is BlockState.FREE and pool.key(b) is None for b in ids)
    assert pool.lookup([b"x"]) == []
    pool._check_invariants(check_zero=True)


def test_contiguous_range_with_a_shared_block_decrements_it_only() -> None:
    """A block held twice inside a contiguous batch stays OWNED; the rest are released."""
    pool = make_pool()
    ids = pool.allocate(3)
    pool.set_keys(ids, [b"p", b"q", b"r"])
    assert pool.lookup([b"p"]) == [ids[0]]
    pool.free(ids)
    assert pool.state(ids[0]) is BlockState.OWNED and pool.ref_count(ids[0]) == 1
    assert pool.state(ids[1]) is BlockState.CACHED and pool.state(ids[2]) is BlockState.CACHED
    pool._check_invariants()


@pytest.mark.parametrize("bad", [[0, 1, 1], [0, 1, 8], [-1, 0, 1]])
def test_contiguous_looking_bad_batch_is_refused_unchanged(bad: list[int]) -> None:
    """Duplicates, out-of-range or negative ids in a range-like batch are refused
    with the pool unchanged."""
    pool = make_pool()
    pool.allocate(3)
    before = snapshot(pool)
    with pytest.raises((BlockStateError, UnknownBlock)):
        pool.free(bad)
    assert snapshot(pool) == before
