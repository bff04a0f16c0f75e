"""Tests for govern.retention: deadlines start when a block becomes CACHED, exactly."""

from __future__ import annotations

import math

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvgov.allocator import BlockPool, BlocksCached, BlocksEvicted, BlockState, KVSpec
from kvgov.exceptions import InternalError, InvalidArgument
from kvgov.govern.retention import Deadlines

SPEC = KVSpec(num_layers=1, num_kv_heads=1, head_dim=4, block_size=4)


class Clock:
    """A settable clock."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Wired:
    """A pool and deadlines wired the way the governor wires them (BlocksCached -> cached)."""

    def __init__(self, num_blocks: int = 8) -> None:
        self.clock = Clock()
        self.pool = BlockPool(SPEC, num_blocks, verify=True)
        self.deadlines = Deadlines(num_blocks, self.clock)

    def key(self, ids: list[int], keys: list[bytes], ttl: float | None) -> None:
        ok = self.pool.set_keys(ids, keys)
        self.deadlines.keyed([b for b, k in zip(ids, ok, strict=True) if k], ttl)

    def free(self, ids: list[int]) -> None:
        """Free and drain in one step, as the governor does after every pool call."""
        self.pool.free(ids)
        self.drain()

    def drain(self) -> list[object]:
        events = self.pool.take_events()
        for event in events:
            if isinstance(event, BlocksCached):
                self.deadlines.cached(event.block_ids)
        return list(events)

    def sweep(self) -> list[int]:
        self.drain()
        due = self.deadlines.due(self.clock())
        return self.pool.evict(due, "expired") if due else []


def test_blocks_expire_ttl_seconds_after_they_became_cached() -> None:
    """A CACHED block is due ttl seconds after its release, by the injected clock."""
    w = Wired()
    a, b, c = w.pool.allocate(3)
    w.key([a, b], [b"a", b"b"], ttl=10.0)
    w.key([c], [b"c"], ttl=None)
    w.clock.now = 5.0
    w.free([a, b, c])  # deadlines 15
    w.clock.now = 14.9
    assert w.sweep() == []
    w.clock.now = 15.0
    assert w.sweep() == [a, b]
    assert w.pool.state(c) is BlockState.CACHED
    events = w.drain()
    assert BlocksEvicted((a, b), (b"a", b"b"), "expired") in events
    w.clock.now = 1e9
    assert w.sweep() == []


def test_a_hit_restarts_the_clock() -> None:
    """A block looked up and freed again gets a new deadline; the old one is ignored."""
    w = Wired()
    (a,) = w.pool.allocate(1)
    w.key([a], [b"a"], ttl=10.0)
    w.free([a])  # deadline 10
    w.clock.now = 8.0
    w.pool.lookup([b"a"])
    w.free([a])  # deadline 18
    w.clock.now = 12.0
    assert w.sweep() == []
    w.clock.now = 18.0
    assert w.sweep() == [a]


def test_owned_blocks_do_not_expire() -> None:
    """A block hit and still OWNED past its deadline stays; released, it gets a new one."""
    w = Wired()
    (a,) = w.pool.allocate(1)
    w.key([a], [b"a"], ttl=1.0)
    w.free([a])
    w.pool.lookup([b"a"])
    w.clock.now = 100.0
    assert w.sweep() == []
    assert w.pool.state(a) is BlockState.OWNED
    w.free([a])  # deadline 101
    w.clock.now = 100.5
    assert w.sweep() == []
    w.clock.now = 101.0
    assert w.sweep() == [a]


def test_the_heap_is_compacted() -> None:
    """Stale entries from many hits are dropped once the heap outgrows the pool."""
    w = Wired(2)
    (a,) = w.pool.allocate(1)
    w.key([a], [b"a"], ttl=100.0)
    for _ in range(200):
        w.free([a])
        w.clock.now += 0.5
        w.pool.lookup([b"a"])
    w.free([a])
    assert len(w.deadlines._heap) <= 2 * 2 + 64
    w.deadlines._check_invariants([a])


def test_mixed_ttls_in_one_release_get_their_own_deadlines() -> None:
    """Blocks released together with different ttls expire each at its own time."""
    w = Wired()
    a, b = w.pool.allocate(2)
    w.key([a], [b"a"], ttl=1.0)
    w.key([b], [b"b"], ttl=2.0)
    w.free([a, b])
    w.clock.now = 1.0
    assert w.sweep() == [a]
    w.clock.now = 2.0
    assert w.sweep() == [b]


@pytest.mark.parametrize("ttl", [-1.0, math.nan, math.inf, True, "1"])
def test_a_bad_ttl_is_refused(ttl: object) -> None:
    """A ttl that is negative or not a finite number raises InvalidArgument."""
    with pytest.raises(InvalidArgument):
        Deadlines(4, Clock()).keyed([0], ttl)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument):
        Deadlines(4, Clock()).keyed_cached([0], ttl)  # type: ignore[arg-type]


@pytest.mark.parametrize("ttl", [None, 0.0, 5.0])
def test_keyed_cached_is_keyed_then_cached(ttl: float | None) -> None:
    """A pool that caches blocks as they are keyed (SGLang's tree) records in one call what
    keyed then cached record: the same deadlines, due at the same time."""
    one, two = Clock(), Clock()
    a, b = Deadlines(8, one), Deadlines(8, two)
    one.now = two.now = 10.0
    a.keyed_cached([1, 2, 5], ttl)
    b.keyed([1, 2, 5], ttl)
    b.cached([1, 2, 5])
    assert [a.deadline(i) for i in range(8)] == [b.deadline(i) for i in range(8)]
    a._check_invariants([1, 2, 5])
    one.now = two.now = 10.0 + (ttl or 0.0)
    assert a.due(one()) == b.due(two()) == ([] if ttl is None else [1, 2, 5])


def test_the_invariant_check_finds_a_missing_deadline() -> None:
    """A CACHED block with a ttl but no pending deadline is reported as a bug."""
    deadlines = Deadlines(4, Clock())
    deadlines.keyed([1], 5.0)
    with pytest.raises(InternalError):
        deadlines._check_invariants([1])


NUM_BLOCKS = 6
KEYS = st.sampled_from([b"a", b"b", b"c", b"d"])
TTLS = st.sampled_from([None, 1.0, 3.0, 5.0])


class RetentionMachine(RuleBasedStateMachine):
    """Random hits, releases and clock steps: exactly the blocks past their deadline expire."""

    def __init__(self) -> None:
        super().__init__()
        self.w = Wired(NUM_BLOCKS)
        self.held: list[int] = []
        self.ttl: dict[int, float | None] = {}  # ttl given with each block's key
        self.since: dict[int, float] = {}  # when each CACHED block became CACHED

    @initialize(ttl=TTLS)
    def warm(self, ttl: float | None) -> None:
        ids = self.w.pool.allocate(4)
        self.w.key(ids[:2], [b"a", b"b"], ttl)
        self.w.key(ids[2:], [b"c", b"d"], None)
        self.ttl.update({ids[0]: ttl, ids[1]: ttl, ids[2]: None, ids[3]: None})
        self.w.free(ids)
        self.w.drain()

    @rule(ks=st.lists(KEYS, min_size=1, max_size=4))
    def lookup(self, ks: list[bytes]) -> None:
        self.held.extend(self.w.pool.lookup(ks))

    @precondition(lambda self: bool(self.held))
    @rule(n=st.integers(1, 4))
    def release(self, n: int) -> None:
        batch, self.held = self.held[:n], self.held[n:]
        self.w.free(batch)
        self.w.drain()

    @rule(dt=st.sampled_from([0.0, 0.5, 1.0, 2.0, 4.0]))
    def tick_and_sweep(self, dt: float) -> None:
        self.w.clock.now += dt
        now = self.w.clock.now
        due = {
            b
            for b, since in self.since.items()
            if self.ttl.get(b) is not None and since + self.ttl[b] <= now  # type: ignore[operator]
        }
        assert set(self.w.sweep()) == due

    @invariant()
    def consistent(self) -> None:
        pool = self.w.pool
        states = pool.states(range(NUM_BLOCKS))  # type: ignore[arg-type]
        for b, state in enumerate(states):
            if state is BlockState.CACHED:
                self.since.setdefault(b, self.w.clock.now)
            else:
                self.since.pop(b, None)
            if pool.key(b) is None:
                self.ttl.pop(b, None)
        self.w.deadlines._check_invariants(
            b for b, s in enumerate(states) if s is BlockState.CACHED
        )
        pool._check_invariants(check_zero=True)


RetentionMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, derandomize=True, deadline=None
)
test_retention_state_machine = RetentionMachine.TestCase
