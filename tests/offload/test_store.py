"""OffloadStore: offload and restore through ordered tiers, policy, retention, stats."""

from __future__ import annotations

import os
import random
from collections.abc import Callable

import pytest
import torch

from kvgov.exceptions import InvalidOffloadArgument, TierUnavailable, UnknownTier
from kvgov.offload import HostMemoryTier, MissReason, OffloadStore, PutOutcome, SealedBlock, Tier
from tests.support.clock import START, FakeClock
from tests.support.offload import MemoryKeyStore

BK, SD = b"K" * 32, b"S" * 32
PAYLOAD = os.urandom(4096)


@pytest.fixture()
def local(make_tier: Callable[..., Tier], make_store: Callable[..., OffloadStore]) -> OffloadStore:
    """A store over a host tier and a disk tier."""
    return make_store([make_tier("host"), make_tier("disk")])


def test_offload_stores_in_every_allowed_tier_and_restores_from_the_first(
    local: OffloadStore,
) -> None:
    """A block offloaded to both tiers is restored from the first, byte for byte."""
    result = local.offload(BK, SD, "acme", START + 60, PAYLOAD)
    assert result.stored_in == ("host", "disk") and result.key_id is not None
    assert all(p.nbytes > len(PAYLOAD) for p in result.puts)
    hit = local.restore(BK, SD, "acme")
    assert hit.hit and hit.tier == "host" and hit.payload == PAYLOAD
    assert hit.key_id == result.key_id and hit.refusals == ()


def test_a_later_tier_serves_when_the_first_lost_the_block(local: OffloadStore) -> None:
    """With the host copy gone (evicted, say), the disk copy is restored."""
    local.offload(BK, SD, "acme", START + 60, PAYLOAD)
    local._states["host"].tier.delete(BK)
    hit = local.restore(BK, SD, "acme")
    assert hit.hit and hit.tier == "disk" and hit.payload == PAYLOAD


def test_only_the_tiers_the_policy_allowed_are_written(local: OffloadStore) -> None:
    """tiers= names the allowed tiers; the others report NOT_ALLOWED and hold nothing."""
    result = local.offload(BK, SD, "acme", START + 60, PAYLOAD, tiers={"disk"})
    assert [p.outcome for p in result.puts] == [PutOutcome.NOT_ALLOWED, PutOutcome.STORED]
    assert local.restore(BK, SD, "acme").tier == "disk"  # type: ignore[union-attr]
    nothing = local.offload(b"L" * 32, SD, "acme", START + 60, PAYLOAD, tiers=())
    assert nothing.stored_in == ()
    with pytest.raises(UnknownTier, match="host"):
        local.offload(BK, SD, "acme", START + 60, PAYLOAD, tiers={"gpu"})


def test_an_already_expired_block_is_not_offloaded(local: OffloadStore) -> None:
    """A deadline at or before now stores nothing and creates no key."""
    result = local.offload(BK, SD, "acme", START, PAYLOAD)
    assert {p.outcome for p in result.puts} == {PutOutcome.EXPIRED} and result.key_id is None


def test_a_block_larger_than_a_tier_skips_it(
    make_tier: Callable[..., Tier], make_store: Callable[..., OffloadStore]
) -> None:
    """A tier too small for the object reports TOO_LARGE; a larger one still stores it."""
    store = make_store([make_tier("host", capacity=1024), make_tier("disk")])
    result = store.offload(BK, SD, "acme", START + 60, PAYLOAD)
    assert [p.outcome for p in result.puts] == [PutOutcome.TOO_LARGE, PutOutcome.STORED]


