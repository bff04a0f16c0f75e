"""benchmarks/bench_vs_vllm.py without vLLM: its skip path, its paired statistics and
kvgov's side of every workload (whose built-in checks raise on a wrong hit count)."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_vs_vllm.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    sys.path.insert(0, str(BENCH.parent))  # as when run as a script: paired.py beside it
    spec = importlib.util.spec_from_file_location("bench_vs_vllm", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_vs_vllm"] = module  # dataclasses and NamedTuples look it up
    spec.loader.exec_module(module)
    return module


def _run_bench(*args: str, code: int = 0, timeout: int = 240) -> subprocess.CompletedProcess[str]:
    """Run the benchmark script; fail the test unless it exits with ``code``."""
    out = subprocess.run(
        [sys.executable, str(BENCH), *args], capture_output=True, text=True, timeout=timeout
    )
    assert out.returncode == code, out.stderr
    return out


def test_skips_with_exit_0_where_vllm_is_unavailable(tmp_path: Path) -> None:
    """No vLLM venv and --no-install: a SKIP line saying why, vllm_available=0, exit 0."""
    out = _run_bench("--quick", "--no-install", "--vllm-venv", str(tmp_path / "absent"))
    assert "SKIP: the vLLM baseline is unavailable" in out.stdout
    assert "--no-install given" in out.stdout
    assert "RESULT vllm_available=0" in out.stdout


def _pair(vllm: dict[str, float], kvgov: dict[str, float]) -> dict[str, dict[str, Any]]:
    return {"vllm": dict(vllm), "kvgov": dict(kvgov)}


def test_ratio_is_the_median_of_per_pair_ratios(bench: ModuleType) -> None:
    """A drifting machine: the median of per-pair ratios (0.8) is reported, not the
    ratio of the medians (1.9 / 2 = 0.95)."""
    rows = bench.summarize({"alloc_free": [(1.0, 0.8), (2.0, 1.9), (3.0, 2.4)]})
    (row,) = rows
    assert row.name == "alloc_free"
    assert row.vllm == 2.0
    assert row.kvgov == 1.9
    assert row.ratio == pytest.approx(0.8)
    assert row.p25 == pytest.approx(0.8)
    assert row.p75 == pytest.approx(0.95)


def test_derived_figures_are_derived_pair_by_pair(bench: ModuleType) -> None:
    """prefix_path sums one pair's three steps; governed averages miss and hit pairs of
    the same index; replay rounds pair in order."""
    step = {"key_derivation": 2.0, "cache_blocks": 1.0, "lookup": 1.0, "find_only": 0.9}
    samples = {
        "alloc_free": [_pair({"alloc_free": 1.0}, {"alloc_free": 0.5})],
        "prefix": [_pair(step, {k: v / 2 for k, v in step.items()})],
        "evict": [_pair({"evict": 1.0}, {"evict": 0.9})],
        "governed_miss": [
            _pair({"governed_miss": 4.0}, {"governed_miss": 3.0}),
            _pair({"governed_miss": 8.0}, {"governed_miss": 4.0}),
        ],
        "governed_hit": [
            _pair({"governed_hit": 2.0}, {"governed_hit": 1.0}),
            _pair({"governed_hit": 4.0}, {"governed_hit": 4.0}),
        ],
    }
    replays = {
        "vllm": [{"replay": 5.0}, {"replay": 6.0}],
        "kvgov": [{"replay": 4.0}, {"replay": 6.0}],
    }
    figures = bench.paired_figures(samples, replays)
    assert figures["prefix_path"] == [(4.0, 2.0)]
    assert figures["governed"] == [(3.0, 2.0), (6.0, 4.0)]
    assert figures["replay"] == [(5.0, 4.0), (6.0, 6.0)]
    rows = {r.name: r for r in bench.summarize(figures)}
    assert rows["governed"].ratio == pytest.approx(2 / 3)
    assert rows["replay"].ratio == pytest.approx((0.8 + 1.0) / 2)


def test_kvgov_side_runs_every_workload(bench: ModuleType, tmp_path: Path) -> None:
    """Each kvgov workload returns positive per-block costs; lookup and governed hit
    counts are checked inside (a wrong count raises RuntimeError), and the policy
    workloads give one figure per mode."""
    side = bench.KvgovSide(tmp_path)
    try:
        results = {
            "alloc_free": side.alloc_free(20),
            "prefix": side.prefix(2),
            "evict": side.evict(20),
            "governed_miss": side.governed_miss(2),
            "governed_hit": side.governed_hit(2),
            "evict_policy": side.evict_policy(12),
            "alloc_policy": side.alloc_policy(12),
        }
    finally:
        side.close()
    assert set(results["prefix"]) == {"key_derivation", "cache_blocks", "lookup"}
    modes = ("lru", "priority", "quotas")
    assert set(results["evict_policy"]) == {f"{f}_{m}" for f in ("evict", "refill") for m in modes}
    assert set(results["alloc_policy"]) == {f"alloc_free_{m}" for m in modes}
    for name, figures in results.items():
        for key, value in figures.items():
            assert value > 0, (name, key)


def test_policy_rows_are_per_pool_ratios_to_lru_median_over_calls(bench: ModuleType) -> None:
    """The policy table pairs each mode with the same pool's lru within one call (and
    vLLM's with stock too), and summarizes the per-call ratios by their median."""
    figs = ("evict", "refill")

    def call(
        lru: float, prio: float, quotas: float, stock: float | None = None
    ) -> dict[str, float]:
        out: dict[str, float] = {}
        for f in figs:
            out.update({f"{f}_lru": lru, f"{f}_priority": prio, f"{f}_quotas": quotas})
            if stock is not None:
                out[f"{f}_stock"] = stock
        return out

    samples = {
        "evict_policy": [
            _pair(call(2.0, 2.0, 3.0, 1.0), call(1.0, 1.1, 2.0)),
            _pair(call(4.0, 4.4, 5.0, 2.0), call(3.0, 3.0, 3.0)),
            _pair(call(1.0, 1.0, 1.0, 1.0), call(2.0, 2.0, 2.0)),
        ]
    }
    rows = {(r.pool, r.figure): r for r in bench.policy_rows(samples)}
    assert set(rows) == {(p, f) for p in ("kvgov", "vllm") for f in figs}
    kv = rows["kvgov", "evict"]
    assert kv.cost == {"lru": 2.0, "priority": 2.0, "quotas": 2.0}
    assert kv.ratio["priority/lru"][0] == pytest.approx(1.0)  # median of 1.1, 1.0, 1.0
    assert kv.ratio["quotas/lru"][0] == pytest.approx(1.0)  # median of 2.0, 1.0, 1.0
    v = rows["vllm", "evict"]
    assert v.ratio["priority/lru"][0] == pytest.approx(1.0)  # 1.0, 1.1, 1.0
    assert v.ratio["lru/stock"][0] == pytest.approx(2.0)  # 2.0, 2.0, 1.0
    assert "stock/lru" not in v.ratio and "lru/lru" not in v.ratio


def test_profile_prints_kvgov_call_tree_without_vllm() -> None:
    """--profile runs kvgov's side of one workload under pyinstrument (a dev dependency),
    needs no vLLM venv, and prints the call tree and the figure."""
    out = _run_bench("--profile", "alloc_free")
    assert "BlockPool.allocate" in out.stdout
    assert '"alloc_free":' in out.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cpu", "100000"], "--cpu 100000: this process may run only on CPUs"),
        (["--rounds", "-1"], "--rounds must be 0 (the default) or more"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(args: list[str], message: str) -> None:
    """A CPU this process may not use, or a negative count, is refused before any work."""
    out = _run_bench(*args, code=2, timeout=60)
    assert message in out.stderr
