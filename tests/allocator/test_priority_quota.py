"""Priority durations (decay) and per-group floors and caps in kvgov's own pool."""

from __future__ import annotations

import pytest

from kvgov.allocator import BlockPool
from kvgov.allocator.events import BlocksEvicted
from kvgov.allocator.quota import Quota
from kvgov.exceptions import InvalidQuota, InvalidSpec

from .pool_helpers import make_pool


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def cache(
    pool: BlockPool, n: int, tag: str, *, group: str | None = None, **kw: object
) -> list[int]:
    """Allocate n blocks for ``group``, key them ``tag0..``, free them: CACHED, oldest first."""
    ids = pool.allocate(n, group=group)
    keys = [f"{tag}{i}".encode() for i in range(n)]
    pool.set_keys(ids, keys, group=group, **kw)  # type: ignore[arg-type]
    pool.free(ids)
    return ids


def evictions(pool: BlockPool) -> list[tuple[str, tuple[int, ...]]]:
    return [(e.reason, e.block_ids) for e in pool.take_events() if isinstance(e, BlocksEvicted)]


# ---------------------------------------------------------------- priorities


def test_low_priority_goes_first_with_reason_priority_then_lru_capacity() -> None:
    pool = make_pool(6)
    high = cache(pool, 2, "h", priority=90)
    low = cache(pool, 2, "l", priority=10)
    mid = cache(pool, 2, "m")
    pool.take_events()
    pool.allocate(3)
    assert evictions(pool) == [("priority", (*low, mid[0]))]
    pool.allocate(3)
    assert evictions(pool) == [("priority", (mid[1],)), ("capacity", tuple(high))]
    pool._check_invariants()


def test_equal_priorities_evict_in_plain_lru_order_as_capacity() -> None:
    pool = make_pool(4)
    a = cache(pool, 2, "a")
    b = cache(pool, 2, "b")
    pool.take_events()
    pool.allocate(3)
    assert evictions(pool) == [("capacity", (a[0], a[1], b[0]))]


def test_priority_decays_to_default_after_its_duration() -> None:
    clock = Clock()
    pool = make_pool(4, clock=clock)
    sticky = cache(pool, 2, "s", priority=90, duration=60.0)
    plain = cache(pool, 2, "p")
    pool.take_events()
    clock.now += 59.0
    pool.allocate(1)
    assert evictions(pool) == [("priority", (plain[0],))]  # still high: the default block goes
    clock.now += 1.0
    pool.allocate(1)
    # Decayed: both levels are now the default; the older decayed block was
    # requeued at the MRU end, so the remaining plain block goes first.
    assert evictions(pool) == [("capacity", (plain[1],))]
    pool.allocate(2)
    assert evictions(pool) == [("capacity", tuple(sticky))]
    assert pool._meta.priority[sticky[0]] == 50
    pool._check_invariants()


def test_decay_reaches_an_owned_block_and_a_rekey_forgets_the_old_duration() -> None:
    clock = Clock()
    pool = make_pool(3, clock=clock)
    ids = pool.allocate(1)
    pool.set_keys(ids, [b"x"], priority=80, duration=5)
    clock.now += 10
    other = cache(pool, 2, "o", priority=70)
    pool.take_events()
    pool.allocate(1)  # runs the decay: the OWNED block drops to 50
    assert pool._meta.priority[ids[0]] == 50
    pool.free(ids, cache=False)
    re = pool.allocate(1)
    assert re == ids
    pool.set_keys(re, [b"y"], priority=80)  # no duration now
    pool.free(re)
    clock.now += 1000
    pool.take_events()
    pool.allocate(2)
    # the re-keyed block keeps 80 (no stale decay), the 70 block goes first
    assert evictions(pool) == [("priority", (other[1],)), ("capacity", tuple(re))]


@pytest.mark.parametrize("duration", [0, -1.0, float("inf"), float("nan"), "5", True])
def test_a_bad_duration_is_refused(duration: object) -> None:
    pool = make_pool(2)
    ids = pool.allocate(1)
    with pytest.raises(InvalidSpec):
        pool.set_keys(ids, [b"k"], priority=60, duration=duration)  # type: ignore[arg-type]
    assert pool.key(ids[0]) is None


