"""The SGLang 0.5.23 CPU venv (no model) of ``make test-sglang`` and bench_vs_sglang.py.

Recipe (measured here: about 2 minutes, 2.5 GB): CPU torch 2.13.0, ``sglang==0.5.23
--no-deps`` (its metadata wants CUDA torch and flashinfer), the pure-Python pins its
import chain needs (``sglang/requirements-cpu.txt``, ``--no-deps``), and a shim
(``sglang/_sglang_cpu_tvfix.py`` plus a ``.pth``) that lets PyPI's CUDA-linked
torchvision import its Python parts. Uses the install helper of the vLLM venv.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from vs_vllm_common import REPO
from vs_vllm_venv import install_pinned

SGLANG_VERSION = "0.5.23"
HERE = Path(__file__).resolve().parent / "sglang"
REQUIREMENTS = HERE / "requirements-cpu.txt"
SHIM = HERE / "_sglang_cpu_tvfix.py"
DEFAULT_VENV = REPO / ".bench" / "sglang-venv"


def sglang_ready(python: Path) -> bool:
    """Whether ``python`` imports SGLang's unified radix cache at the pinned version."""
    if not python.is_file():
        return False
    check = (
        "import sglang, sglang.srt.mem_cache.unified_radix_cache; "
        f"assert sglang.__version__ == {SGLANG_VERSION!r}, sglang.__version__"
    )
    return subprocess.run([str(python), "-W", "ignore", "-c", check], capture_output=True,
                          check=False).returncode == 0  # fmt: skip


def ensure_sglang(venv: Path = DEFAULT_VENV) -> tuple[Path | None, str]:
    """Reuse or build the SGLang venv; return its python, or None and why not."""
    python = venv / "bin" / "python"
    if sglang_ready(python):
        return python, f"reusing {venv}"
    print(f"building the SGLang {SGLANG_VERSION} CPU venv at {venv} (~2.5 GB, ~2 min)", flush=True)
    why = install_pinned(venv, f"sglang=={SGLANG_VERSION}", REQUIREMENTS)
    if why is not None:
        return None, why
    purelib = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip
    shutil.copyfile(SHIM, Path(purelib) / SHIM.name)
    (Path(purelib) / "_sglang_cpu_tvfix.pth").write_text("import _sglang_cpu_tvfix\n")
    if not sglang_ready(python):
        return None, f"SGLang {SGLANG_VERSION} installed at {venv} but does not import"
    return python, f"built {venv}"


__all__ = ["DEFAULT_VENV", "SGLANG_VERSION", "ensure_sglang", "sglang_ready"]
