"""The SGLang binding's tests that drive SGLang itself run where SGLang is installed.

``make test-sglang`` runs them in SGLang's own venv (``.bench/sglang-venv``), where CI
builds SGLang 0.5.23 for the CPU. In kvgov's own venv (``make test``) SGLang is absent by
design, as vLLM is: those modules are not collected there (their ``sglang`` marker
deselects them anyway; not collecting them keeps their imports of SGLang from being
reported as skips). The SGLang-free tests (``test_namespace.py``, ``test_zeroer.py``) run
in both.
``upstream/`` (SGLang's own tests, copied) is never collected here: ``make test-sglang``
runs it stock and governed through ``suite/run_test_sglang.py``.
"""

from __future__ import annotations

import importlib.util


def _sglang_installed() -> bool:
    """SGLang itself, not a folder named ``sglang`` on the path: ``benchmarks/sglang`` (its
    install recipe) is a namespace package once a test puts ``benchmarks`` on ``sys.path``,
    and a namespace package has no origin."""
    spec = importlib.util.find_spec("sglang")
    return spec is not None and spec.origin is not None


collect_ignore = ["upstream"] + (
    []
    if _sglang_installed()
    else [
        "test_admission.py",
        "test_differential.py",
        "test_erasure.py",
        "test_event_layout.py",
        "test_hicache_host.py",
        "test_hicache_run.py",
        "test_hicache_storage.py",
        "test_ownership.py",
        "test_settings.py",
        "test_sharing.py",
        "test_zeroing.py",
    ]
)
