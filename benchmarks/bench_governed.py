"""Governed cache against the bare allocator on a real trace, in the same run.

Replays ``data/mooncake/mooncake_conversation_trace.jsonl`` (each 512-token
hash id expanded into deterministic tokens, see ``govern/replay.py``) through

* the bare allocator: one namespace, plain chained SHA-256 keys, and
* ``GovernedKVCache`` with one tenant: policy decisions (cached), scoped HMAC
  keys, zeroization and the audit trail (SQLite, background writer),

with the same capacity and block size, in lockstep: the trace is cut into
chunks of ``--chunk`` requests, and each chunk is replayed through both, back
to back, alternating which goes first (a *pair*). The governed half ends with
``audit.flush()``, so the background writer's work on the chunk is counted.
Each cache keeps its state from chunk to chunk, so both see the whole trace in
order. The ratio is the median of the per-pair ratios: a slow spell of a
shared machine slows both halves of a pair and cancels, where two whole
replays seconds apart did not (1.8-2.6 from run to run).

Prints a table, both hit rates (equal with one tenant), and
``RESULT governed_vs_bare_per_block=<ratio>`` (target <= 2.0, wall time: a
regression guard; per-block HMAC-SHA256 keys stay, see docs/performance.md). Also
``governed_vs_bare_cpu_per_block``: the same in process CPU time (every
thread, the audit writer's included); it is reported, not the target.

Usage: ``python benchmarks/bench_governed.py [--requests N] [--rounds R] [--chunk C] [--quick]``
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

from paired import ratio_stats  # benchmarks/paired.py, beside this script
from vs_vllm_common import TRACE

from kvgov.allocator import BlockPool
from kvgov.govern import GovernedKVCache
from kvgov.govern.replay import (
    ReplayResult,
    TraceRequest,
    load_trace,
    replay_bare,
    replay_governed,
    replay_spec,
    trace_scope,
)

SCOPE = trace_scope("tenant-0")


def _half(
    side: str, part: list[TraceRequest], pool: BlockPool, cache: GovernedKVCache
) -> tuple[float, float, ReplayResult]:
    """One side's replay of a chunk: wall and CPU seconds (the governed side's audit
    flush included, so its background writer's work counts), and the result."""
    if side == "bare":
        res = replay_bare(pool, part)
        return res.seconds, res.cpu_seconds, res
    res = replay_governed(cache, part, lambda _req: SCOPE)
    t0, c0 = time.perf_counter(), time.process_time()
    cache.audit.flush()
    return res.seconds + time.perf_counter() - t0, res.cpu_seconds + time.process_time() - c0, res


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--blocks", type=int, default=16_384)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--chunk", type=int, default=20, help="requests per pair")
    parser.add_argument("--quick", action="store_true", help="200 requests, 1 round")
    args = parser.parse_args()
    if args.quick:
        args.requests, args.rounds = 200, 1
    for name in ("requests", "rounds", "blocks", "block_size", "chunk"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if not TRACE.is_file():
        print(f"trace not found at {TRACE} (it ships in the repository)", file=sys.stderr)
        return 1
    requests = load_trace(TRACE, args.requests)
    spec = replay_spec(args.block_size)
    wall: list[tuple[float, float]] = []  # per pair: (bare, governed) us per block
    cpu: list[tuple[float, float]] = []
    totals = {"bare": [0.0, 0], "governed": [0.0, 0]}  # seconds, blocks
    hits = {"bare": [0, 0], "governed": [0, 0]}  # hit tokens, prompt tokens
    pair = 0
    with tempfile.TemporaryDirectory(prefix="kvgov-bench-") as tmp:
        for r in range(args.rounds):
            pool = BlockPool(spec, args.blocks)
            cache = GovernedKVCache.create(
                spec=spec,
                num_blocks=args.blocks,
                audit_url=f"sqlite:///{Path(tmp) / f'audit-{r}.db'}",
                ephemeral_secret=True,
            )

            try:
                for start in range(0, len(requests), args.chunk):
                    part = requests[start : start + args.chunk]
                    order = ("bare", "governed") if pair % 2 == 0 else ("governed", "bare")
                    pair += 1
                    got = {side: _half(side, part, pool, cache) for side in order}
                    for side, (seconds, _, res) in got.items():
                        totals[side][0] += seconds
                        totals[side][1] += res.blocks
                        hits[side][0] += res.hit_tokens
                        hits[side][1] += res.prompt_tokens
                    (b_wall, b_cpu, b_res), (g_wall, g_cpu, g_res) = got["bare"], got["governed"]
                    if b_res.blocks and g_res.blocks:  # a chunk of skipped requests has no cost
                        wall.append((b_wall / b_res.blocks, g_wall / g_res.blocks))
                        cpu.append((b_cpu / b_res.blocks, g_cpu / g_res.blocks))
                decisions = cache.stats()
            finally:
                cache.close()
                pool.close()
    if not wall:
        print(
            f"no request fits a pool of {args.blocks} blocks: nothing to compare", file=sys.stderr
        )
        return 2
    stats = ratio_stats(wall)
    cpu_ratio = ratio_stats(cpu).median
    bare_us = totals["bare"][0] / totals["bare"][1] * 1e6
    gov_us = totals["governed"][0] / totals["governed"][1] * 1e6
    bare_rate = hits["bare"][0] / hits["bare"][1]
    gov_rate = hits["governed"][0] / hits["governed"][1]
    print(
        f"{len(requests)} requests, {args.blocks} blocks of {args.block_size} tokens, "
        f"{args.rounds} round(s) of {len(wall) // args.rounds} pairs of {args.chunk} requests"
    )
    print(f"{'path':<12}{'us/block':>12}{'hit rate':>12}")
    print(f"{'bare':<12}{bare_us:>12.3f}{bare_rate:>12.4f}")
    print(f"{'governed':<12}{gov_us:>12.3f}{gov_rate:>12.4f}")
    print(
        f"governed / bare: median of {len(wall)} per-pair ratios {stats.median:.3f} "
        f"(p25-p75 {stats.p25:.2f}-{stats.p75:.2f}); in CPU time {cpu_ratio:.3f}"
    )
    print(
        f"policy decision cache: {decisions.decision_cache_hits} hits, "
        f"{decisions.decision_cache_misses} misses"
    )
    print(f"RESULT bare_us_per_block={bare_us:.3f}")
    print(f"RESULT governed_us_per_block={gov_us:.3f}")
    print(f"RESULT governed_vs_bare_per_block={stats.median:.3f}")
    print(f"RESULT governed_vs_bare_cpu_per_block={cpu_ratio:.3f}")
    print(f"RESULT bare_hit_rate={bare_rate:.6f}")
    print(f"RESULT governed_hit_rate={gov_rate:.6f}")
    print(f"RESULT hit_rates_equal={int(hits['bare'] == hits['governed'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
