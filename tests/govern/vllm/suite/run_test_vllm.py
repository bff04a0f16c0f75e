"""``make test-vllm``: build (or reuse) a vLLM venv, then run the binding's tests and vLLM's own.

    python tests/govern/vllm/suite/run_test_vllm.py [--venv DIR] [--tests DIR]

Stages (each timed; everything lands under the repository's ignored ``.bench/``):

1. the venv ``.bench/vllm-venv`` — the one ``benchmarks/bench_vs_vllm.py`` uses: torch
   2.13.0 (CPU), vLLM 0.33.0 without its CUDA dependencies, vLLM's CPU requirement pins
   (``benchmarks/vllm-cpu-requirements.txt``); then kvgov itself (editable) and the test tools;
2. vLLM's ``tests/`` from its sdist and config-only Hugging Face models
   (``benchmarks/vllm_config_only_models.py``), in ``.bench/vllm-tests``
   (``benchmarks/vllm-cpu.md`` has the recipe);
3. the binding's tests (``tests/govern/vllm``: those marked ``vllm``, and the vLLM-free ones);
4. every file of vLLM's ``tests/v1/core`` that runs on the CPU (:data:`VLLM_FILES`), stock
   and with kvgov's classes substituted (``kvgov_vllm_suite.py``), side by side;
5. the comparison (``compare_suites.py``): any test that passes stock and fails governed
   outside ``differences.py`` fails the run;
6. vLLM's hybrid Mamba tests that seed the cache with an unadmitted request, governed
   with that request admitted (``vllm_seeded_admitted.py``): they must pass.

Exit status 0 only if every stage passed. Standard library only: run it with any python.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[4]
SUITE = Path(__file__).resolve().parent
BENCHMARKS = REPO / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))

from vs_vllm_common import TORCH_PIN, VLLM_VERSION  # noqa: E402
from vs_vllm_venv import ensure_vllm  # noqa: E402

TEST_TOOLS = [
    "pytest",
    "pytest-asyncio",
    "pytest-timeout",
    "hypothesis",
    "einops",
    "tblib",
    "compressed-tensors==0.17.0",
]
#: pip lines that say nothing here: local indexes lacking a name, and vLLM's CUDA-side
#: requirements, which the CPU venv deliberately leaves unmet
_PIP_NOISE = (
    "is ignored: it is neither a file nor a directory",
    f"vllm {VLLM_VERSION} requires",
    "pip's dependency resolver does not currently take into account",
)
#: Every file of vLLM 0.33's tests/v1/core that runs on the CPU without a model: not the
#: *_e2e.py files (they serve a real model), nor test_hybrid_prefix_cache_hit_rate.py
#: (it fails to collect on the CPU build). test_prefix_replay.py runs since the binding
#: keeps the blocks an async KV-connector load fills out of a step's zeroing (zeroed at
#: their next release) and carries vLLM's own list where vLLM needs zeroing (mixed
#: precision). docs/vllm.md, "vLLM's own tests, governed".
VLLM_FILES = [
    f"tests/v1/core/{name}.py"
    for name in (
        "prefix_cache/test_mamba_eagle_resume_checkpoint",
        "prefix_cache/test_partial_prefix_cache_hits",
        "prefix_cache/test_partial_prefix_cache_primitives",
        "test_async_scheduler",
        "test_contiguous_kv_packing",
        "test_deferred_block_free",
        "test_encoder_cache_manager",
        "test_kv_cache_config_builder",
        "test_kv_cache_metrics",
        "test_kv_cache_planning",
        "test_kv_cache_utils",
        "test_kv_sharing",
        "test_mamba_align_chunk_split",
        "test_output",
        "test_prefix_caching",
        "test_priority_preemption_bug",
        "test_prefix_replay",
        "test_priority_scheduler_random",
        "test_repetition_detection",
        "test_scheduler",
        "test_single_type_kv_cache_manager",
        "test_swa_inflight_window_free",
        "test_worker_slot_overflow",
    )
]


def _stage(name: str, timings: list[tuple[str, float]]) -> float:
    print(f"=== {name}", flush=True)
    timings.append((name, 0.0))
    return time.monotonic()


def _run(cmd: list[str], **kwargs: object) -> int:
    print("  $ " + " ".join(str(c) for c in cmd), flush=True)
    return subprocess.run(cmd, check=False, **kwargs).returncode  # type: ignore[call-overload, no-any-return]


def _pip_quiet(python: Path, *args: str) -> int:
    """pip install, dropping the noise of local indexes that lack a name."""
    cmd = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *args]
    print("  $ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    for line in (proc.stdout + proc.stderr).splitlines():
        if not any(noise in line for noise in _PIP_NOISE):
            print("  " + line)
    return proc.returncode


def ensure_kvgov(python: Path) -> None:
    """kvgov (editable, with its dependencies) and the test tools, once per pyproject."""
    stamp = python.parent.parent / ".kvgov-test-vllm"
    want = hashlib.sha256((REPO / "pyproject.toml").read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text() == want:
        print(f"  reusing kvgov and the test tools in {python.parent.parent}")
        return
    # the torch pin keeps pip from replacing the CPU torch vLLM's wheel was installed with
    if _pip_quiet(python, "-e", str(REPO), TORCH_PIN, *TEST_TOOLS):
        raise SystemExit("installing kvgov into the vLLM venv failed")
    stamp.write_text(want)


def ensure_vllm_tests(python: Path, root: Path) -> Path:
    """vLLM's tests/ (from its sdist) and config-only models under ``root``; returns HF_HOME."""
    tests, hf = root / "tests", root / "hf"
    if (tests / "v1" / "core" / "test_scheduler.py").is_file() and (hf / "hub").is_dir():
        print(f"  reusing {root}")
        return hf
    shutil.rmtree(root, ignore_errors=True)
    unpack = root.parent / "vllm-src"
    shutil.rmtree(unpack, ignore_errors=True)
    unpack.mkdir(parents=True)
    # pip unpacks the sdist, then fails building its metadata (setuptools_rust): expected;
    # --no-clean keeps the unpacked tree, which holds tests/
    subprocess.run(
        [str(python), "-m", "pip", "download", "--quiet", "-d", str(unpack), "--no-deps",
         "--no-binary", ":all:", "--no-build-isolation", "--no-clean", f"vllm=={VLLM_VERSION}"],
        env={**os.environ, "TMPDIR": str(unpack)}, capture_output=True, check=False,
    )  # fmt: skip
    found = sorted(unpack.glob("pip-download-*/vllm_*/tests"))
    if not found or not (found[0] / "v1" / "core").is_dir():
        raise SystemExit(f"no tests/ in vLLM {VLLM_VERSION}'s sdist (looked in {unpack})")
    root.mkdir(parents=True)
    shutil.copytree(found[0], tests)  # keep the name: the tests import tests.v1.core.utils
    shutil.rmtree(unpack, ignore_errors=True)
    # vLLM's tests are not kvgov's: an empty ini stops pytest from reading kvgov's pyproject
    (root / "pytest.ini").write_text("[pytest]\n")
    if _run(
        [str(python), str(BENCHMARKS / "vllm_config_only_models.py")],
        cwd=BENCHMARKS,
        env={**os.environ, "HF_HOME": str(hf)},
        stdout=subprocess.DEVNULL,
    ):
        raise SystemExit("writing the config-only models failed")
    return hf


