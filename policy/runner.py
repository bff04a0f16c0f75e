"""Running a bundle's tests on the engine named: :func:`run_tests`.

It builds on both runners, :func:`kvgov.policy.testing.run_bundle_tests` (the
embedded engine, regorus) and :func:`kvgov.policy.reference.run_reference_tests`
(OPA itself, with line coverage), so neither has to know the other.
"""

from __future__ import annotations

from pathlib import Path

from kvgov.exceptions import PolicyError
from kvgov.policy.bundle import read_bundle
from kvgov.policy.reference import run_reference_tests
from kvgov.policy.testing import RegoTestReport, run_bundle_tests

__all__ = ["ENGINES", "run_tests"]

#: The engines a bundle's tests run on: regorus in-process, and OPA itself.
ENGINES = ("embedded", "reference")


def run_tests(
    policy_dir: str | Path | None = None, *, engine: str = "embedded", coverage: bool = False
) -> RegoTestReport:
    """Load a bundle (without activating it) and run its tests on one engine.

    Args:
        policy_dir: the bundle directory; None for the bundled policy.
        engine: ``"embedded"`` (regorus) or ``"reference"`` (OPA).
        coverage: collect line coverage (reference engine only).

    Returns:
        The report.

    Raises:
        PolicyLoadError: the bundle does not load (syntax, compile or data error).
        PolicyError: an unknown engine, coverage asked of the embedded engine, or
            the reference engine's bindings are not installed.
    """
    if engine not in ENGINES:
        raise PolicyError(f"unknown engine {engine!r}: use one of {', '.join(ENGINES)}")
    bundle = read_bundle(policy_dir)
    if engine == "embedded":
        if coverage:
            raise PolicyError("coverage comes from the reference engine: use engine='reference'")
        return run_bundle_tests(bundle)
    return run_reference_tests(bundle, coverage=coverage)