# ---------------------------------------------------------------- caps


def test_a_group_at_its_cap_evicts_its_own_blocks_never_another_groups() -> None:
    pool = make_pool(8)
    pool.set_quotas({"A": Quota(cap=3)})
    victim = cache(pool, 3, "b", group="B")
    flood = cache(pool, 3, "a", group="A")  # A at its cap
    pool.allocate(2)  # fill the free space
    pool.take_events()
    pool.allocate(2, group="A")
    assert evictions(pool) == [("cap", tuple(flood[:2]))]
    assert pool.cached_by_group() == {"A": 1, "B": 3}
    assert all(pool.key(b) is not None for b in victim)
    pool._check_invariants()


def test_a_group_over_its_cap_after_a_free_loses_its_own_oldest() -> None:
    pool = make_pool(8)
    pool.set_quotas({"A": Quota(cap=2)})
    first = cache(pool, 2, "a", group="A")
    pool.take_events()
    more = cache(pool, 2, "c", group="A")
    assert evictions(pool) == [("cap", tuple(first))]
    assert pool.cached_by_group() == {"A": 2}
    assert all(pool.key(b) is not None for b in more)


def test_lowering_a_cap_evicts_the_excess_at_once() -> None:
    pool = make_pool(8)
    ids = cache(pool, 4, "a", group="A")
    pool.take_events()
    pool.set_quotas({"A": Quota(cap=1)})
    assert evictions(pool) == [("cap", tuple(ids[:3]))]
    pool._check_invariants()


# ---------------------------------------------------------------- floors


def test_blocks_within_a_floor_go_only_when_nothing_else_can() -> None:
    pool = make_pool(6)
    pool.set_quotas({"B": Quota(floor=2)})
    victim = cache(pool, 2, "b", group="B")  # oldest, and lower priority
    flood = cache(pool, 4, "a", group="A", priority=90)
    pool.take_events()
    pool.allocate(4, group="A")
    assert evictions(pool) == [("capacity", tuple(flood))]
    pool.allocate(2, group="A")
    assert evictions(pool) == [("floor_pressure", tuple(victim))]
    pool._check_invariants()


def test_a_group_above_its_floor_gives_its_spare_blocks_in_lru_order() -> None:
    pool = make_pool(6)
    pool.set_quotas({"B": Quota(floor=1)})
    b = cache(pool, 3, "b", group="B")
    a = cache(pool, 3, "a", group="A")
    pool.take_events()
    pool.allocate(5, group="A")
    assert evictions(pool) == [("capacity", (b[0], b[1], *a))]
    assert pool.cached_by_group() == {"B": 1}


def test_set_quotas_keeps_the_eviction_order_and_removing_them_restores_plain_lru() -> None:
    pool = make_pool(6)
    ids = cache(pool, 2, "x", group="A") + cache(pool, 2, "y", group="B")
    ids += cache(pool, 2, "z", group="A", priority=10)
    before = list(pool._queue)
    pool.set_quotas({"A": Quota(floor=1)})
    assert list(pool._queue) == before
    pool.set_quotas(None)
    assert list(pool._queue) == before
    assert pool.quotas() == {}
    pool._check_invariants()


# ---------------------------------------------------------------- validation


def test_floors_that_add_up_to_more_than_the_pool_are_refused_and_nothing_changes() -> None:
    pool = make_pool(8)
    pool.set_quotas({"A": Quota(floor=4)})
    with pytest.raises(InvalidQuota, match="add up to 9 blocks"):
        pool.set_quotas({"A": Quota(floor=4), "B": Quota(floor=5)})
    assert pool.quotas() == {"A": Quota(floor=4)}


@pytest.mark.parametrize(
    "quota",
    [Quota(floor=-1), Quota(cap=-2), Quota(floor=3, cap=2), Quota(floor=1.5)],  # type: ignore[arg-type]
)
def test_a_malformed_quota_is_refused(quota: Quota) -> None:
    pool = make_pool(8)
    with pytest.raises(InvalidQuota):
        pool.set_quotas({"A": quota})
    assert pool.quotas() == {}
