"""The policy benchmark runs (smoke, --quick) and prints its RESULT lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_policy_quick_prints_results() -> None:
    """`bench_policy.py --quick` exits 0 and prints the headline RESULT lines."""
    out = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "bench_policy.py"), "--quick"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=240,
        check=True,
    ).stdout
    for name in (
        "policy_cached_us",
        "policy_embedded_us",
        "policy_reference_us",
        "policy_opa_loopback_us",
    ):
        assert f"RESULT {name}=" in out
