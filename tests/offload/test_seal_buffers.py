"""The store seals into reused buffers for the tiers that copy an object out, and only those.

A fresh block-sized buffer per save cost a sealed Redis save more than AES-GCM did (its
pages faulted in and zeroed), so the store keeps a few and reuses them for the tiers
whose ``put`` copies the bytes out (disk, Redis). What must hold: a reused buffer never
changes an object a tier still holds (the host tier keeps its objects: it gets buffers
of their own), it holds sealed bytes only, and the store keeps a bounded number.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import pytest

from kvgov.offload import HostMemoryTier, OffloadStore, PutOutcome, RedisTier, Tier
from kvgov.offload.store import SEAL_BUFFER_MAX_BYTES, SEAL_BUFFERS_KEPT
from kvgov.offload.tier import put_copies
from tests.support.clock import START

from .conftest import TIER_KINDS

SCOPE = b"S" * 32


def _payloads(n: int, size: int = 8192) -> list[bytes]:
    return [bytes([i + 1]) * 16 + os.urandom(size - 16) for i in range(n)]


def test_only_tiers_that_copy_an_object_out_say_so(make_tier: Callable[..., Tier]) -> None:
    """Disk and Redis copy the bytes out in put; host memory keeps the object; a tier
    that does not say anything is taken to keep it."""
    assert put_copies(make_tier("disk")) and put_copies(make_tier("redis"))
    assert not put_copies(make_tier("host"))

    class Silent(HostMemoryTier):
        pass

    class Claims(HostMemoryTier):
        put_copies = "yes"  # only True counts

    assert not put_copies(Silent(1 << 20)) and not put_copies(Claims(1 << 20))
    assert RedisTier.put_copies is True


@pytest.mark.parametrize("kind", TIER_KINDS)
def test_blocks_sealed_in_a_row_each_restore_as_they_were(
    kind: str, make_tier: Callable[..., Tier], make_store: Callable[..., OffloadStore]
) -> None:
    """Ten blocks offloaded one after another (the buffers reused where the tier copies
    the object out) each restore byte for byte: no later seal changed an earlier object,
    in the tier or on its way there."""
    store = make_store([make_tier(kind, capacity=1 << 20)])
    payloads = _payloads(10)
    for i, payload in enumerate(payloads):
        got = store.offload(bytes([i + 1]) * 32, SCOPE, "acme", START + 60, payload)
        assert got.puts[0].outcome is PutOutcome.STORED
    for i, payload in enumerate(payloads):
        back = store.restore(bytes([i + 1]) * 32, SCOPE, "acme")
        assert back.hit and bytes(back.payload) == payload, (kind, i, back)


def test_a_host_tier_beside_a_copying_tier_keeps_objects_of_their_own(
    make_tier: Callable[..., Tier], make_store: Callable[..., OffloadStore]
) -> None:
    """With host memory first and disk second, each block's host copy survives the
    seals that follow it (the disk copies reuse buffers; the host copies never do)."""
    store = make_store([make_tier("host"), make_tier("disk")])
    payloads = _payloads(6)
    for i, payload in enumerate(payloads):
        assert store.offload(bytes([i + 1]) * 32, SCOPE, "acme", START + 60, payload).stored_in == (
            "host",
            "disk",
        )
    for i, payload in enumerate(payloads):
        back = store.restore(bytes([i + 1]) * 32, SCOPE, "acme")
        assert back.hit and back.tier == "host" and bytes(back.payload) == payload


def test_a_kept_seal_buffer_holds_sealed_bytes_only(
    make_tier: Callable[..., Tier], make_store: Callable[..., OffloadStore]
) -> None:
    """After offloads to disk, no plaintext is found in the buffers the store keeps."""
    store = make_store([make_tier("disk")])
    payload = b"PLAINTEXT-KV-PATTERN-" * 400
    for i in range(3):
        store.offload(bytes([i + 1]) * 32, SCOPE, "acme", START + 60, payload)
    kept = store._buffers._free
    assert kept, "a buffer is kept for the next seal"
    assert all(b"PLAINTEXT-KV-PATTERN-" not in bytes(b) for b in kept)


def test_concurrent_offloads_never_share_a_buffer(
    make_tier: Callable[..., Tier], make_store: Callable[..., OffloadStore]
) -> None:
    """Four threads offloading to Redis at once: every block restores as it was."""
    store = make_store([make_tier("redis", capacity=8 << 20)])
    payloads = _payloads(32, size=65536)
    errors: list[BaseException] = []

    def worker(first: int) -> None:
        try:
            for i in range(first, len(payloads), 4):
                store.offload(bytes([i + 1]) * 32, SCOPE, "acme", START + 60, payloads[i])
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    for i, payload in enumerate(payloads):
        back = store.restore(bytes([i + 1]) * 32, SCOPE, "acme")
        assert back.hit and bytes(back.payload) == payload, i


def test_the_store_keeps_a_few_buffers_of_bounded_size(
    make_tier: Callable[..., Tier], make_store: Callable[..., OffloadStore]
) -> None:
    """Buffers are reused rather than piled up: at most SEAL_BUFFERS_KEPT, the largest,
    and none larger than SEAL_BUFFER_MAX_BYTES."""
    store = make_store([make_tier("disk", capacity=1 << 20)])
    buffers = store._buffers
    taken = [buffers.take(n) for n in (10, 70_000, 10, 200_000, 10, 10)]
    assert len({id(b) for b in taken}) == len(taken)
    assert all(len(b) % 65536 == 0 for b in taken)  # whole steps: near sizes share one
    for b in taken:
        buffers.give(b)
    assert (
        sorted(len(b) for b in buffers._free) == sorted(len(b) for b in taken)[-SEAL_BUFFERS_KEPT:]
    )
    again = buffers.take(60_000)  # the smallest kept one that fits
    assert len(again) == 65536 and any(again is b for b in taken)
    buffers.give(bytearray(SEAL_BUFFER_MAX_BYTES + 1))
    assert all(len(b) <= SEAL_BUFFER_MAX_BYTES for b in buffers._free)
