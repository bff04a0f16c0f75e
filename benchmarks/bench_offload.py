"""Benchmark the encrypted offload tiers against plain copies of the same bytes, side by side.

For each tier (host memory, local disk, and Redis at 127.0.0.1:6379 when reachable)
and each 2 MiB block, one pair is measured back to back (the order alternating from
pair to pair):

* store: the plain side copies the block into a new buffer and stores it in a tier
  of the same kind unencrypted; the encrypted side is ``OffloadStore.offload``
  (data-key lookup, AES-256-GCM sealing, the same tier ``put``);
* load: the plain side reads the plain object back and copies its bytes out; the
  encrypted side is ``OffloadStore.restore`` (read, checks, authenticated decryption
  into new bytes);
* load into (host only): copying into a preallocated buffer against
  ``restore(into=...)``, which decrypts straight into it;
* load block (host only): the same into a CPU tensor, as a pool block is (how the
  governor restores), both sides taking the tensor's byte view per block.

Ratios are per pair (encrypted / plain), summarized by their median and quartiles
(benchmarks/paired.py); throughputs are from the median times. Target: the encrypted
host tier within 3x of the plain copy. Prints a table and ``RESULT name=value`` lines.

    .venv/bin/python benchmarks/bench_offload.py [--quick] [--blocks N] [--no-redis]
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import redis
import torch

from benchmarks.paired import RatioStats, ratio_stats
from kvgov.audit import SqlWrappedKeyStore
from kvgov.offload import DiskTier, HostMemoryTier, LocalKEK, OffloadStore, RedisTier, SealedBlock
from kvgov.offload.payload import writable
from kvgov.offload.tier import Tier

BLOCK_BYTES = 2 << 20
REDIS_URL = os.environ.get("KVGOV_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
SCOPE = b"S" * 32
TARGET_HOST_RATIO = 3.0
#: Distinct source blocks (64 MiB): more than a server's last-level cache.
SOURCE_BLOCKS = 32


@dataclass(frozen=True, slots=True)
class Row:
    """One figure: a tier and direction, its plain and encrypted throughput, the pair ratios."""

    tier: str
    op: str
    plain_gib_s: float
    encrypted_gib_s: float
    ratio: RatioStats


def _plain_block(key: bytes, data: bytes) -> SealedBlock:
    """The same bytes as an unencrypted object (the tier cannot tell; nobody decrypts it)."""
    return SealedBlock(key, SCOPE, "acme", 2**62, 0, b"\0" * 16, b"\0" * 16, b"\0" * 12, data)


def _copy(data: bytes | memoryview) -> bytes:
    """A real copy (``bytes(b)`` of a bytes object returns the same object)."""
    return bytes(memoryview(data))


def _timed(fn: Callable[[int], object], i: int) -> float:
    t = time.perf_counter()
    fn(i)
    return time.perf_counter() - t


Op = Callable[[int], object]


def _pairs(n: int, plain: Op, enc: Op) -> list[tuple[float, float]]:
    """``n`` (plain, encrypted) timings of block ``i``, alternating which side goes first."""
    out = []
    for i in range(n):
        if i % 2:
            e = _timed(enc, i)
            p = _timed(plain, i)
        else:
            p = _timed(plain, i)
            e = _timed(enc, i)
        out.append((p, e))
    return out


def _row(tier: str, op: str, pairs: list[tuple[float, float]]) -> Row:
    gib = BLOCK_BYTES / 2**30
    return Row(
        tier,
        op,
        gib / statistics.median(p for p, _e in pairs),
        gib / statistics.median(e for _p, e in pairs),
        ratio_stats(pairs),
    )


def bench_tier(
    name: str, make: Callable[[], Tier], keys: SqlWrappedKeyStore, kek: LocalKEK, n: int
) -> list[Row]:
    """Store and load ``n`` blocks through a plain tier and an encrypting store of one kind."""
    plain_tier, enc_tier = make(), make()
    store = OffloadStore([enc_tier], keys, kek)
    # distinct sources beyond the last-level cache, as evicted blocks are: the plain copy
    # then reads DRAM, not a cache line it touched a moment ago
    blocks = [secrets.token_bytes(BLOCK_BYTES) for _ in range(min(n, SOURCE_BLOCKS))]
    keys_ = [secrets.token_bytes(32) for _ in range(n)]
    deadline = time.time() + 3600
    store.offload(b"warm" * 8, SCOPE, "acme", deadline, blocks[0])  # creates the data key
    try:

        def plain_store(i: int) -> None:
            plain_tier.put(_plain_block(keys_[i], _copy(blocks[i % len(blocks)])), 0)

        def enc_store(i: int) -> None:
            store.offload(keys_[i], SCOPE, "acme", deadline, blocks[i % len(blocks)])

        def plain_load(i: int) -> bytes:
            obj = plain_tier.get(keys_[i])
            assert obj is not None
            return _copy(obj.ciphertext)

        def enc_load(i: int) -> bytes:
            got = store.restore(keys_[i], SCOPE, "acme")
            if not got.hit:
                raise SystemExit(f"{name}: block {i} was not restored ({got.reason})")
            return bytes(got.payload)

        rows = [
            _row(name, "store", _pairs(n, plain_store, enc_store)),
            _row(name, "load", _pairs(n, plain_load, enc_load)),
        ]
        if name == "host":
            dst = memoryview(bytearray(BLOCK_BYTES))  # memoryview: a straight memcpy
            into = bytearray(BLOCK_BYTES)

            def plain_into(i: int) -> None:
                obj = plain_tier.get(keys_[i])
                assert obj is not None
                dst[:] = obj.ciphertext

            def enc_into(i: int) -> None:
                if not store.restore(keys_[i], SCOPE, "acme", into=into).hit:
                    raise SystemExit(f"host: block {i} was not restored into the buffer")

            rows.append(_row(name, "load into", _pairs(n, plain_into, enc_into)))
            # a pool block is a tensor: both sides take its byte view per block, as a
            # restore into a block must
            block = torch.zeros(BLOCK_BYTES // 2, dtype=torch.float16)

            def plain_block(i: int) -> None:
                obj = plain_tier.get(keys_[i])
                assert obj is not None
                writable(block).view[:] = obj.ciphertext

            def enc_block(i: int) -> None:
                if not store.restore(keys_[i], SCOPE, "acme", into=block).hit:
                    raise SystemExit(f"host: block {i} was not restored into the tensor")

            rows.append(_row(name, "load block", _pairs(n, plain_block, enc_block)))
        return rows
    finally:
        store.close()
        plain_tier.close()


def _redis_cleanup(prefix: str) -> None:
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(match=f"{prefix}:*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


def main() -> None:
    """Run the benchmark and print the table and RESULT lines."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small smoke run (4 blocks)")
    ap.add_argument("--blocks", type=int, default=64, help="2 MiB blocks per tier (default 64)")
    ap.add_argument("--no-redis", action="store_true", help="skip the Redis tier")
    args = ap.parse_args()
    n = 4 if args.quick else args.blocks
    if n < 1:
        ap.error("--blocks must be at least 1")
    capacity = (n + 2) * (BLOCK_BYTES + 4096)
    rows: list[Row] = []
    with tempfile.TemporaryDirectory() as tmp:
        keys = SqlWrappedKeyStore(f"sqlite:///{Path(tmp) / 'keys.db'}")
        kek = LocalKEK(secrets.token_bytes(32))
        prefix = f"kvgov-bench:{uuid.uuid4().hex}"
        makers: dict[str, Callable[[], Tier]] = {
            "host": lambda: HostMemoryTier(capacity, pin_memory=False),
            "disk": lambda: DiskTier(Path(tmp) / uuid.uuid4().hex, capacity),
        }
        if not args.no_redis:
            try:
                redis.Redis.from_url(REDIS_URL, socket_connect_timeout=1).ping()
                makers["redis"] = (
                    lambda: RedisTier(  # plain and encrypted: two keyspaces
                        REDIS_URL, capacity, prefix=f"{prefix}:{uuid.uuid4().hex[:8]}"
                    )
                )
            except redis.RedisError as exc:
                print(f"Redis not reachable ({exc}); skipping it", file=sys.stderr)
        try:
            for name, make in makers.items():
                rows += bench_tier(name, make, keys, kek, n)
        finally:
            keys.close()
            if "redis" in makers:
                _redis_cleanup(prefix)
    print(f"{n} blocks of {BLOCK_BYTES >> 20} MiB per tier; ratio = encrypted time / plain time")
    print(f"{'tier':<6} {'op':<10} {'plain GiB/s':>12} {'encrypted GiB/s':>16} "
          f"{'ratio p50':>10} {'p25':>6} {'p75':>6}  target")  # fmt: skip
    for r in rows:
        target = f"<= {TARGET_HOST_RATIO:.0f}" if r.tier == "host" else ""
        q = r.ratio
        print(f"{r.tier:<6} {r.op:<10} {r.plain_gib_s:>12.2f} {r.encrypted_gib_s:>16.2f} "
              f"{q.median:>10.2f} {q.p25:>6.2f} {q.p75:>6.2f}  {target}")  # fmt: skip
    for r in rows:
        stem = f"{r.tier}_{r.op.replace(' ', '_')}"
        print(f"RESULT {stem}_plain_gib_s={r.plain_gib_s:.3f}")
        print(f"RESULT {stem}_encrypted_gib_s={r.encrypted_gib_s:.3f}")
        print(f"RESULT {stem}_ratio={r.ratio.median:.3f}")


if __name__ == "__main__":
    main()
