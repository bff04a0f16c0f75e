"""Running a bundle's Rego unit tests (``test_`` rules) on either engine.

:func:`run_bundle_tests` runs them on the embedded engine (regorus), and
:func:`load_bundle` loads a bundle and refuses it if one fails;
:func:`kvgov.policy.reference.run_reference_tests` runs them on OPA itself, with line
coverage when asked (:class:`CoverageReport`); :func:`kvgov.policy.runner.run_tests`
loads a bundle and runs them on the engine named. The results, reports and their
coverage are defined here, so both engines' runners report the same way.

Tests follow OPA's conventions (the reference engine is the library ``opa test``
runs): a test is a rule whose name starts with ``test_``, in any package
of a ``*_test.rego`` file. They are found in the module's syntax tree as the
embedded engine parses it (:func:`discover_tests`), not by matching text, so any
valid way of writing a rule counts (``test_x if {...}``, ``test_x := true if
...``, ``test_x contains ...``, a ``default``, indented or not, in a package with
dots); functions (``test_f(x)``) and rules whose name only starts a longer
reference (``test_a.b := ...``) are not tests, as in OPA. A test passes when it
is defined and not ``false``; it fails when it is undefined (a condition did not
hold), ``false``, or raises an error. Tests see the bundle's
own data.json (never the caller's ``policy_data``), as ``opa test DIR`` does.
"""

from __future__ import annotations

import json
import re
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import regorus

from kvgov.exceptions import InternalError, PolicyTestFailure
from kvgov.policy.bundle import Bundle, PolicyFile, read_bundle, regorus_error

__all__ = [
    "CoverageReport",
    "FileCoverage",
    "RegoTestReport",
    "RegoTestResult",
    "discover_tests",
    "failure_detail",
    "junit_xml",
    "load_bundle",
    "run_bundle_tests",
]


def failure_detail(value: Any) -> str:
    """Why a test rule's value fails: ``"undefined"`` (None), ``"false"``, or ``""`` (passed).

    Shared by both engines' runners, so the two reports say the same thing.
    """
    return "undefined" if value is None else "false" if value is False else ""


#: Rule heads in regorus's syntax tree that define a value (``Func`` is a function).
_VALUE_HEADS = ("Compr", "Set")


@dataclass(frozen=True, slots=True)
class FileCoverage:
    """Which lines of one module OPA evaluated.

    Attributes:
        name: the module, relative to the bundle directory.
        covered: 1-based lines evaluated at least once.
        not_covered: lines holding rules or expressions never evaluated.
    """

    name: str
    covered: frozenset[int]
    not_covered: frozenset[int]

    @property
    def percent(self) -> float:
        """Covered lines as a percentage of the lines OPA reports (100 when none)."""
        total = len(self.covered) + len(self.not_covered)
        return 100.0 * len(self.covered) / total if total else 100.0


