"""``make test-sglang``: build or reuse the SGLang venv, run the binding's tests and benchmark.

    python tests/govern/sglang/suite/run_test_sglang.py [--venv DIR]

1. the venv ``.bench/sglang-venv`` (``benchmarks/sglang_venv.py``: SGLang 0.5.23 on the
   CPU, no model), then kvgov itself (editable) and pytest, the way ``make test-vllm`` does;
2. ``tests/govern/sglang`` (the differential test, stock vs governed UnifiedRadixCache);
3. ``benchmarks/bench_vs_sglang.py`` (figures for the record; fails only if it cannot run).

Standard library only: run it with any python.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "tests" / "govern" / "vllm" / "suite"))

from run_test_vllm import _pip_quiet, _run  # noqa: E402
from sglang_venv import DEFAULT_VENV, ensure_sglang  # noqa: E402
from vs_vllm_common import TORCH_PIN  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    args = parser.parse_args()
    t0 = time.monotonic()
    print(f"=== SGLang venv with kvgov: {args.venv}", flush=True)
    python, why = ensure_sglang(args.venv)
    if python is None:
        print(f"FAILED: {why}")
        return 1
    print(f"  {why}")
    stamp = args.venv / ".kvgov-test-sglang"
    if not stamp.exists():
        if _pip_quiet(python, "-e", str(REPO), TORCH_PIN, "pytest", "pytest-timeout"):
            print("FAILED: installing kvgov into the SGLang venv")
            return 1
        stamp.write_text("ok\n")
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    print("=== the binding's tests (tests/govern/sglang)", flush=True)
    tests = _run(
        [str(python), "-m", "pytest", "tests/govern/sglang", "-q", "-p", "no:cacheprovider"],
        cwd=REPO,
        env=env,
    )
    print("=== benchmarks/bench_vs_sglang.py", flush=True)
    bench = _run([str(python), str(REPO / "benchmarks" / "bench_vs_sglang.py")], cwd=REPO, env=env)
    print(f"total {time.monotonic() - t0:.0f} s")
    ok = tests == 0 and bench == 0
    print(f"RESULT test-sglang {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
