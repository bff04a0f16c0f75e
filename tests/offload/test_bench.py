"""The offload benchmark runs in --quick mode and prints its RESULT lines."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_offload.py"


def test_bench_quick_prints_results() -> None:
    """`bench_offload.py --quick --no-redis` exits 0 with host and disk figures side by side."""
    out = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--no-redis"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    for name in ("host_store_ratio", "host_load_ratio", "host_load_into_ratio",
                 "host_load_block_ratio", "disk_store_plain_gib_s",
                 "disk_load_encrypted_gib_s"):  # fmt: skip
        assert f"RESULT {name}=" in out.stdout