def test_restore_checks_deadlines_and_sweep_removes_expired(
    local: OffloadStore, clock: FakeClock
) -> None:
    """Past its deadline a block is a miss (EXPIRED) and is deleted; sweep deletes the rest."""
    local.offload(BK, SD, "acme", START + 10, PAYLOAD)
    local.offload(b"L" * 32, SD, "acme", START + 10, PAYLOAD)
    local.offload(b"M" * 32, SD, "acme", START + 100, PAYLOAD)
    clock.advance(10)
    miss = local.restore(BK, SD, "acme")
    assert not miss.hit and miss.reason is MissReason.EXPIRED
    report = local.sweep()
    assert report.deleted == {"host": 1, "disk": 1} and report.unreachable == ()
    assert local.restore(b"M" * 32, SD, "acme").hit
    stats = local.stats().tiers["host"]
    assert stats.expired == 2 and stats.stored_blocks == 1


def test_delete_where_invalidates_by_scope_and_refuses_replays(local: OffloadStore) -> None:
    """Invalidation by scope digest deletes those blocks; putting one back is refused."""
    local.offload(BK, SD, "acme", START + 60, PAYLOAD)
    local.offload(b"L" * 32, b"T" * 32, "acme", START + 60, PAYLOAD)
    host = local._states["host"].tier
    old = host.get(BK)
    report = local.delete_where(lambda info: info.scope_digest == SD)
    assert report.deleted == {"host": 1, "disk": 1} and report.total == 2
    assert local.restore(b"L" * 32, b"T" * 32, "acme").hit
    assert old is not None
    host.put(old, 0)  # someone puts the invalidated object back
    miss = local.restore(BK, SD, "acme")
    assert not miss.hit and miss.reason is MissReason.REPLAYED


def test_restore_into_a_buffer_and_a_tensor(local: OffloadStore) -> None:
    """into= decrypts straight into a bytearray or a contiguous CPU tensor."""
    block = torch.arange(1024, dtype=torch.float32)
    local.offload(BK, SD, "acme", START + 60, block)
    out = torch.zeros(1024, dtype=torch.float32)
    hit = local.restore(BK, SD, "acme", into=out)
    assert hit.hit and torch.equal(out, block)
    buf = bytearray(4096)
    assert local.restore(BK, SD, "acme", into=buf).hit and bytes(buf) == block.numpy().tobytes()
    with pytest.raises(InvalidOffloadArgument, match="4096 bytes"):
        local.restore(BK, SD, "acme", into=bytearray(10))
    with pytest.raises(InvalidOffloadArgument, match="writable"):
        local.restore(BK, SD, "acme", into=b"x" * 4096)


def test_bfloat16_tensors_offload_as_their_bytes(local: OffloadStore) -> None:
    """A tensor of any dtype offloads as its raw bytes (numpy has no bfloat16)."""
    block = torch.randn(2, 8, dtype=torch.bfloat16)
    local.offload(BK, SD, "acme", START + 60, block)
    out = torch.empty(2, 8, dtype=torch.bfloat16)
    assert local.restore(BK, SD, "acme", into=out).hit and torch.equal(out, block)


@pytest.mark.parametrize(
    ("args", "name"),
    [
        ((b"", SD, "acme", START + 60, b"x"), "block_key"),
        ((BK, "digest", "acme", START + 60, b"x"), "scope_digest"),
        ((BK, SD, "", START + 60, b"x"), "tenant"),
        ((BK, SD, "acme", float("nan"), b"x"), "deadline"),
        ((BK, SD, "acme", START + 60, object()), "payload"),
    ],
)
def test_malformed_arguments_are_refused(
    local: OffloadStore, args: tuple[object, ...], name: str
) -> None:
    """Each malformed argument raises InvalidOffloadArgument naming it."""
    with pytest.raises(InvalidOffloadArgument, match=name):
        local.offload(*args)


def test_tier_names_must_differ(make_tier: Callable[..., Tier], key_store: MemoryKeyStore) -> None:
    """Two tiers with one name, or no tier at all, are refused at construction."""
    from .conftest import KEK

    with pytest.raises(InvalidOffloadArgument, match="differ"):
        OffloadStore([make_tier("host"), make_tier("host")], key_store, KEK)
    with pytest.raises(InvalidOffloadArgument, match="at least one"):
        OffloadStore([], key_store, KEK)