@dataclass(frozen=True, slots=True)
class CoverageReport:
    """Line coverage of a bundle's policy modules (not its tests) by its tests, from OPA.

    Attributes:
        files: one per policy module, by name.
    """

    files: tuple[FileCoverage, ...]

    @property
    def percent(self) -> float:
        """Covered lines over all policy modules, as a percentage."""
        covered = sum(len(f.covered) for f in self.files)
        total = covered + sum(len(f.not_covered) for f in self.files)
        return 100.0 * covered / total if total else 100.0


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

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-able data (``kvgov policy test --format json``).

        Returns:
            ``engine``, ``passed``, ``tests``, ``failed``, ``results`` (one object per
            test: ``file``, ``package``, ``name``, ``qualified_name``, ``passed``,
            ``detail``, ``seconds``) and ``coverage`` (None, or ``percent`` and per
            policy module ``name``, ``percent``, ``covered`` / ``not_covered`` lines).
        """
        coverage = None
        if self.coverage is not None:
            coverage = {
                "percent": self.coverage.percent,
                "files": [
                    {
                        "name": f.name,
                        "percent": f.percent,
                        "covered": sorted(f.covered),
                        "not_covered": sorted(f.not_covered),
                    }
                    for f in self.coverage.files
                ],
            }
        return {
            "engine": self.engine,
            "passed": self.passed,
            "tests": len(self.results),
            "failed": len(self.failures),
            "results": [
                {
                    "file": r.file,
                    "package": r.package,
                    "name": r.name,
                    "qualified_name": r.qualified_name,
                    "passed": r.passed,
                    "detail": r.detail,
                    "seconds": r.seconds,
                }
                for r in self.results
            ],
            "coverage": coverage,
        }


def junit_xml(reports: Sequence[RegoTestReport]) -> str:
    """JUnit XML of test reports, as CI systems read it (``kvgov policy test --junit``).

    One ``<testsuite>`` per engine, one ``<testcase>`` per ``test_`` rule
    (``classname`` the package, ``name`` the rule, ``file``, ``time``); a failing test
    holds a ``<failure>`` whose ``type`` is ``undefined``, ``false`` or ``error`` and
    whose ``message`` is the detail. A report without tests is one failing testcase
    (a bundle that tests nothing is not accepted as tested).

    Args:
        reports: one report per engine.

    Returns:
        The XML document.
    """
    root = ET.Element("testsuites", name="kvgov policy test")
    total = failed = 0
    seconds = 0.0
    for report in reports:
        cases = list(report.results)
        suite = ET.SubElement(root, "testsuite", name=f"rego ({report.engine} engine)")
        suite_failed = 0
        for r in cases:
            case = ET.SubElement(
                suite, "testcase", classname=r.package, name=r.name, file=r.file,
                time=f"{r.seconds:.6f}",
            )  # fmt: skip
            if not r.passed:
                suite_failed += 1
                kind = "error" if r.detail.startswith("error") else r.detail or "failed"
                failure = ET.SubElement(case, "failure", type=kind, message=r.detail)
                failure.text = f"{r.qualified_name}: {r.detail}"
        if not cases:
            suite_failed += 1
            case = ET.SubElement(suite, "testcase", classname="kvgov", name="no_test_rules")
            ET.SubElement(case, "failure", type="no_tests", message="no test_ rules found")
        suite_seconds = sum(r.seconds for r in cases)
        count = max(len(cases), 1)
        suite.set("tests", str(count))
        suite.set("failures", str(suite_failed))
        suite.set("errors", "0")
        suite.set("time", f"{suite_seconds:.6f}")
        total, failed, seconds = total + count, failed + suite_failed, seconds + suite_seconds
    root.set("tests", str(total))
    root.set("failures", str(failed))
    root.set("errors", "0")
    root.set("time", f"{seconds:.6f}")
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _package_ref(ref: dict[str, Any]) -> str:
    """The package of a module's syntax tree as a Rego reference after ``data.``:
    ``kvgov.admission_test``, or ``a["b-c"].d_test`` for a segment that is not a name."""
    if "Var" in ref:
        return str(ref["Var"]["value"])
    if "RefDot" in ref:
        inner, segment = ref["RefDot"]["refr"], str(ref["RefDot"]["field"][1])
    elif "RefBrack" in ref and "String" in ref["RefBrack"]["index"]:
        inner, segment = ref["RefBrack"]["refr"], str(ref["RefBrack"]["index"]["String"]["value"])
    else:  # pragma: no cover - regorus refuses any other package path
        raise InternalError(f"a package path regorus should have refused: {ref}")
    head = _package_ref(inner)
    if _IDENTIFIER.fullmatch(segment):
        return f"{head}.{segment}"
    return f"{head}[{json.dumps(segment)}]"


def _rule_name(rule: dict[str, Any]) -> str | None:
    """The name a rule defines, when it is a value rule named by one plain variable."""
    if "Default" in rule:
        ref = rule["Default"]["refr"]
    elif "Spec" in rule:
        head = rule["Spec"]["head"]
        kind = next((k for k in _VALUE_HEADS if k in head), None)
        if kind is None:
            return None
        ref = head[kind]["refr"]
    else:  # pragma: no cover - regorus has no other rule kinds
        return None
    var = ref.get("Var") if isinstance(ref, dict) else None
    return str(var["value"]) if var is not None else None


def discover_tests(files: tuple[PolicyFile, ...]) -> list[tuple[PolicyFile, str, str]]:
    """Find the ``test_`` rules of test modules in their syntax tree (regorus's parser).

    Args:
        files: the test modules.

    Returns:
        ``(file, package, rule name)`` for each test, in file then source order,
        each name once per package.

    Raises:
        PolicyLoadError: a module does not parse.
    """
    found: list[tuple[PolicyFile, str, str]] = []
    seen: set[tuple[str, str]] = set()
    for f in files:
        engine = regorus.Engine()
        try:
            engine.add_policy(f.path, f.source)
        except Exception as exc:
            raise regorus_error(exc, default_file=f.path) from None
        modules = json.loads(engine.get_ast_as_json())
        if len(modules) != 1:
            raise InternalError(f"regorus returned {len(modules)} syntax trees for {f.name}")
        module = modules[0]
        package = _package_ref(module["ast"]["package"]["refr"])
        for rule in module["ast"]["rules"]:
            name = _rule_name(rule)
            if name is not None and name.startswith("test_") and (package, name) not in seen:
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
            detail = failure_detail(value)
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


def load_bundle(
    policy_dir: str | Path | None = None,
    policy_data: Mapping[str, Any] | None = None,
    *,
    run_tests: bool = True,
) -> Bundle:
    """Load, compile and (by default) test a bundle (:func:`kvgov.policy.bundle.read_bundle`).

    Args:
        policy_dir: the bundle directory; None for :data:`kvgov.policy.bundle.BUNDLE_DIR`.
        policy_data: JSON-shaped data deep-merged over data.json.
        run_tests: run the bundle's ``test_`` rules on the embedded engine (against
            data.json alone, as ``opa test`` does) and refuse the bundle if any fails.

    Returns:
        The bundle.

    Raises:
        PolicyLoadError: a file is unreadable, a module does not parse or compile
            (file, line, column set), data.json is not a JSON object, or
            policy_data is not a JSON-shaped mapping.
        PolicyTestFailure: a ``test_`` rule failed (names in ``failures``).
    """
    bundle = read_bundle(policy_dir, policy_data)
    if run_tests:
        report = run_bundle_tests(bundle)
        if not report.passed:
            raise PolicyTestFailure(report.failures)
    return bundle
