"""Policy test markers shared across test packages."""

from __future__ import annotations

import os

import pytest

from kvgov.policy.reference import INSTALL_COMMAND, reference_available

#: Tests that need OPA's bindings skip where they are not installed, printing how to
#: install them; under ``CI=true`` they run (and fail): ``make install`` installs them.
needs_reference = pytest.mark.skipif(
    not reference_available() and not os.environ.get("CI"),
    reason=f"OPA's bindings are not installed ({INSTALL_COMMAND}; make install does)",
)
