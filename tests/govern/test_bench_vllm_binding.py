"""benchmarks/bench_vllm_binding.py without vLLM: it skips, saying why, with exit 0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_vllm_binding.py"


def _vllm_importable() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


@pytest.mark.skipif(_vllm_importable(), reason="vLLM imports here: the skip path cannot be taken")
def test_skips_with_exit_0_where_vllm_is_unavailable() -> None:
    """No vLLM in this python and no re-run in the vLLM venv: a SKIP line, exit 0."""
    out = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--no-reexec"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert "SKIP: vLLM is unavailable" in out.stdout
    assert "RESULT vllm_available=0" in out.stdout


@pytest.mark.parametrize("flag", ["--rounds", "--writer-stream"])
def test_bad_arguments_exit_2(flag: str) -> None:
    """Negative counts are refused before any work."""
    out = subprocess.run(
        [sys.executable, str(BENCH), flag, "-1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 2 and flag in out.stderr


def test_the_target_is_1_10_at_1024_tokens_and_1_05_from_4096() -> None:
    """#28's targets, by prompt length: what the RESULT target line is checked against."""
    sys.path.insert(0, str(BENCH.parent))
    try:
        import bench_vllm_binding
    finally:
        sys.path.remove(str(BENCH.parent))
    assert bench_vllm_binding.target_for(1024) == 1.10
    assert bench_vllm_binding.target_for(4095) == 1.10
    assert bench_vllm_binding.target_for(4096) == 1.05
    assert bench_vllm_binding.target_for(16384) == 1.05
