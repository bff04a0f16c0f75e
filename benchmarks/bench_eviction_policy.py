"""Eviction as policy on kvgov's own pool and on vLLM's: hit rates and cost, side by side.

Scenarios (on the pools directly, no model, so a run takes a minute or two):

* durable prefix under flood (``eviction_streams.py``): 8 tenants re-send their
  system prompts while one tenant floods, a synthetic flood of distinct long
  prompts and the Mooncake conversation trace; the system prompts' hit rate with
  plain LRU, with priorities (system 90, flood 10), and with a cap on the flooder,
  on kvgov's pool and on vLLM 0.33's ``BlockPool`` (stock, and governed by the
  binding's queue: :mod:`kvgov.govern.vllm.free_queue`). The vLLM rows come from
  ``eviction_vllm.py``, run in ``.bench/vllm-venv`` (``make test-vllm`` builds it);
  without that venv they are left out, and the run says so.
* noisy neighbour (``eviction_streams.noisy_stream``): tenant B cycles a working
  set while tenant A floods; B's hit rate and its prefill avoided (blocks, tokens)
  without the flood, with it under plain LRU, and with it under quotas (A capped, B
  given a floor), on kvgov's pool and on vLLM's (stock, governed with the default
  policy, governed with the quotas).
* cost: CPU time per request of 8 blocks on a full pool (an allocation evicting 8,
  keying and freeing them): on kvgov's pool plain LRU, priority levels and quotas
  (allocate, set_keys, free); on vLLM's pool (get_new_blocks, cache_full_blocks,
  free_blocks) stock, governed with the default policy, with priorities and with
  quotas; each pool's modes in interleaved rounds, as medians of the per-round
  ratios. (The per-operation figures with a target are bench_vs_vllm.py's policy
  rows.)

Run: ``python benchmarks/bench_eviction_policy.py [--quick]``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import torch
from eviction_streams import (
    BLOCK_TOKENS,
    NOISY_BLOCKS,
    NOISY_QUOTAS,
    Request,
    durable_streams,
    noisy_stream,
)

from kvgov.allocator import BlockPool, KVSpec, Quota

REPO = Path(__file__).resolve().parents[1]
VLLM_PYTHON = REPO / ".bench" / "vllm-venv" / "bin" / "python"

SPEC = KVSpec(num_layers=1, num_kv_heads=1, head_dim=8, block_size=16, dtype=torch.float16)


def request(pool: BlockPool, keys: list[bytes], tenant: str, priority: int) -> tuple[int, int]:
    """One request: look up, allocate the rest, key, free. Returns (hit, total) blocks."""
    hit = pool.lookup(keys)
    new = pool.allocate(len(keys) - len(hit), group=tenant)
    pool.set_keys(new, keys[len(hit) :], priority=priority, group=tenant)
    pool.free([*hit, *new][::-1])
    pool.take_events()
    return len(hit), len(keys)


def durable_prefix(mode: str, stream: list[Request], num_blocks: int) -> float:
    """The system prompts' hit rate on kvgov's pool (``lru``: every priority 50)."""
    pool = BlockPool(SPEC, num_blocks)
    if mode == "cap":
        pool.set_quotas({"flood": Quota(cap=num_blocks // 4)})
    hits = total = 0
    for req in stream:
        h, n = request(pool, req.hashes, req.tenant, req.priority if mode == "priority" else 50)
        if req.counted:
            hits += h
            total += n
    return hits / total


def vllm_rows(quick: bool) -> list[dict[str, object]] | str:
    """The rows of eviction_vllm.py (vLLM's pool), or why there are none."""
    if not VLLM_PYTHON.exists():
        return f"no vLLM venv at {VLLM_PYTHON} (make test-vllm builds it)"
    cmd = [str(VLLM_PYTHON), str(Path(__file__).with_name("eviction_vllm.py"))]
    run = subprocess.run(
        [*cmd, *(["--quick"] if quick else [])], capture_output=True, text=True, check=False
    )
    if run.returncode:
        return "eviction_vllm.py failed:\n" + run.stderr[-2000:]
    rows: list[dict[str, object]] = [json.loads(line) for line in run.stdout.splitlines()]
    return rows


def noisy_neighbour(mode: str, steps: int) -> tuple[float, int]:
    """B's hit rate and its blocks hit (prefill avoided) on kvgov's pool: ``no flood``,
    ``lru`` (A floods, no quota) or ``quotas`` (A floods, NOISY_QUOTAS)."""
    pool = BlockPool(SPEC, NOISY_BLOCKS)
    if mode == "quotas":
        pool.set_quotas({t: Quota(floor=f, cap=c) for t, (f, c) in NOISY_QUOTAS.items()})
    hits = total = 0
    for req in noisy_stream(steps, flood=mode != "no flood"):
        h, n = request(pool, req.hashes, req.tenant, req.priority)
        if req.counted:
            hits += h
            total += n
    return hits / total, hits


COST_MODES = ("lru", "priority", "quotas")


def cost_step(mode: str) -> Callable[[], None]:
    """One request of 8 new blocks on a full pool of 4,096 (each evicts 8), keyed and
    freed, as a call: ``lru`` (every priority 50), ``priority`` (10, 50 and 90 in turn)
    or ``quotas`` (the same, 8 tenants in turn with floors of 64 and caps of 2,048)."""
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
    return one


def cost(ops: int, rounds: int) -> dict[str, list[float]]:
    """CPU µs per request (cost_step) per mode, in interleaved rounds (a slow spell
    slows every mode of its round), as vLLM's pool's rows are measured
    (eviction_vllm.cost): CPU time of this process, so other processes' load does not
    count."""
    steps = {m: cost_step(m) for m in COST_MODES}
    per = ops // rounds
    out: dict[str, list[float]] = {m: [] for m in COST_MODES}
    for r in range(rounds):
        for m in COST_MODES if r % 2 == 0 else COST_MODES[::-1]:
            one = steps[m]
            start = time.process_time()
            for _ in range(per):
                one()
            out[m].append((time.process_time() - start) / per * 1e6)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    steps = 200 if args.quick else 1000
    vrows = vllm_rows(args.quick)
    streams = durable_streams(args.quick)
    print("durable prefix under flood: system-prompt hit rate (8 tenants at priority 90,")
    print("one flooding at 10; cap: the flooder capped at a quarter of the pool)")
    vmodes = ("vllm stock", "kvgov lru", "kvgov priority", "kvgov cap")
    print(
        f"  {'stream':10s} | kvgov pool: {'lru':>6s} {'priority':>8s} {'cap':>6s}"
        f" | vLLM pool: {'stock':>6s} {'gov lru':>7s} {'priority':>8s} {'cap':>6s}"
    )
    for name, (stream, blocks) in streams.items():
        native = [durable_prefix(m, stream, blocks) for m in ("lru", "priority", "cap")]
        line = f"  {name:10s} | {'':12s}{native[0]:6.1%} {native[1]:8.1%} {native[2]:6.1%} |"
        if isinstance(vrows, list):
            rate = {
                r["mode"]: float(r["hit_rate"])  # type: ignore[arg-type]
                for r in vrows
                if r.get("section") == "durable" and r["stream"] == name
            }
            line += f" {'':10s}" + " ".join(
                f"{rate[m]:{w}.1%}" for m, w in zip(vmodes, (6, 7, 8, 6), strict=True)
            )
        print(line)
    if isinstance(vrows, str):
        print(f"  (vLLM pool: {vrows})")
    caps = ", ".join(
        " ".join([t, *([f"floor {f}"] if f else []), *([f"cap {c}"] if c is not None else [])])
        for t, (f, c) in NOISY_QUOTAS.items()
    )
    print(
        f"noisy neighbour (B cycles 48 prompts of 4 blocks, A floods 24-block prompts;"
        f" {NOISY_BLOCKS} blocks; quotas: {caps})"
    )
    print(f"  {'pool':7s} {'mode':22s} {'B hit rate':>10s}  prefill avoided (blocks, tokens)")
    for mode, label in (
        ("no flood", "no flood"),
        ("lru", "A floods, LRU"),
        ("quotas", "A floods, quotas"),
    ):
        rate, avoided = noisy_neighbour(mode, steps)
        print(f"  {'kvgov':7s} {label:22s} {rate:10.1%}  {avoided:6d} {avoided * BLOCK_TOKENS:8d}")
    if isinstance(vrows, list):
        for r in vrows:
            if r.get("section") == "noisy":
                hits = int(r["hits"])  # type: ignore[call-overload]
                rate = float(r["hit_rate"])  # type: ignore[arg-type]
                tokens = hits * BLOCK_TOKENS
                print(f"  {'vLLM':7s} {r['mode']!s:22s} {rate:10.1%}  {hits:6d} {tokens:8d}")
    else:
        print(f"  (vLLM pool: {vrows})")
    rounds = 10 if args.quick else 30
    native = cost(200 * rounds, rounds)
    print(
        "cost, kvgov's pool: CPU µs per request of 8 blocks (allocate evicting 8, set_keys, free);"
    )
    print("  medians of per-round ratios (interleaved rounds)")
    for mode in COST_MODES:
        ratio = statistics.median(a / b for a, b in zip(native[mode], native["lru"], strict=True))
        print(f"  {mode:13s} {statistics.median(native[mode]):7.1f} µs  {ratio:5.2f}x lru")
    if isinstance(vrows, list):
        (times,) = [r["times"] for r in vrows if r.get("section") == "cost"]
        t: dict[str, list[float]] = times  # type: ignore[assignment]
        print(
            "cost, vLLM's pool: CPU µs per request of 8 blocks (get_new_blocks evicting 8,"
            " cache, free);"
        )
        print("  medians of per-round ratios (interleaved rounds)")
        for mode in ("stock", "lru", "priority", "quotas"):
            vs_lru = statistics.median(a / b for a, b in zip(t[mode], t["lru"], strict=True))
            vs_stock = statistics.median(a / b for a, b in zip(t[mode], t["stock"], strict=True))
            label = {"stock": "vLLM stock", "lru": "gov lru"}.get(mode, f"gov {mode}")
            print(
                f"  {label:13s} {statistics.median(t[mode]):7.1f} µs  {vs_lru:5.2f}x gov lru"
                f"  {vs_stock:5.2f}x stock"
            )


if __name__ == "__main__":
    main()
