"""device="cuda" where the machine has none: a typed kvgov error, and nothing set up."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from kvgov.allocator import KVSpec, resolve_device
from kvgov.cli.main import main
from kvgov.exceptions import InvalidSpec, KVGovError
from kvgov.govern import GovernedKVCache

SPEC = KVSpec(2, 2, 8, block_size=4)


def _missing_cuda() -> tuple[str, str]:
    """A CUDA device this machine lacks, and what the error says about it."""
    if not torch.cuda.is_available():
        return "cuda", "CUDA is not available"
    return f"cuda:{torch.cuda.device_count()}", "CUDA device(s)"


def test_resolve_device_refuses_a_missing_cuda_device() -> None:
    """InvalidSpec (a KVGovError and a ValueError) naming the device, not torch's assert."""
    device, says = _missing_cuda()
    with pytest.raises(InvalidSpec, match=says) as info:
        resolve_device(device)
    assert isinstance(info.value, KVGovError) and isinstance(info.value, ValueError)
    assert info.value.field == "device"
    assert resolve_device("cpu") == torch.device("cpu")
    with pytest.raises(InvalidSpec, match="not a torch device"):
        resolve_device("tpu-ish")


def test_governed_cache_on_missing_cuda_opens_nothing(tmp_path: Path) -> None:
    """GovernedKVCache.create(device="cuda") without CUDA: the typed error, before the
    audit database, its spool or its writer thread exist."""
    device, says = _missing_cuda()
    threads = set(threading.enumerate())
    with pytest.raises(InvalidSpec, match=says):
        GovernedKVCache.create(
            SPEC, 16, device=device, audit_url=f"sqlite:///{tmp_path / 'audit.db'}",
            ephemeral_secret=True,
        )  # fmt: skip
    assert list(tmp_path.iterdir()) == []
    assert set(threading.enumerate()) <= threads


def test_demo_on_missing_cuda_is_one_error_line_and_creates_nothing(tmp_path: Path) -> None:
    """`kvgov demo --device cuda` without CUDA: exit 2, one error line, no output folder."""
    device, says = _missing_cuda()
    out = tmp_path / "demo"
    result = CliRunner().invoke(main, ["demo", "--quick", "--device", device, "--out", str(out)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and says in lines[0]
    assert not out.exists()
