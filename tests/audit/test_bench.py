"""The audit benchmark runs in --quick mode and prints its RESULT lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_audit.py"


def test_bench_quick_prints_results() -> None:
    """`bench_audit.py --quick` exits 0 with the SQLite and record() RESULT lines."""
    out = subprocess.run(
        [sys.executable, str(BENCH), "--quick"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    for name in ("sqlite_events_per_s", "record_us", "sqlite_verify_events_per_s"):
        assert f"RESULT {name}=" in out.stdout
