"""The optional vLLM venv of bench_vs_vllm.py and the handle on its worker subprocess."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from vs_vllm_common import (
    REPO,
    REQUIREMENTS,
    TORCH_PIN,
    VLLM_VERSION,
)


class VllmWorker:
    """The parent's handle on the worker subprocess."""

    def __init__(self, python: Path) -> None:
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - lives with the worker
        env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR", "PYTHONDONTWRITEBYTECODE": "1"}
        self._proc = subprocess.Popen(
            [
                str(python),
                str(Path(__file__).resolve().with_name("bench_vs_vllm.py")),
                "--vllm-worker",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=env,
            cwd=str(REPO),
        )
        self.info: dict[str, Any] = self._reply("start")

    def _reply(self, what: str) -> Any:
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            self._stderr.seek(0)
            tail = self._stderr.read()[-3000:]
            raise RuntimeError(f"vLLM worker died during {what}:\n{tail}")
        reply = json.loads(line)
        if not reply["ok"]:
            raise RuntimeError(f"vLLM worker failed in {what}:\n{reply['error']}")
        return reply["result"]

    def call(self, op: str, *args: Any) -> Any:
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps({"op": op, "args": list(args)}) + "\n")
        self._proc.stdin.flush()
        return self._reply(op)

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                assert self._proc.stdin is not None
                self._proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self._proc.stdin.close()
                self._proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
        self._stderr.close()


def _run(cmd: list[str], what: str) -> str | None:
    """Run an install step; return None, or why it failed."""
    print(f"  {what}: {' '.join(cmd)}", flush=True)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError as exc:
        return f"{what}: {exc}"
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return f"{what} failed (exit {proc.returncode}): " + " | ".join(tail)
    return None


def _vllm_ready(python: Path) -> bool:
    if not python.is_file():
        return False
    check = (
        "import vllm, vllm.v1.core.block_pool, vllm.v1.request; "
        f"assert vllm.__version__ == {VLLM_VERSION!r}, vllm.__version__"
    )
    proc = subprocess.run(
        [str(python), "-c", check],
        capture_output=True,
        check=False,
        env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"},
    )
    return proc.returncode == 0


def install_pinned(venv: Path, package: str, requirements: Path) -> str | None:
    """Create ``venv`` if needed and install CPU torch, ``package`` and its pinned
    requirements, all ``--no-deps`` (no CUDA dependency is pulled); None, or why not."""
    python = venv / "bin" / "python"
    pip = [str(venv / "bin" / "pip"), "install", "--disable-pip-version-check", "--quiet"]
    steps: list[tuple[list[str], str]] = []
    if not python.is_file():
        venv.parent.mkdir(parents=True, exist_ok=True)
        base = shutil.which("python3") or sys.executable
        steps.append(([base, "-m", "venv", str(venv)], "create venv"))
    name = package.split("==")[0]
    steps += [
        ([*pip, TORCH_PIN], "install torch"),
        ([*pip, "--no-deps", package], f"install {name}"),
        ([*pip, "--no-deps", "-r", str(requirements)], f"install {name}'s requirements"),
    ]
    for cmd, what in steps:
        why = _run(cmd, what)
        if why is not None:
            return why
    return None


def ensure_vllm(venv: Path, install: bool) -> tuple[Path | None, str]:
    """Reuse or build the vLLM venv; return its python, or None and why not."""
    python = venv / "bin" / "python"
    if _vllm_ready(python):
        return python, f"reusing {venv}"
    if not install:
        return None, f"no working vLLM {VLLM_VERSION} venv at {venv} and --no-install given"
    if not REQUIREMENTS.is_file():
        return None, f"{REQUIREMENTS} is missing (vLLM's CPU-only requirement pins)"
    print(f"building the vLLM {VLLM_VERSION} baseline venv at {venv} (~3 GB, ~2 min)", flush=True)
    why = install_pinned(venv, f"vllm=={VLLM_VERSION}", REQUIREMENTS)
    if why is not None:
        return None, why
    if not _vllm_ready(python):
        return None, f"vLLM {VLLM_VERSION} installed at {venv} but does not import"
    return python, f"built {venv}"
