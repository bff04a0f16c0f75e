"""Tests for allocator.pool: construction, allocate / free, keys and lookup, eviction order,
threads and whole-table batches."""

from __future__ import annotations

import threading

import pytest
import torch

from kvgov.allocator import (
    BlockPool,
    BlocksAllocated,
    BlocksEvicted,
    BlocksHit,
    BlocksKeyed,
    BlockState,
    BlocksZeroized,
    PoolCounts,
)
from kvgov.exceptions import (
    BlockStateError,
    InvalidSpec,
    OutOfBlocks,
    UnknownBlock,
)
from tests.allocator.pool_helpers import SPEC, cached_pool, fill, is_zero, make_pool, snapshot

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
        ((SPEC, 4, "cuda:99"), "device"),
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
    assert pool.set_key(a, b"k", priority=5) is True
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


def test_cuda_without_cuda_is_a_typed_error() -> None:
    """device="cuda" where torch sees no CUDA device: InvalidSpec saying so, not an assert."""
    if torch.cuda.is_available():
        pool = BlockPool(SPEC, 4, "cuda")
        assert pool.device.type == "cuda"
        pool.close()
        return
    with pytest.raises(InvalidSpec, match="CUDA is not available"):
        BlockPool(SPEC, 4, "cuda")
