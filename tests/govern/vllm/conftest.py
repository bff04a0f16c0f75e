"""Fixtures of the vLLM binding's tests: they run in ``make test-vllm``'s venv only.

Every test here is marked ``vllm``; ``make test`` deselects them (``-m "not vllm"``),
and nothing imports vLLM at collection: ``harness`` (which does) is imported by the
fixtures.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("VLLM_TARGET_DEVICE", "cpu")


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A config-only model (no weights, no tokenizer): what vLLM's scheduler reads of a model."""
    import transformers

    path = tmp_path_factory.mktemp("tiny-opt")
    transformers.OPTConfig(
        vocab_size=1024,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        ffn_dim=128,
        max_position_embeddings=2048,
        architectures=["OPTForCausalLM"],
        torch_dtype="float16",
    ).save_pretrained(path)
    return path


@pytest.fixture(scope="session", autouse=True)
def plugin_registered() -> None:
    """What vLLM does in every process: run kvgov's general plugin."""
    from kvgov.govern.vllm import plugin

    plugin.register()


@pytest.fixture()
def clock() -> Any:
    from tests.support.clock import FakeClock

    return FakeClock()


@pytest.fixture()
def vllm(
    model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, clock: Any
) -> Iterator[Any]:
    """The harness: schedulers on the config-only model, audited to this test's SQLite file."""
    from kvgov.govern.vllm.scheduler import GovernedSchedulerMixin

    from . import harness

    monkeypatch.setenv("KVGOV_KEY_SECRET", harness.SECRET)
    for name in list(os.environ):
        if name.startswith("KVGOV_") and name != "KVGOV_KEY_SECRET":
            monkeypatch.delenv(name)
    monkeypatch.setattr(GovernedSchedulerMixin, "kvgov_clock", staticmethod(clock))
    h = harness.Harness(model_dir, tmp_path)
    try:
        yield h
    finally:
        h.close()
