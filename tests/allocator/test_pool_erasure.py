"""Tests for BlockPool's erasure: evict, revoke, zeroize, remanence and close."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from kvgov.allocator import (
    BlockPool,
    BlocksCached,
    BlocksEvicted,
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
from tests.allocator.pool_helpers import fill, is_zero, make_pool, snapshot

# ---------------------------------------------------------------------- evict


def test_evict_takes_only_the_cached_blocks_given() -> None:
    """evict zeroizes the CACHED blocks among its ids, in the order given; others stay."""
    pool = make_pool()
    a, b, c, d = pool.allocate(4)
    pool.set_keys([a, b, c], [b"a", b"b", b"c"])
    fill(pool, [a, b, c, d])
    pool.free([a, b, c])
    pool.lookup([b"a"])  # a is OWNED again
    pool.take_events()
    assert pool.evict([c, a, b, d, c], "expired") == [c, b]
    assert pool.state(a) is BlockState.OWNED and pool.key(a) == b"a"
    assert pool.state(d) is BlockState.OWNED and not is_zero(pool, d)
    assert all(pool.state(x) is BlockState.FREE and is_zero(pool, x) for x in (b, c))
    events = pool.take_events()
    assert events[0] == BlocksEvicted((c, b), (b"c", b"b"), "expired")
    assert isinstance(events[1], BlocksZeroized) and events[1].block_ids == (b, c)
    pool._check_invariants(check_zero=True)


def test_evict_of_nothing_cached_emits_nothing() -> None:
    """Blocks that are all FREE or OWNED: evict returns [] and emits no event."""
    pool = make_pool()
    pool.allocate(2)
    pool.take_events()
    assert pool.evict([0, 1, 5], "expired") == []
    assert pool.take_events() == []


def test_evict_needs_a_reason() -> None:
    """An empty or non-string reason raises InvalidSpec."""
    pool = make_pool()
    for reason in ("", None, 3):
        with pytest.raises(InvalidSpec):
            pool.evict([0], reason)  # type: ignore[arg-type]


def test_free_reports_blocks_that_became_cached() -> None:
    """A free that caches keyed blocks emits BlocksCached with them, in queue order."""
    pool = make_pool()
    a, b, c = pool.allocate(3)
    pool.set_keys([a, c], [b"a", b"c"])
    pool.take_events()
    pool.free([c, b, a])
    events = pool.take_events()
    assert BlocksCached((c, a)) in events
    assert not any(isinstance(e, BlocksCached) for e in (pool.free([]) or []))


def test_states_and_read_back_zero() -> None:
    """states() reads many blocks at once; read_back_zero() tells zero from KV."""
    pool = make_pool()
    a, b = pool.allocate(2)
    pool.set_key(a, b"a")
    pool.free([a])
    assert pool.states([a, b, 7]) == [BlockState.CACHED, BlockState.OWNED, BlockState.FREE]
    assert pool.read_back_zero([a, b, 7]) is True
    fill(pool, [b])
    assert pool.read_back_zero([a, b]) is False
    assert pool.read_back_zero([]) is True
    with pytest.raises(UnknownBlock):
        pool.states([8])


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
    pool = make_pool(4, verify=True)
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
    elif path == "evict_chosen":
        pool.set_keys(ids, [b"a", b"b"])
        pool.free(ids)
        pool.evict(ids, "expired")
    elif path == "zeroize":
        pool.free(ids)
        fill(pool, ids, 9.0)  # a stray write into FREE blocks: erasure clears it
        pool.zeroize(ids)
    return pool, ids


@pytest.mark.parametrize(
    "path",
    ["free", "free_uncached", "evict", "revoke", "revoke_owned", "evict_chosen", "zeroize"],
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
        lambda: pool.evict([0], "expired"),
        lambda: pool.zeroize([0]),
        lambda: pool.block(0),
        lambda: pool.layer_view(0),
        lambda: pool.state(0),
        lambda: pool.states([0]),
        lambda: pool.read_back_zero([0]),
        lambda: pool.ref_count(0),
        lambda: pool.key(0),
        lambda: pool.counts(),
        lambda: pool._check_invariants(),
    ]
    for call in calls:
        with pytest.raises(PoolClosed):
            call()
    assert isinstance(pool.take_events()[-1], BlocksZeroized)
