"""Eviction as policy on kvgov's own pool: hit rates and cost, side by side.

Scenarios (synthetic, on ``BlockPool`` directly so a run takes seconds):

* durable prefix under flood: 8 tenants re-send their system prompts while one
  tenant floods distinct long prompts; the system prompts' hit rate with plain
  LRU, with priorities (system 90, flood 10), and with a cap on the flooder.
* noisy neighbour: tenant B cycles a working set while tenant A floods; B's hit
  rate and its prefill blocks avoided without the flood, with it under plain LRU,
  and with it under quotas (A capped, B given a floor).
* cost: microseconds per allocate-with-eviction, plain LRU vs priority levels vs
  quotas (per-tenant queues merged in a heap).

Run: ``python benchmarks/bench_eviction_policy.py [--quick]``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from kvgov.allocator import BlockPool, KVSpec, Quota

SPEC = KVSpec(num_layers=1, num_kv_heads=1, head_dim=8, block_size=16, dtype=torch.float16)


def request(pool: BlockPool, keys: list[bytes], tenant: str, priority: int) -> tuple[int, int]:
    """One request: look up, allocate the rest, key, free. Returns (hit, total) blocks."""
    hit = pool.lookup(keys)
    new = pool.allocate(len(keys) - len(hit), group=tenant)
    pool.set_keys(new, keys[len(hit) :], priority=priority, group=tenant)
    pool.free([*hit, *new][::-1])
    pool.take_events()
    return len(hit), len(keys)


def durable_prefix(mode: str, steps: int) -> float:
    pool = BlockPool(SPEC, 512)
    if mode == "cap":
        pool.set_quotas({"flood": Quota(cap=128)})
    high, low = (90, 10) if mode == "priority" else (50, 50)
    hits = total = 0
    for i in range(steps):
        t = i % 8
        h, n = request(pool, [f"sys{t}-{j}".encode() for j in range(24)], f"t{t}", high)
        if i >= 8:  # after the first round
            hits += h
            total += n
        for _ in range(3):  # three flood requests per system-prompt request
            request(pool, [f"flood{i}-{_}-{j}".encode() for j in range(32)], "flood", low)
    return hits / total


def noisy_neighbour(mode: str, steps: int) -> tuple[float, int]:
    pool = BlockPool(SPEC, 512)
    if mode == "quotas":
        pool.set_quotas({"A": Quota(cap=192), "B": Quota(floor=256)})
    hits = total = 0
    for i in range(steps):
        w = i % 48  # B's working set: 48 prompts of 4 blocks (192 blocks)
        h, n = request(pool, [f"B{w}-{j}".encode() for j in range(4)], "B", 50)
        if i >= 48:
            hits += h
            total += n
        if mode != "no flood":
            request(pool, [f"A{i}-{j}".encode() for j in range(24)], "A", 50)
    return hits / total, hits


def cost(mode: str, ops: int) -> float:
    pool = BlockPool(SPEC, 4096)
    if mode == "quotas":
        pool.set_quotas({f"t{t}": Quota(floor=64, cap=2048) for t in range(8)})
    n = 0

    def one() -> None:
        nonlocal n
        t = n % 8
        prio = 50 if mode == "lru" else (10, 50, 90)[n % 3]
        ids = pool.allocate(8, group=f"t{t}")
        pool.set_keys(ids, [f"k{n}-{j}".encode() for j in range(8)], priority=prio, group=f"t{t}")
        pool.free(ids)
        pool.take_events()
        n += 1

    for _ in range(4096 // 8 + 64):  # fill, so every later allocate evicts
        one()
    start = time.perf_counter()
    for _ in range(ops):
        one()
    return (time.perf_counter() - start) / ops * 1e6


def best(f: Callable[[], float], repeat: int) -> float:
    return min(f() for _ in range(repeat))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    steps = 200 if args.quick else 1000
    print("durable prefix under flood (8 tenants' system prompts, 3 flood requests each)")
    for mode in ("lru", "priority", "cap"):
        print(f"  {mode:10s} system-prompt hit rate {durable_prefix(mode, steps):6.1%}")
    print("noisy neighbour (B cycles 48 prompts, A floods 24-block prompts)")
    for mode in ("no flood", "lru", "quotas"):
        rate, avoided = noisy_neighbour(mode, steps)
        print(f"  {mode:10s} B hit rate {rate:6.1%}  prefill blocks avoided {avoided}")
    ops = 2000 if args.quick else 10000
    print("cost: µs per allocate(8)+key+free with eviction (best of 3)")
    base = best(lambda: cost("lru", ops), 3)
    for mode in ("lru", "priority", "quotas"):
        us = base if mode == "lru" else best(lambda m=mode: cost(m, ops), 3)  # type: ignore[misc]
        print(f"  {mode:10s} {us:7.1f} µs  {us / base:5.2f}x")


if __name__ == "__main__":
    main()
