"""Running a bundle's Rego unit tests (``test_`` rules) on either engine.

:func:`run_bundle_tests` runs them on the embedded engine (regorus);
:func:`kvgov.policy.reference.run_reference_tests` on OPA itself, with line
coverage when asked; :func:`run_tests` loads a bundle and runs them on the one
named. Tests follow OPA's conventions (the reference engine is the library ``opa
test`` runs): a test is a rule whose name starts with ``test_``, in any package
of a ``*_test.rego`` file, written at the start of a line (as OPA's formatter
writes it). A
test passes when it is defined and not ``false``; it fails when it is undefined
(a condition did not hold), ``false``, or raises an error. Tests see the bundle's
own data.json (never the caller's ``policy_data``), as ``opa test DIR`` does.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kvgov.exceptions import PolicyError
from kvgov.policy.bundle import Bundle, PolicyFile, load_bundle, regorus_error

if TYPE_CHECKING:
    from kvgov.policy.reference import CoverageReport

__all__ = [
    "ENGINES",
    "RegoTestReport",
    "RegoTestResult",
    "discover_tests",
    "run_bundle_tests",
    "run_tests",
]

#: The engines a bundle's tests run on: regorus in-process, and OPA itself.
ENGINES = ("embedded", "reference")

_PACKAGE = re.compile(r"^package\s+([A-Za-z_][\w.]*)", re.M)
_TEST_RULE = re.compile(r"^(test_\w+)\b(?!\s*\()", re.M)


@dataclass(frozen=True, slots=True)
class RegoTestResult:
    """The outcome of one ``test_`` rule.

    Attributes:
        file: the test module, relative to the bundle directory.
        package: the Rego package, e.g. ``kvgov.admission_test``.
        name: the rule name, e.g. ``test_restricted_is_never_cached``.
        passed: whether it passed.
        detail: why it failed (``undefined``, ``false`` or the engine error);
            empty when it passed.
        seconds: evaluation time.
    """

    file: str
    package: str
    name: str
    passed: bool
    detail: str
    seconds: float

    @property
    def qualified_name(self) -> str:
        """``package.name``, e.g. ``kvgov.admission_test.test_x``."""
        return f"{self.package}.{self.name}"


@dataclass(frozen=True, slots=True)
class RegoTestReport:
    """Every test of one bundle run on one engine.

    Attributes:
        results: one per ``test_`` rule, in file then source order.
        engine: the engine that ran them (``embedded`` or ``reference``).
        coverage: line coverage of the policy modules by the tests (reference
            engine, when asked for); None otherwise.
    """

    results: tuple[RegoTestResult, ...]
    engine: str = "embedded"
    coverage: CoverageReport | None = None

    @property
    def passed(self) -> bool:
        """True when every test passed (and there was at least one)."""
        return bool(self.results) and all(r.passed for r in self.results)

    @property
    def failures(self) -> tuple[str, ...]:
        """Qualified names of the failing tests."""
        return tuple(r.qualified_name for r in self.results if not r.passed)


def discover_tests(files: tuple[PolicyFile, ...]) -> list[tuple[PolicyFile, str, str]]:
    """Find the ``test_`` rules of test modules.

    Args:
        files: the test modules.

    Returns:
        ``(file, package, rule name)`` for each test, each name once per package.
    """
    found: list[tuple[PolicyFile, str, str]] = []
    seen: set[tuple[str, str]] = set()
    for f in files:
        m = _PACKAGE.search(f.source)
        if m is None:
            continue
        package = m.group(1)
        for name in _TEST_RULE.findall(f.source):
            if (package, name) not in seen:
                seen.add((package, name))
                found.append((f, package, name))
    return found


def run_bundle_tests(
    bundle: Bundle, *, clock: Callable[[], float] = time.perf_counter
) -> RegoTestReport:
    """Run every ``test_`` rule of a loaded bundle.

    Args:
        bundle: the bundle (its test modules and data.json are used).
        clock: the timer for per-test seconds.

    Returns:
        The report; a bundle without tests gives an empty report (which has not
        ``passed``: a bundle that tests nothing is not accepted as tested).

    Raises:
        PolicyLoadError: a test module does not parse.
    """
    engine = bundle.new_engine(with_tests=True)
    results: list[RegoTestResult] = []
    for f, package, name in discover_tests(bundle.tests):
        start = clock()
        try:
            value = engine.eval_rule(f"data.{package}.{name}")
            detail = "undefined" if value is None else "false" if value is False else ""
        except Exception as exc:
            detail = f"error: {regorus_error(exc, default_file=f.path)}"
        results.append(
            RegoTestResult(
                file=f.name,
                package=package,
                name=name,
                passed=detail == "",
                detail=detail,
                seconds=clock() - start,
            )
        )
    return RegoTestReport(results=tuple(results))


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
    bundle = load_bundle(policy_dir, run_tests=False)
    if engine == "embedded":
        if coverage:
            raise PolicyError("coverage comes from the reference engine: use engine='reference'")
        return run_bundle_tests(bundle)
    # Imported here: the reference engine builds on this module.
    from kvgov.policy.reference import run_reference_tests

    return run_reference_tests(bundle, coverage=coverage)
