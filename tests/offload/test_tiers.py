"""Each tier kind (host, disk, Redis) behind the one protocol: LRU, capacity, deletion, expiry."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from typing import Any

import pytest
import redis

from kvgov.exceptions import InvalidOffloadArgument
from kvgov.offload import DiskTier, HostMemoryTier, ObjectInfo, RedisTier, SealedBlock, Tier

from .conftest import REDIS_KINDS, TIER_KINDS

NOW_US = 1_700_000_000_000_000


def obj(i: int, *, tenant: str = "acme", scope: bytes = b"S" * 32, size: int = 100,
        deadline_us: int = NOW_US + 60_000_000) -> SealedBlock:  # fmt: skip
    """A sealed-looking block number ``i`` (tiers never decrypt)."""
    return SealedBlock(
        block_key=i.to_bytes(32, "big"),
        scope_digest=scope,
        tenant=tenant,
        deadline_us=deadline_us,
        written_us=NOW_US,
        key_id=b"i" * 16,
        salt=b"s" * 16,
        nonce=b"n" * 12,
        ciphertext=bytes([i % 256]) * size,
    )


NBYTES = obj(0).nbytes


def _keys(infos: list[ObjectInfo]) -> list[int]:
    return [int.from_bytes(i.block_key, "big") for i in infos]


@pytest.fixture(params=TIER_KINDS)
def tier(request: pytest.FixtureRequest, make_tier: Callable[..., Tier]) -> Tier:
    """One tier of each kind, holding exactly three objects of NBYTES."""
    return make_tier(request.param, capacity=3 * NBYTES)


def test_put_get_round_trip(tier: Tier) -> None:
    """A stored object comes back field for field, and usage counts it."""
    tier.put(obj(1), NOW_US)
    got = tier.get((1).to_bytes(32, "big"))
    assert got is not None and bytes(got.ciphertext) == bytes(obj(1).ciphertext)
    assert (got.tenant, got.deadline_us, got.key_id) == ("acme", obj(1).deadline_us, b"i" * 16)
    assert tier.get((9).to_bytes(32, "big")) is None
    u = tier.usage()
    assert (u.stored_bytes, u.stored_blocks) == (NBYTES, 1)


def test_lru_eviction_order_is_exact(tier: Tier) -> None:
    """At capacity the least recently used object goes first; a get makes one recent."""
    for i in (1, 2, 3):
        assert tier.put(obj(i), NOW_US) == []
    tier.get((1).to_bytes(32, "big"))
    assert _keys(tier.put(obj(4), NOW_US)) == [2]
    assert _keys(tier.put(obj(5), NOW_US)) == [3]
    assert _keys(tier.put(obj(6), NOW_US)) == [1]
    assert tier.usage().stored_bytes == 3 * NBYTES


def test_replacing_a_key_is_not_an_eviction(tier: Tier) -> None:
    """Putting a block key again replaces its object and evicts nothing."""
    for i in (1, 2, 3):
        tier.put(obj(i), NOW_US)
    assert tier.put(obj(2), NOW_US) == []
    assert tier.usage().stored_blocks == 3


def test_an_object_larger_than_the_tier_is_refused(tier: Tier) -> None:
    """An object over the whole capacity is a caller mistake (the store checks first)."""
    with pytest.raises(InvalidOffloadArgument, match="capacity"):
        tier.put(obj(1, size=4 * NBYTES), NOW_US)


def test_delete_by_tenant_and_predicate(tier: Tier) -> None:
    """delete_by_tenant and delete_where remove exactly the matching objects."""
    tier.put(obj(1, tenant="acme"), NOW_US)
    tier.put(obj(2, tenant="beta", scope=b"T" * 32), NOW_US)
    tier.put(obj(3, tenant="beta"), NOW_US)
    assert _keys(tier.delete_by_tenant("acme")) == [1]
    assert _keys(tier.delete_where(lambda i: i.scope_digest == b"T" * 32)) == [2]
    assert tier.get((3).to_bytes(32, "big")) is not None
    info = tier.delete((3).to_bytes(32, "big"))
    assert info is not None and info.tenant == "beta" and info.nbytes == NBYTES
    assert tier.delete((3).to_bytes(32, "big")) is None
    assert tier.usage().stored_blocks == 0


def test_list_expired(tier: Tier) -> None:
    """list_expired names the objects whose deadline is at or before now."""
    tier.put(obj(1, deadline_us=NOW_US + 10), NOW_US)
    tier.put(obj(2, deadline_us=NOW_US + 20), NOW_US)
    assert _keys(tier.list_expired(NOW_US + 10)) == [1]
    assert sorted(_keys(tier.list_expired(NOW_US + 20))) == [1, 2]


@pytest.mark.parametrize("capacity", [0, -1, 1.5, True])
def test_capacity_must_be_a_positive_int(capacity: object) -> None:
    """A zero, negative or non-int capacity is refused at construction."""
    with pytest.raises(InvalidOffloadArgument, match="capacity_bytes"):
        HostMemoryTier(capacity)  # type: ignore[arg-type]


def test_tier_names_are_checked() -> None:
    """An empty or over-long tier name is refused (it is length-prefixed in the AAD)."""
    for bad in ("", "x" * 65):
        with pytest.raises(InvalidOffloadArgument, match="tier name"):
            HostMemoryTier(1024, name=bad)


def test_host_tier_is_not_pinned_without_cuda() -> None:
    """pin_memory=None pins only where CUDA is available."""
    import torch

    assert HostMemoryTier(1024).pinned is torch.cuda.is_available()


@pytest.mark.gpu
def test_host_tier_pins_ciphertext_on_cuda_hosts() -> None:
    """With CUDA, the ciphertext lives in page-locked memory and still reads back."""
    tier = HostMemoryTier(1 << 20, pin_memory=True)
    tier.put(obj(1), NOW_US)
    got = tier.get((1).to_bytes(32, "big"))
    assert tier.pinned and got is not None and bytes(got.ciphertext) == bytes(obj(1).ciphertext)


def test_disk_writes_are_atomic_and_private(make_tier: Callable[..., Tier]) -> None:
    """A put leaves one 0600 file under a hashed name and nothing in tmp/."""
    tier = make_tier("disk")
    assert isinstance(tier, DiskTier)
    tier.put(obj(1), NOW_US)
    path = tier.path_of((1).to_bytes(32, "big"))
    assert path.is_file() and stat.S_IMODE(path.stat().st_mode) == 0o600
    assert list((tier.root / "tmp").iterdir()) == []
    assert (1).to_bytes(32, "big").hex() not in str(path)


def test_disk_tier_removes_a_previous_process_leftovers(tmp_path: os.PathLike[str]) -> None:
    """Objects and partial writes a previous process left are deleted; other files are not."""
    first = DiskTier(tmp_path, 1 << 20)
    first.put(obj(1), NOW_US)
    (first.root / "tmp" / "x.1234.tmp").write_bytes(b"partial")
    (first.root / "README").write_text("not ours")
    second = DiskTier(tmp_path, 1 << 20)
    assert second.get((1).to_bytes(32, "big")) is None
    assert not list(second.root.glob("objects/*/*.kvo")) and not list(second.root.glob("tmp/*"))
    assert (second.root / "README").exists()


def test_disk_tier_treats_a_vanished_file_as_a_miss(make_tier: Callable[..., Tier]) -> None:
    """A file deleted behind the tier's back is a miss and leaves the index."""
    tier = make_tier("disk")
    assert isinstance(tier, DiskTier)
    tier.put(obj(1), NOW_US)
    tier.path_of((1).to_bytes(32, "big")).unlink()
    assert tier.get((1).to_bytes(32, "big")) is None and tier.usage().stored_blocks == 0


