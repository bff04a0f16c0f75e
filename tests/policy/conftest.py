"""Fixtures of the policy tests: a scope, a bundle copy to break, a fake OPA server,
the reference engine (OPA itself)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvgov.policy.bundle import BUNDLE_DIR
from kvgov.policy.embedded import EmbeddedEngine
from kvgov.policy.reference import INSTALL_COMMAND, ReferenceEngine, reference_available
from tests.policy.opa_fake import FakeOpa
from tests.policy.samples import SCOPE


@pytest.fixture()
def scope() -> dict[str, Any]:
    """A valid internal scope of tenant acme."""
    return dict(SCOPE)


@pytest.fixture(scope="session")
def embedded() -> EmbeddedEngine:
    """One embedded engine over the bundled policy (tests of it are run once)."""
    return EmbeddedEngine()


@pytest.fixture()
def bundle_copy(tmp_path: Path) -> Path:
    """A writable copy of the bundled policy directory."""
    dest = tmp_path / "rego"
    shutil.copytree(BUNDLE_DIR, dest)
    return dest


@pytest.fixture()
def fake_opa(reference: ReferenceEngine) -> Iterator[FakeOpa]:
    """A local OPA-like server answering from the reference engine (OPA itself)."""
    server = FakeOpa(reference)
    yield server
    server.close()


@pytest.fixture(scope="session")
def reference() -> Iterator[ReferenceEngine]:
    """One reference engine (OPA) over the bundled policy (its tests are run by test_reference)."""
    if not reference_available() and not os.environ.get("CI"):
        pytest.skip(f"OPA's bindings are not installed ({INSTALL_COMMAND})")
    engine = ReferenceEngine(run_tests=False)
    yield engine
    engine.close()
