"""Tamper: flipped, truncated, swapped, replayed and re-keyed objects are refused, in every tier.

Each case plays someone with write access to a tier (the Redis operator, a disk
reader-writer, a host-memory scribbler). Each refusal is a miss with a reason the
caller audits, is counted per tier, and never returns a byte of payload.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import torch

from kvgov.exceptions import InvalidOffloadArgument
from kvgov.offload import MissReason, OffloadStore, Tier
from kvgov.offload import store as store_module
from kvgov.offload.objects import HEADER_BYTES, encode
from tests.support.clock import START, FakeClock
from tests.support.offload import Raw

from .conftest import REDIS_KINDS, TIER_KINDS

K1, K2 = b"1" * 32, b"2" * 32
SCOPE = b"S" * 32


@pytest.fixture(params=TIER_KINDS)
def store(
    request: pytest.FixtureRequest,
    make_tier: Callable[..., Tier],
    make_store: Callable[..., OffloadStore],
) -> OffloadStore:
    """A store over one tier of each kind, holding K1 and K2 of tenant acme."""
    s = make_store([make_tier(request.param)])
    s.offload(K1, SCOPE, "acme", START + 60, b"one " * 256)
    s.offload(K2, SCOPE, "acme", START + 60, b"two " * 256)
    return s


def _raw(store: OffloadStore) -> Raw:
    return Raw(store._states[store.tier_names[0]].tier)


def _refused(store: OffloadStore, key: bytes, reason: MissReason, tenant: str = "acme") -> None:
    miss = store.restore(key, SCOPE, tenant)
    assert not miss.hit, "a tampered object was returned"
    assert miss.reason is reason, miss
    stats = store.stats().tiers[store.tier_names[0]]
    assert stats.refusals.get(reason.value) == 1


@pytest.mark.parametrize("where", ["ciphertext", "tag", "header-deadline"])
def test_a_flipped_byte_is_refused(store: OffloadStore, where: str) -> None:
    """One flipped bit anywhere authenticated fails AES-GCM: TAMPERED, counted, deleted."""
    raw = _raw(store)
    data = bytearray(raw.read(K1))
    at = {"ciphertext": len(data) - 100, "tag": len(data) - 1, "header-deadline": 12}[where]
    data[at] ^= 0x01
    raw.write(K1, bytes(data))
    _refused(store, K1, MissReason.TAMPERED)
    assert store.stats().tiers[store.tier_names[0]].decrypt_failures == 1
    assert store._states[store.tier_names[0]].tier.get(K1) is None  # deleted
    assert store.restore(K2, SCOPE, "acme").hit  # the neighbour is untouched


def test_a_truncated_object_is_refused(store: OffloadStore) -> None:
    """Cut short, an object is corrupt (its lengths disagree) or fails authentication."""
    _raw(store).truncate(K1, 5)
    miss = store.restore(K1, SCOPE, "acme")
    assert not miss.hit and miss.reason in {MissReason.CORRUPT, MissReason.TAMPERED}


@pytest.mark.parametrize("kind", ["disk", *REDIS_KINDS])
def test_garbage_is_refused(
    kind: str, make_tier: Callable[..., Tier], make_store: Callable[..., OffloadStore]
) -> None:
    """Bytes that are no object at all are corrupt (the disk and Redis tiers hold bytes)."""
    store = make_store([make_tier(kind)])
    store.offload(K1, SCOPE, "acme", START + 60, b"one")
    _raw(store).write(K1, b"\x00" * (HEADER_BYTES + 10))
    _refused(store, K1, MissReason.CORRUPT)


def test_swapped_objects_are_refused(store: OffloadStore) -> None:
    """Objects swapped between two block keys each name the other key: MISBOUND."""
    raw = _raw(store)
    one, two = raw.read(K1), raw.read(K2)
    raw.write(K1, two)
    raw.write(K2, one)
    for key in (K1, K2):
        miss = store.restore(key, SCOPE, "acme")
        assert not miss.hit and miss.reason is MissReason.MISBOUND


def test_swapped_ciphertexts_under_kept_headers_are_refused(store: OffloadStore) -> None:
    """Swapping only the ciphertexts (headers rewritten to fit) fails authentication."""
    tier = store._states[store.tier_names[0]].tier
    raw = _raw(store)
    one, two = tier.get(K1), tier.get(K2)
    assert one is not None and two is not None
    raw.write(K1, encode(dataclasses.replace(one, ciphertext=bytes(two.ciphertext))))
    _refused(store, K1, MissReason.TAMPERED)


def test_a_replayed_old_object_is_refused(store: OffloadStore, clock: FakeClock) -> None:
    """An object put back after a newer one replaced it is refused as a replay."""
    raw = _raw(store)
    old = raw.read(K1)
    clock.advance(1)
    store.offload(K1, SCOPE, "acme", START + 60, b"new " * 256)
    raw.write(K1, old)
    _refused(store, K1, MissReason.REPLAYED)


def test_an_object_moved_to_another_tenants_key_is_refused(store: OffloadStore) -> None:
    """Re-headed to beta (beta's key id and name), acme's ciphertext fails for beta and acme."""
    store.offload(b"b" * 32, SCOPE, "beta", START + 60, b"beta")
    tier = store._states[store.tier_names[0]].tier
    beta_obj, acme_obj = tier.get(b"b" * 32), tier.get(K1)
    assert beta_obj is not None and acme_obj is not None
    moved = dataclasses.replace(acme_obj, tenant="beta", key_id=beta_obj.key_id)
    _raw(store).write(K1, encode(moved))
    miss = store.restore(K1, SCOPE, "beta")
    assert not miss.hit and miss.reason is MissReason.TAMPERED
    acme_two = tier.get(K2)
    assert acme_two is not None
    only_key = dataclasses.replace(acme_two, key_id=beta_obj.key_id)  # still names acme
    _raw(store).write(K2, encode(only_key))
    miss = store.restore(K2, SCOPE, "acme")
    assert not miss.hit and miss.reason is MissReason.MISBOUND


def test_a_refusal_in_one_tier_falls_through_to_a_good_copy(
    make_tier: Callable[..., Tier], make_store: Callable[..., OffloadStore]
) -> None:
    """A tampered host copy is refused and reported; the disk copy is then restored."""
    store = make_store([make_tier("host"), make_tier("disk")])
    store.offload(K1, SCOPE, "acme", START + 60, b"kv" * 64)
    raw = Raw(store._states["host"].tier)
    data = bytearray(raw.read(K1))
    data[-1] ^= 1
    raw.write(K1, bytes(data))
    hit = store.restore(K1, SCOPE, "acme")
    assert hit.hit and hit.tier == "disk" and hit.payload == b"kv" * 64
    assert [(r.tier, r.reason) for r in hit.refusals] == [("host", MissReason.TAMPERED)]


@pytest.mark.parametrize("dest", ["tensor", "bytearray"])
def test_a_tampered_object_restored_into_a_block_leaves_it_zero(
    store: OffloadStore, dest: str
) -> None:
    """into= a block: a flipped ciphertext byte is refused and the block is all zero after.

    The block starts as 0xFF, so zeros prove the refused decryption wiped what it wrote
    (OpenSSL writes plaintext before it checks the tag) rather than leaving it untouched.
    """
    raw = _raw(store)
    data = bytearray(raw.read(K1))
    data[-100] ^= 0x01
    raw.write(K1, bytes(data))
    block: torch.Tensor | bytearray = (
        torch.full((512,), -1, dtype=torch.int16) if dest == "tensor" else bytearray(b"\xff" * 1024)
    )
    miss = store.restore(K1, SCOPE, "acme", into=block)
    assert not miss.hit and miss.reason is MissReason.TAMPERED
    raw_bytes = block.numpy().tobytes() if isinstance(block, torch.Tensor) else bytes(block)
    assert raw_bytes == bytes(1024)
    assert store.restore(K2, SCOPE, "acme", into=block).hit  # the same block, a good object
    assert bytes(block.numpy().tobytes() if isinstance(block, torch.Tensor) else block) == (
        b"two " * 256
    )


def test_a_block_of_the_wrong_size_is_checked_in_a_scratch_buffer_left_zero(
    store: OffloadStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """into= of another size: the object is authenticated in a scratch buffer, zeroed after.

    A tampered object is a refusal (not the caller's mistake), a genuine one raises
    InvalidOffloadArgument; either way the caller's buffer is untouched and the
    scratch buffer holds no plaintext afterwards.
    """
    scratches: list[bytearray] = []

    def recording_bytearray(n: int) -> bytearray:
        scratches.append(bytearray(n))
        return scratches[-1]

    monkeypatch.setattr(store_module, "bytearray", recording_bytearray, raising=False)
    small = bytearray(b"\xee" * 10)
    with pytest.raises(InvalidOffloadArgument, match="1024 bytes"):
        store.restore(K1, SCOPE, "acme", into=small)
    assert len(scratches) == 1 and scratches[0] == bytes(1024)
    assert small == b"\xee" * 10
    raw = _raw(store)
    data = bytearray(raw.read(K2))
    data[-100] ^= 0x01
    raw.write(K2, bytes(data))
    miss = store.restore(K2, SCOPE, "acme", into=small)
    assert not miss.hit and miss.reason is MissReason.TAMPERED
    assert len(scratches) == 2 and scratches[1] == bytes(1024)
    assert small == b"\xee" * 10
