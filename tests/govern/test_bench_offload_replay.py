"""benchmarks/bench_offload_replay.py runs on a slice of the trace and prints its RESULT lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_offload_replay.py"


def test_a_short_replay_prints_both_runs_and_the_ideal() -> None:
    """200 requests: the host tier avoids more prefill than the device alone, never above ideal."""
    out = subprocess.run(
        [sys.executable, str(BENCH), "--requests", "200"],
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert out.returncode == 0, out.stderr
    results = dict(
        line.removeprefix("RESULT ").split("=", 1)
        for line in out.stdout.splitlines()
        if line.startswith("RESULT ")
    )
    ideal = float(results["ideal_hit_rate"])
    bare, tiered = float(results["device_only_hit_rate"]), float(results["host_tier_hit_rate"])
    assert bare < tiered <= ideal
    assert int(results["host_tier_restored_tokens"]) > 0
