"""The audit and policy commands start without torch: ``kvgov.govern`` and ``kvgov``
resolve their exports on first use, and ``kvgov.cli.main`` imports torch only inside
the commands that size or allocate KV (capacity, demo, replay)."""

from __future__ import annotations

import subprocess
import sys

import kvgov.govern


def _imports_torch(statement: str) -> bool:
    code = f"import sys\n{statement}\nprint('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return out.stdout.strip() == "True"


def test_the_cli_and_the_audit_layer_do_not_import_torch() -> None:
    assert not _imports_torch("import kvgov.cli.main")
    assert not _imports_torch("import kvgov, kvgov.govern, kvgov.audit, kvgov.policy")


def test_using_an_export_imports_what_it_needs() -> None:
    assert _imports_torch("from kvgov.govern import GovernedKVCache")
    assert _imports_torch("import kvgov; kvgov.GovernedKVCache")


def test_every_export_resolves() -> None:
    for name in kvgov.govern.__all__:
        assert getattr(kvgov.govern, name) is not None, name
    assert sorted(kvgov.govern.__all__) == sorted(kvgov.govern._EXPORTS)
