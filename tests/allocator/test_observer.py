"""Tests for allocator.observer: evicted blocks are shown to an observer before zeroization."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from kvgov.allocator import BlockState, BlocksZeroized, EvictedBlocks
from kvgov.exceptions import InvalidSpec
from tests.allocator.pool_helpers import fill, is_zero, make_pool


class Seen:
    """An observer that copies what it is shown (ids, keys, reason, bytes)."""

    def __init__(self) -> None:
        self.calls: list[tuple[tuple[int, ...], tuple[bytes, ...], str, list[torch.Tensor]]] = []

    def __call__(self, evicted: EvictedBlocks) -> None:
        copies = [evicted.view(b).clone() for b in evicted.block_ids]
        self.calls.append((evicted.block_ids, evicted.keys, evicted.reason, copies))


def _cached(pool: Any, n: int, value: float = 3.0) -> list[int]:
    ids: list[int] = pool.allocate(n)
    fill(pool, ids, value)
    pool.set_keys(ids, [bytes([65 + i]) * 4 for i in range(n)])
    pool.free(ids)
    pool.take_events()
    return ids


def test_capacity_eviction_shows_the_bytes_before_they_are_zeroized() -> None:
    """allocate under pressure hands the observer ids, keys, reason and the KV still in place."""
    pool = make_pool(4)
    seen = Seen()
    pool.set_eviction_observer(seen)
    ids = _cached(pool, 4)
    got = pool.allocate(2)
    assert len(seen.calls) == 1
    block_ids, keys, reason, copies = seen.calls[0]
    assert block_ids == tuple(ids[:2]) and keys == (b"AAAA", b"BBBB") and reason == "capacity"
    assert all(bool((c == 3.0).all()) for c in copies)
    assert all(is_zero(pool, b) for b in got)
    pool._check_invariants(check_zero=True)


def test_every_reason_is_shown_and_close_shows_none() -> None:
    """evict and revoke batches are shown with their reasons; close zeroizes without a call."""
    pool = make_pool(4)
    seen = Seen()
    pool.set_eviction_observer(seen)
    ids = _cached(pool, 4)
    pool.evict([ids[0]], "expired")
    pool.revoke([ids[1]], "purged")
    assert [c[2] for c in seen.calls] == ["expired", "purged"]
    pool.close()
    assert len(seen.calls) == 2


def test_no_observer_no_call_and_none_removes_it() -> None:
    """Setting None removes the observer: later evictions are not shown."""
    pool = make_pool(2)
    seen = Seen()
    pool.set_eviction_observer(seen)
    pool.set_eviction_observer(None)
    _cached(pool, 2)
    pool.allocate(2)
    assert seen.calls == []


def test_an_observer_that_raises_loses_and_leaks_nothing() -> None:
    """The batch is zeroized and FREE, nothing is allocated, the error propagates."""
    pool = make_pool(4)

    def broken(evicted: EvictedBlocks) -> None:
        raise RuntimeError("observer bug")

    pool.set_eviction_observer(broken)
    ids = _cached(pool, 4)
    with pytest.raises(RuntimeError, match="observer bug"):
        pool.allocate(4)  # every block comes from eviction
    pool._check_invariants(check_zero=True)
    assert [pool.state(b) for b in ids] == [BlockState.FREE] * 4
    assert any(isinstance(e, BlocksZeroized) for e in pool.take_events())
    _cached(pool, 2)  # two FREE, two CACHED: an allocation of 3 evicts one
    with pytest.raises(RuntimeError, match="observer bug"):
        pool.allocate(3)
    pool._check_invariants(check_zero=True)
    assert pool.counts().free == 3 and pool.counts().cached == 1
    pool.set_eviction_observer(None)
    assert len(pool.allocate(4)) == 4


def test_a_non_callable_observer_is_refused() -> None:
    """Only a callable or None is accepted."""
    with pytest.raises(InvalidSpec, match="callable"):
        make_pool(2).set_eviction_observer("offload")  # type: ignore[arg-type]


def test_payload_is_the_blocks_bytes_without_a_copy() -> None:
    """On a host pool, payload(b) is a read-only byte view of exactly block b's bytes."""
    pool = make_pool(4)
    got: list[bytes] = []

    def keep(evicted: EvictedBlocks) -> None:
        for b in evicted.block_ids:
            view = evicted.payload(b)
            assert isinstance(view, memoryview) and view.readonly
            assert bytes(view) == evicted.view(b).contiguous().view(torch.uint8).numpy().tobytes()
            got.append(bytes(view))

    pool.set_eviction_observer(keep)
    ids = _cached(pool, 4)
    for i, b in enumerate(ids):
        pool.block(b).fill_(float(i + 1))
    pool.allocate(4)
    assert len(got) == 4 and len(set(got)) == 4
    assert all(len(g) == pool.bytes_per_block for g in got)