def test_disk_close_deletes_the_files(make_tier: Callable[..., Tier]) -> None:
    """Closing the disk tier deletes its object files."""
    tier = make_tier("disk")
    assert isinstance(tier, DiskTier)
    tier.put(obj(1), NOW_US)
    tier.close()
    assert not list(tier.root.glob("objects/*/*.kvo"))


def test_local_tiers_keep_their_accounting(make_tier: Callable[..., Tier]) -> None:
    """After a mix of puts, replacements and deletes the byte counts still add up."""
    for kind in ("host", "disk"):
        tier = make_tier(kind, capacity=5 * NBYTES)
        for i in range(20):
            tier.put(obj(i % 7, size=100 + (i % 3)), NOW_US)
            if i % 5 == 0:
                tier.delete((i % 7).to_bytes(32, "big"))
        tier._check_invariants()  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", REDIS_KINDS)
def test_redis_entries_carry_a_ttl_to_their_deadline(
    kind: str, make_tier: Callable[..., Tier]
) -> None:
    """Redis expires an object at its deadline by itself (PX from the deadline)."""
    tier = make_tier(kind)
    assert isinstance(tier, RedisTier)
    tier.put(obj(1, deadline_us=NOW_US + 30_000_000), NOW_US)
    pttl = tier._redis.client().pttl(tier.object_key((1).to_bytes(32, "big")))
    assert 29_000 < pttl <= 30_000


@pytest.mark.parametrize("kind", REDIS_KINDS)
def test_redis_index_heals_after_redis_expires_an_object(
    kind: str, make_tier: Callable[..., Tier]
) -> None:
    """An object Redis expired is a miss, and its index entries and bytes are released."""
    tier = make_tier(kind)
    assert isinstance(tier, RedisTier)
    tier.put(obj(1), NOW_US)
    tier._redis.client().delete(tier.object_key((1).to_bytes(32, "big")))
    assert tier.get((1).to_bytes(32, "big")) is None
    assert tier.usage().stored_bytes == 0 and tier.usage().stored_blocks == 0


def test_redis_url_is_checked() -> None:
    """Only redis://, rediss:// and unix:// URLs are accepted."""
    with pytest.raises(InvalidOffloadArgument, match="redis://"):
        RedisTier("http://127.0.0.1:6379", 1024)


def test_redis_put_and_get_survive_redis_losing_its_scripts(own_redis: Any) -> None:
    """A put is one MULTI/EXEC (the index script, then a plain SET of the object); when
    Redis lost its scripts (a restart, SCRIPT FLUSH) the put is made again with the
    script loaded, so no object is left without its index (a purge finds every object)."""
    tier = RedisTier(own_redis.url, 1 << 20, prefix="kvgov-test")
    client = redis.Redis.from_url(own_redis.url)
    tier.put(obj(1), NOW_US)
    client.script_flush()
    tier.put(obj(2, tenant="globex"), NOW_US)
    assert tier.usage().stored_blocks == 2
    client.script_flush()
    got = tier.get((2).to_bytes(32, "big"))
    assert got is not None and got.tenant == "globex"
    assert [i.block_key for i in tier.delete_by_tenant("globex")] == [(2).to_bytes(32, "big")]
    assert client.get(tier.object_key((2).to_bytes(32, "big"))) is None
    assert tier.usage().stored_blocks == 1
    tier.close()
