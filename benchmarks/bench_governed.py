"""Governed cache against the bare allocator on a real trace, in the same run.

Replays ``../shared/data/mooncake_conversation_trace.jsonl`` (each 512-token
hash id expanded into deterministic tokens, see ``govern/replay.py``) through

* the bare allocator: one namespace, plain chained SHA-256 keys, and
* ``GovernedKVCache`` with one tenant: policy decisions (cached), scoped HMAC
  keys, zeroization and the audit trail (SQLite, background writer),

with the same capacity and block size, alternating the two for several rounds.
Prints a table, both hit rates (equal with one tenant), and
``RESULT governed_vs_bare_per_block=<ratio>`` (target <= 1.5, wall time). Also
``governed_vs_bare_cpu_per_block``: the same ratio in process CPU time (every
thread, the audit writer's included), which other load on a shared machine
disturbs far less than wall time; it is reported, not the target.

Usage: ``python benchmarks/bench_governed.py [--requests N] [--rounds R] [--quick]``
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

from govern import GovernedKVCache
from govern.replay import (
    load_trace,
    replay_governed,
    replay_spec,
    replay_ungoverned,
    trace_scope,
)

TRACE = (
    Path(__file__).resolve().parents[1]
    / ".."
    / "shared"
    / "data"
    / ("mooncake_conversation_trace.jsonl")
)
SCOPE = trace_scope("tenant-0")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--blocks", type=int, default=16_384)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--quick", action="store_true", help="200 requests, 1 round")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.rounds = 200, 1
    if not TRACE.is_file():
        print(f"trace not found at {TRACE}; nothing to measure")
        return 0
    requests = load_trace(TRACE, args.requests)
    bare_us: list[float] = []
    gov_us: list[float] = []
    bare_cpu: list[float] = []
    gov_cpu: list[float] = []
    bare_hits = gov_hits = 0.0
    with tempfile.TemporaryDirectory(prefix="kvgov-bench-") as tmp:
        for r in range(args.rounds):
            bare = replay_ungoverned(args.blocks, args.block_size, requests)
            bare_us.append(bare.microseconds_per_block)
            bare_cpu.append(bare.cpu_microseconds_per_block)
            bare_hits = bare.hit_rate
            with GovernedKVCache.create(
                spec=replay_spec(args.block_size),
                num_blocks=args.blocks,
                audit_url=f"sqlite:///{Path(tmp) / f'audit-{r}.db'}",
                ephemeral_secret=True,
            ) as cache:
                gov = replay_governed(cache, requests, lambda _req: SCOPE)
                decisions = cache.stats()
            gov_us.append(gov.microseconds_per_block)
            gov_cpu.append(gov.cpu_microseconds_per_block)
            gov_hits = gov.hit_rate
    bare_med, gov_med = statistics.median(bare_us), statistics.median(gov_us)
    ratio = gov_med / bare_med
    bare_cpu_med, gov_cpu_med = statistics.median(bare_cpu), statistics.median(gov_cpu)
    print(
        f"{len(requests)} requests, {args.blocks} blocks of {args.block_size} tokens, "
        f"{args.rounds} round(s), medians"
    )
    print(f"{'path':<12}{'us/block':>12}{'cpu us/block':>14}{'hit rate':>12}")
    print(f"{'bare':<12}{bare_med:>12.3f}{bare_cpu_med:>14.3f}{bare_hits:>12.4f}")
    print(f"{'governed':<12}{gov_med:>12.3f}{gov_cpu_med:>14.3f}{gov_hits:>12.4f}")
    print("(cpu: process CPU time, audit writer thread included; steadier on a busy machine)")
    print(
        f"policy decision cache: {decisions.decision_cache_hits} hits, "
        f"{decisions.decision_cache_misses} misses"
    )
    print(f"RESULT bare_us_per_block={bare_med:.3f}")
    print(f"RESULT governed_us_per_block={gov_med:.3f}")
    print(f"RESULT governed_vs_bare_per_block={ratio:.3f}")
    print(f"RESULT governed_vs_bare_cpu_per_block={gov_cpu_med / bare_cpu_med:.3f}")
    print(f"RESULT bare_hit_rate={bare_hits:.6f}")
    print(f"RESULT governed_hit_rate={gov_hits:.6f}")
    print(f"RESULT hit_rates_equal={int(bare_hits == gov_hits)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