def test_stats_count_puts_hits_and_misses(local: OffloadStore) -> None:
    """Per-tier counters follow what happened, and usage is read from the tier."""
    local.offload(BK, SD, "acme", START + 60, PAYLOAD)
    local.restore(BK, SD, "acme")
    local.restore(b"Z" * 32, SD, "acme")
    host, disk = local.stats().tiers["host"], local.stats().tiers["disk"]
    assert (host.puts, host.hits, host.misses, host.stored_blocks) == (1, 1, 1, 1)
    assert (disk.puts, disk.hits, disk.misses) == (1, 0, 1)
    assert host.put_bytes == host.stored_bytes and host.available and host.refusals == {}


class _Flaky(HostMemoryTier):
    """A host tier whose puts fail while ``down`` is set; it notes when it was tried."""

    down = False

    def __init__(self, clock: FakeClock) -> None:
        super().__init__(1 << 20, name="flaky")
        self.clock = clock
        self.tried: list[float] = []

    def put(self, obj: SealedBlock, now_us: int) -> list[object]:
        self.tried.append(self.clock.now)
        if self.down:
            raise TierUnavailable(self.name, "switched off by the test")
        return super().put(obj, now_us)  # type: ignore[return-value]


def test_a_failing_tier_is_skipped_longer_after_each_failure_in_a_row(
    make_store: Callable[..., OffloadStore], clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tries 5, 10, 20, 40, 60 s apart (no jitter drawn) while it fails; 5 s after a success."""
    monkeypatch.setattr(random, "uniform", lambda a, b: a)
    flaky = _Flaky(clock)
    store = make_store([flaky], retry_seconds=5, retry_max_seconds=60)

    def put() -> PutOutcome:
        result = store.offload(b"k" * 32, b"s" * 32, "acme", clock.now + 600, b"kv" * 64)
        return result.puts[0].outcome

    flaky.down = True
    while len(flaky.tried) < 6:
        assert put() is PutOutcome.UNAVAILABLE
        assert not store.stats().tiers["flaky"].available
        clock.advance(0.5)
    start = flaky.tried[0]
    assert [b - a for a, b in zip(flaky.tried, flaky.tried[1:], strict=False)] == [
        5,
        10,
        20,
        40,
        60,
    ]
    assert start == START
    flaky.down = False
    clock.advance(60)
    assert put() is PutOutcome.STORED and store.stats().tiers["flaky"].available
    flaky.down = True
    assert put() is PutOutcome.UNAVAILABLE
    clock.advance(4.5)
    flaky.down = False
    assert put() is PutOutcome.UNAVAILABLE  # skipped: 5 s have not passed
    clock.advance(0.5)
    assert put() is PutOutcome.STORED


def test_a_device_block_is_filled_through_a_staging_buffer_left_zero(
    local: OffloadStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """into= a non-CPU tensor: decrypted into host staging, copied, then the staging is zeroed.

    A ``meta`` tensor stands in for a GPU block (the same path: not ``cpu``). The
    staging buffer comes from torch's allocator, which hands it out again: plaintext
    left there would outlive the restore.
    """
    made: list[torch.Tensor] = []
    real_empty = torch.empty

    def recording_empty(*args: object, **kwargs: object) -> torch.Tensor:
        made.append(real_empty(*args, **kwargs))  # type: ignore[call-overload]
        return made[-1]

    local.offload(BK, SD, "acme", START + 60, PAYLOAD)
    monkeypatch.setattr(torch, "empty", recording_empty)
    device_block = real_empty(2048, dtype=torch.float16, device="meta")
    hit = local.restore(BK, SD, "acme", into=device_block)
    assert hit.hit and hit.tier == "host"
    assert len(made) == 1 and made[0].numel() == len(PAYLOAD)
    assert not made[0].any(), "plaintext left in the staging buffer"