def run_vllm_suites(python: Path, root: Path, hf: Path) -> int:
    """vLLM's files stock and governed, side by side (two processes); then compare."""
    env = {
        **os.environ,
        "VLLM_TARGET_DEVICE": "cpu",
        "HF_HOME": str(hf),
        "HF_HUB_OFFLINE": "1",
        "VLLM_LOGGING_LEVEL": "ERROR",
    }
    common = ["-q", "--noconftest", "-p", "no:cacheprovider", "-o", "addopts="]
    stock_xml, governed_xml = root / "stock.xml", root / "governed.xml"
    stock = subprocess.Popen(
        [str(python), "-m", "pytest", *VLLM_FILES, *common, f"--junitxml={stock_xml}"],
        cwd=root,
        env={**env, "PYTHONPATH": str(root), "VLLM_PLUGINS": "none"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    governed = subprocess.Popen(
        [str(python), "-m", "pytest", *VLLM_FILES, *common, "-p", "kvgov_vllm_suite",
         f"--junitxml={governed_xml}"],
        cwd=root,
        env={**env, "PYTHONPATH": f"{SUITE}{os.pathsep}{root}"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )  # fmt: skip
    for label, proc in (("stock", stock), ("governed", governed)):
        out, _ = proc.communicate()
        tail = [line for line in out.splitlines() if " passed" in line or " failed" in line]
        print(f"  {label}: {tail[-1] if tail else out[-2000:]}", flush=True)
    return _run(
        [sys.executable, str(SUITE / "compare_suites.py"), "--stock", str(stock_xml),
         "--governed", str(governed_xml)]
    )  # fmt: skip


def run_seeded_admitted(python: Path, root: Path, hf: Path) -> int:
    """vLLM's seeded hybrid Mamba tests, governed, with the seeding request admitted."""
    env = {
        **os.environ,
        "VLLM_TARGET_DEVICE": "cpu",
        "HF_HOME": str(hf),
        "HF_HUB_OFFLINE": "1",
        "VLLM_LOGGING_LEVEL": "ERROR",
        "PYTHONPATH": f"{SUITE}{os.pathsep}{root}",
    }
    return _run(
        [str(python), "-m", "pytest", str(SUITE / "vllm_seeded_admitted.py"), "-q",
         "--noconftest", "-p", "no:cacheprovider", "-o", "addopts=", "-c",
         str(root / "pytest.ini"), "--rootdir", str(root), "--import-mode=importlib",
         "-p", "kvgov_vllm_suite"],
        cwd=root,
        env=env,
    )  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=REPO / ".bench" / "vllm-venv")
    parser.add_argument("--tests", type=Path, default=REPO / ".bench" / "vllm-tests")
    args = parser.parse_args()
    t0 = time.monotonic()
    times: list[tuple[str, float]] = []

    def done(start: float) -> None:
        name, _ = times[-1]
        times[-1] = (name, time.monotonic() - start)

    start = _stage(f"vLLM {VLLM_VERSION} venv with kvgov: {args.venv}", times)
    python, why = ensure_vllm(args.venv, install=True)
    if python is None:
        print(f"FAILED: {why}")
        return 1
    print(f"  {why}")
    ensure_kvgov(python)
    done(start)

    start = _stage("vLLM's tests (sdist) and config-only models", times)
    hf = ensure_vllm_tests(python, args.tests)
    done(start)

    start = _stage("the binding's tests (tests/govern/vllm)", times)
    binding = _run(
        [str(python), "-m", "pytest", "tests/govern/vllm", "-q", "-p", "no:cacheprovider",
         "-p", "no:asyncio", "-m", "not vllm_e2e"],
        cwd=REPO,
        env={**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_LOGGING_LEVEL": "ERROR"},
    )  # fmt: skip
    done(start)

    start = _stage("vLLM's scheduler and prefix-cache tests, stock and governed", times)
    suites = run_vllm_suites(python, args.tests, hf)
    done(start)

    start = _stage("vLLM's seeded hybrid Mamba tests, the seeding request admitted", times)
    seeded = run_seeded_admitted(python, args.tests, hf)
    done(start)

    print("timings: " + ", ".join(f"{n.split(':')[0]} {s:.0f} s" for n, s in times))
    print(f"total {time.monotonic() - t0:.0f} s")
    ok = binding == 0 and suites == 0 and seeded == 0
    print(f"RESULT test-vllm {'ok' if ok else 'FAILED'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
