"""Tests for allocator.pool under bad input and random operation sequences."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from kvgov.allocator import BlockPool, BlockState
from kvgov.exceptions import (
    BlockStateError,
    InvalidSpec,
    KeyAlreadySet,
    OutOfBlocks,
    UnknownBlock,
)
from tests.allocator.pool_helpers import SPEC, is_zero, make_pool, snapshot

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
        ("lookup non-bytes", lambda p: p.lookup([b"k2", "k"]), InvalidSpec),  # type: ignore[list-item]
        ("revoke unknown", lambda p: p.revoke([2, 8], "purged"), UnknownBlock),
        ("evict unknown", lambda p: p.evict([2, 8], "expired"), UnknownBlock),
        ("states unknown", lambda p: p.states([2, -1]), UnknownBlock),
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


# ---------------------------------------------------------------------- stateful


NUM_BLOCKS = 6
KEYS = st.sampled_from([b"a", b"b", b"c", b"d"])
BLOCK_IDS = st.integers(0, NUM_BLOCKS - 1)


class PoolMachine(RuleBasedStateMachine):
    """Random operation sequences against a model of who holds which references."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(SPEC, NUM_BLOCKS, verify=True)
        self.held: list[int] = []  # one entry per reference this model holds

    @initialize(order=st.permutations([0, 1, 2, 3]))
    def warm(self, order: list[int]) -> None:
        """Start with four CACHED blocks at two priorities, so hits and evictions happen."""
        ids = self.pool.allocate(4)
        self.pool.set_keys(ids[:2], [b"a", b"b"], priority=20)
        self.pool.set_keys(ids[2:], [b"c", b"d"], priority=60)
        self.pool.free([ids[i] for i in order])

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
    )
    def set_keys(self, mask: int, ks: list[bytes], priority: int) -> None:
        unkeyed = sorted({b for b in self.held if self.pool.key(b) is None})
        ids = [b for b in unkeyed if mask >> b & 1 and b not in self.pool._detached]
        if not ids:
            return
        keys = ks[: len(ids)]
        result = self.pool.set_keys(ids, keys, priority=priority)
        for b, k, ok in zip(ids, keys, result, strict=True):
            assert (self.pool.key(b) == k) is ok

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

    @rule(ids=st.lists(BLOCK_IDS, max_size=4))
    def evict(self, ids: list[int]) -> None:
        cached = [b for b in dict.fromkeys(ids) if self.pool.state(b) is BlockState.CACHED]
        assert self.pool.evict(ids, "expired") == cached
        for b in cached:
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
        self.pool.take_events()


PoolMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=50, derandomize=True, deadline=None
)
test_pool_state_machine = PoolMachine.TestCase
