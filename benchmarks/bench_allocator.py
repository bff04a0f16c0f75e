"""The block pool's own costs: bookkeeping per block, and zeroization against a plain memset.

Run: .venv/bin/python benchmarks/bench_allocator.py [--quick]

Figures (medians over repeats, all measured in this run):

* ``alloc_free``: ``allocate(16)`` + ``free`` of those 16 unkeyed blocks (so each
  free also zeroizes the run it frees, one ``zero_()``), microseconds per block,
  on pools of 1K, 64K and 1M blocks of a tiny spec (memory is not what is
  measured). Half of each pool is held OWNED throughout, so the structures are
  large. Target: flat, ``alloc_scaling_1m_vs_1k <= 1.3``.
* ``set_keys``: keying 256 OWNED blocks in one call (vLLM's cache_full_blocks).
* ``lookup``: a 4,096-token prefix (256 blocks) that hits in full, CACHED -> OWNED.
* ``evict``: ``allocate(16)`` from a pool whose every block is CACHED, so each
  allocation evicts 16 blocks (and zeroizes them); re-caching is untimed.
* ``zeroize``: 64 scattered blocks (every 4th) of a Llama-3-8B-like spec (32 layers
  x 8 KV heads x 128 dim x 16 tokens fp16 = 2 MiB a block), ``pool.zeroize`` (64 runs,
  64 ``zero_()`` calls) against ``zero_()`` of one contiguous tensor of the same
  128 MiB, alternating. Both are dirtied (then a 64 MiB scratch buffer is written, so
  neither starts in cache) before each timed call. Target on CPU:
  ``zeroize_vs_memset >= 0.8`` (throughput ratio). Where CUDA is present the same
  is measured on the GPU (device time to completion) and reported in GB/s.

The comparison with vLLM's pool itself is ``benchmarks/bench_vs_vllm.py``.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from kvgov.allocator import BlockPool, KVSpec

TINY = KVSpec(num_layers=1, num_kv_heads=1, head_dim=1, block_size=1)
LLAMA = KVSpec(num_layers=32, num_kv_heads=8, head_dim=128, block_size=16)
BATCH = 16
PREFIX_BLOCKS = 256


def _median_us_per_block(run: Callable[[], float], repeats: int) -> float:
    """Median of ``run()`` (seconds per block) over repeats, in microseconds."""
    return statistics.median(run() for _ in range(repeats)) * 1e6


def bench_alloc_free(num_blocks: int, iters: int, repeats: int) -> float:
    """allocate(16) + free per block on a pool half held, microseconds per block."""
    pool = BlockPool(TINY, num_blocks)
    held = pool.allocate(num_blocks // 2)
    allocate, free, take = pool.allocate, pool.free, pool.take_events

    def run() -> float:
        t0 = time.perf_counter()
        for _ in range(iters):
            free(allocate(BATCH))
        dt = time.perf_counter() - t0
        take()
        return dt / (iters * BATCH)

    result = _median_us_per_block(run, repeats)
    pool.free(held)
    pool.close()
    return result


def _keys(n: int, salt: int = 0) -> list[bytes]:
    return [(salt * 1_000_003 + i).to_bytes(32, "little") for i in range(n)]


def bench_set_keys(iters: int, repeats: int) -> float:
    """set_keys of 256 OWNED blocks in one call, microseconds per block."""
    pool = BlockPool(TINY, 4096)
    rounds = [_keys(PREFIX_BLOCKS, salt) for salt in range(iters)]

    def run() -> float:
        total = 0.0
        for keys in rounds:
            ids = pool.allocate(PREFIX_BLOCKS)
            t0 = time.perf_counter()
            pool.set_keys(ids, keys)
            total += time.perf_counter() - t0
            pool.free(ids, cache=False)
            pool.take_events()
        return total / (iters * PREFIX_BLOCKS)

    result = _median_us_per_block(run, repeats)
    pool.close()
    return result


def bench_lookup(iters: int, repeats: int) -> float:
    """lookup of a 256-block prefix that is CACHED in full, microseconds per block."""
    pool = BlockPool(TINY, 4096)
    keys = _keys(PREFIX_BLOCKS)
    ids = pool.allocate(PREFIX_BLOCKS)
    pool.set_keys(ids, keys)
    pool.free(ids[::-1])

    def run() -> float:
        total = 0.0
        for _ in range(iters):
            t0 = time.perf_counter()
            hits = pool.lookup(keys)
            total += time.perf_counter() - t0
            pool.free(hits[::-1])
        pool.take_events()
        return total / (iters * PREFIX_BLOCKS)

    result = _median_us_per_block(run, repeats)
    pool.close()
    return result


def bench_evict(num_blocks: int, iters: int, repeats: int) -> float:
    """allocate(16) that evicts 16 CACHED blocks (and zeroizes them), microseconds per block."""
    pool = BlockPool(TINY, num_blocks)
    counter = iter(range(1 << 62))
    ids = pool.allocate(num_blocks)
    pool.set_keys(ids, [next(counter).to_bytes(8, "little") for _ in ids])
    pool.free(ids)

    def run() -> float:
        total = 0.0
        for _ in range(iters):
            t0 = time.perf_counter()
            got = pool.allocate(BATCH)
            total += time.perf_counter() - t0
            pool.set_keys(got, [next(counter).to_bytes(8, "little") for _ in got])
            pool.free(got)
        pool.take_events()
        return total / (iters * BATCH)

    result = _median_us_per_block(run, repeats)
    pool.close()
    return result


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def bench_zeroize(device: str, pool_blocks: int, repeats: int) -> tuple[float, float]:
    """Seconds (median) to zeroize 64 scattered 2 MiB blocks, and to zero_() 128 MiB."""
    pool = BlockPool(LLAMA, pool_blocks, device)
    dev = pool.device
    scattered = list(range(0, pool_blocks, pool_blocks // 64))[:64]
    plain = torch.empty(64 * LLAMA.bytes_per_block, dtype=torch.uint8, device=dev)
    whole = pool.layer_view(0).untyped_storage()
    pool_bytes = torch.empty(0, dtype=torch.uint8, device=dev).set_(whole)
    scratch = torch.empty(64 << 20, dtype=torch.uint8, device=dev)  # evicts both from cache
    ours: list[float] = []
    base: list[float] = []
    for i in range(repeats + 1):  # the first round warms both up and is dropped
        for side in (0, 1) if i % 2 else (1, 0):
            pool_bytes.fill_(1)
            plain.fill_(1)
            scratch.fill_(2)
            _sync(dev)
            t0 = time.perf_counter()
            if side == 0:
                pool.zeroize(scattered)  # returns once the zeros are in memory
            else:
                plain.zero_()
                _sync(dev)
            dt = time.perf_counter() - t0
            if i:
                (ours if side == 0 else base).append(dt)
            if side == 0:  # checked outside the timing, before the next fill
                for b in scattered:
                    if bool(pool.block(b).view(torch.uint8).any()):
                        raise SystemExit(f"block {b} is not zero after zeroize")
        pool.take_events()
    pool.close()
    return statistics.median(ours), statistics.median(base)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (few iterations)")
    args = parser.parse_args()
    quick: bool = args.quick
    repeats = 3 if quick else 9
    iters = 200 if quick else 4000
    sizes = {"1k": 1 << 10, "64k": 1 << 16, "1m": 1 << 20}

    rows: list[tuple[str, str, str]] = []
    results: dict[str, float] = {}

    for name, n in sizes.items():
        us = bench_alloc_free(n, iters, repeats)
        results[f"alloc_free_us_per_block_{name}"] = us
        rows.append((f"allocate(16)+free, {n:,} blocks", f"{us:.3f}", "us/block"))
    results["alloc_scaling_1m_vs_1k"] = (
        results["alloc_free_us_per_block_1m"] / results["alloc_free_us_per_block_1k"]
    )

    us = bench_set_keys(20 if quick else 200, repeats)
    results["set_keys_us_per_block"] = us
    rows.append(("set_keys, 256 blocks a call", f"{us:.3f}", "us/block"))

    us = bench_lookup(20 if quick else 200, repeats)
    results["lookup_us_per_block"] = us
    rows.append(("lookup, 4,096-token prefix (256 hits)", f"{us:.3f}", "us/block"))

    us = bench_evict(1 << 16, iters, repeats)
    results["evict_alloc_us_per_block"] = us
    rows.append(("allocate(16) evicting 16 CACHED", f"{us:.3f}", "us/block"))

    devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    for device in devices:
        ours, base = bench_zeroize(device, 128 if quick else 256, 5 if quick else 15)
        nbytes = 64 * LLAMA.bytes_per_block
        gbps, plain_gbps = nbytes / ours / 1e9, nbytes / base / 1e9
        tag = "" if device == "cpu" else "_cuda"
        results[f"zeroize_gbps{tag}"] = gbps
        results[f"memset_gbps{tag}"] = plain_gbps
        results[f"zeroize_vs_memset{tag}"] = base / ours
        rows.append((f"zeroize 64 scattered 2 MiB blocks ({device})", f"{gbps:.2f}", "GB/s"))
        rows.append((f"zero_() of one 128 MiB tensor ({device})", f"{plain_gbps:.2f}", "GB/s"))

    width = max(len(r[0]) for r in rows)
    print(f"{'figure':<{width}}  {'value':>10}  unit")
    for label, value, unit in rows:
        print(f"{label:<{width}}  {value:>10}  {unit}")
    print()
    for name, value in results.items():
        print(f"RESULT {name}={value:.4g}")


if __name__ == "__main__":
    main()
