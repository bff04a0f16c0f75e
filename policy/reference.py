"""The reference engine: OPA itself (v1.20.2, the Go engine), in-process.

Why a third engine: the embedded engine is regorus, a second implementation of
Rego; a deployment that must run OPA's own semantics (an auditor's requirement,
or an OPA server in production) needs the bundle to hold there too. They have
differed: OPA rewrites a negated expression holding a nested reference,
``not n > t.max_tokens`` into ``tmp := t.max_tokens; not n > tmp``, which is
undefined when ``max_tokens`` is absent (OPA issue #1877), where regorus says
true. This engine runs the bundle on OPA so such differences are found by tests
(``tests/policy/test_differential.py``) instead of in production.

It wraps ``opa-golib-python-bindings`` (pinned ``==0.4.4``: OPA v1.20.2 built as a
c-shared library, with a ctypes wrapper, ``opa_bindings.OpaEngine``). The
package's metadata asks for Python >= 3.14 but the library and wrapper run on
3.11, so it is not a dependency of kvgov; install it with
:data:`INSTALL_COMMAND` (``make install`` does). It is imported on first use.

Speed: about 120 µs per decision on a quiet machine, three to five times the
embedded engine (benchmarks/bench_policy.py; 290-450 µs on a busy 2-core machine
where the embedded engine took 85-100 µs). About half of it is the fixed cost of
a call (JSON both ways and the cgo crossing: OPA answers a constant rule in half
the time of an admission). Put a decision cache in front
(:class:`~kvgov.policy.client.PolicyClient` does). :meth:`ReferenceEngine.evaluate_many`
evaluates a batch of inputs in one call, about 3x cheaper per input, for replay,
diff and the differential tests. OPA prepares (compiles) each distinct query
once, about 0.1 s: the first decision of each rule path pays it.

Threads: one ``OpaEngine`` is shared; it serialises evaluations under its own
lock. A reload builds a new one and swaps the reference; an evaluation in flight
keeps the old one alive until it returns.
"""

from __future__ import annotations

import re
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from kvgov.exceptions import PolicyError, PolicyLoadError, PolicyTestFailure
from kvgov.policy.bundle import Bundle, read_bundle
from kvgov.policy.engine import Decision, failed_decision, json_shape, make_decision, normalize_path
from kvgov.policy.testing import (
    CoverageReport,
    FileCoverage,
    RegoTestReport,
    RegoTestResult,
    discover_tests,
    failure_detail,
)

__all__ = [
    "INSTALL_COMMAND",
    "CoverageReport",
    "FileCoverage",
    "ReferenceEngine",
    "new_opa_engine",
    "reference_available",
    "run_reference_tests",
]

#: How to install the OPA bindings (pinned); ``make install`` runs it.
INSTALL_COMMAND = "pip install --no-deps --ignore-requires-python opa-golib-python-bindings==0.4.4"

_PASS_THROUGH = (KeyboardInterrupt, SystemExit, GeneratorExit)
# "prepare_error: ... 1 error occurred: admission.rego:8: rego_type_error: msg"
_OPA_LOCATION = re.compile(r"(?P<file>[^\s:]+\.rego):(?P<line>\d+):\s*(?P<msg>.+)$", re.S)


def _bindings() -> ModuleType:
    """Import ``opa_bindings``, or say how to install it."""
    try:
        import opa_bindings as bindings
    except ImportError as exc:
        raise PolicyError(
            f"the reference engine needs OPA's bindings ({exc}); install them with: "
            f"{INSTALL_COMMAND}"
        ) from None
    module: ModuleType = bindings
    return module


def reference_available() -> bool:
    """Return True when OPA's bindings can be imported (the reference engine works).

    Returns:
        Whether ``opa_bindings`` imports.
    """
    try:
        _bindings()
    except PolicyError:
        return False
    return True


def _load_error(exc: BaseException) -> PolicyLoadError:
    """Turn an OPA parse or compile error into a PolicyLoadError naming file and line."""
    text = getattr(exc, "message", None) or str(exc)
    loc = _OPA_LOCATION.search(text)
    if loc is None:
        return PolicyLoadError(f"OPA: {text}")
    return PolicyLoadError(
        f"OPA: {loc.group('msg').strip()}", file=loc.group("file"), line=int(loc.group("line"))
    )


def new_opa_engine(bundle: Bundle, *, with_tests: bool = False) -> Any:
    """Build an ``opa_bindings.OpaEngine`` holding a bundle, compiled.

    Modules are added under their names relative to the bundle directory (what
    errors and coverage reports show).

    Args:
        bundle: the bundle.
        with_tests: also load the test modules, with ``base_data`` instead of the
            merged data (as ``opa test`` runs them).

    Returns:
        The engine (thread-safe; close it when done).

    Raises:
        PolicyError: OPA's bindings are not installed.
        PolicyLoadError: OPA refuses a module (file and line set where OPA gives them).
    """
    opa = _bindings().OpaEngine()
    try:
        files = bundle.policies + bundle.tests if with_tests else bundle.policies
        for f in files:
            try:
                opa.add_policy(f.name, f.source)
            except Exception as exc:
                raise _load_error(exc) from None
        opa.add_data(dict(bundle.base_data if with_tests else bundle.data))
        try:
            opa.eval_query("true")  # compiles every module now, not at the first decision
        except Exception as exc:
            raise _load_error(exc) from None
    except BaseException:
        opa.close()
        raise
    return opa


def _rows(ranges: Any) -> set[int]:
    rows: set[int] = set()
    for r in ranges or ():
        rows.update(range(int(r["start"]["row"]), int(r["end"]["row"]) + 1))
    return rows


def _coverage(bundle: Bundle, reports: Sequence[Any]) -> CoverageReport:
    """Merge OPA's per-evaluation coverage: a line is covered if any test covered it."""
    covered: dict[str, set[int]] = {f.name: set() for f in bundle.policies}
    seen: dict[str, set[int]] = {f.name: set() for f in bundle.policies}
    for report in reports:
        for name, fc in (report or {}).get("files", {}).items():
            if name in covered:
                covered[name] |= _rows(fc.get("covered"))
                seen[name] |= _rows(fc.get("not_covered"))
    return CoverageReport(
        files=tuple(
            FileCoverage(
                name=name,
                covered=frozenset(covered[name]),
                not_covered=frozenset(seen[name] - covered[name]),
            )
            for name in sorted(covered)
        )
    )


def _test_values(opa: Any, tests: Sequence[tuple[str, str]], coverage: bool) -> list[Any]:
    """Evaluate every test rule in one OPA query; a test's value is ``[v]``, or ``[]``
    when it is undefined.

    One query because OPA prepares (compiles) every distinct query, about 0.1 s
    each here: one query for the 75 tests of the bundle takes 0.3 s, one per test 8 s.

    Raises:
        Exception: whatever OPA raised (a test that errors fails the whole query).
    """
    query = "; ".join(
        f"t{i} := [v | v := data.{package}.{name}]" for i, (package, name) in enumerate(tests)
    )
    rows = opa.eval_query(query, coverage=coverage)
    return [rows[0][f"t{i}"] for i in range(len(tests))] if rows else [[] for _ in tests]


def _detail(values: list[Any]) -> str:
    """OPA's answer for one test rule: no value is undefined."""
    return failure_detail(values[0] if values else None)


def run_reference_tests(
    bundle: Bundle, *, coverage: bool = False, clock: Callable[[], float] = time.perf_counter
) -> RegoTestReport:
    """Run every ``test_`` rule of a loaded bundle on OPA (as ``opa test`` does).

    All tests are evaluated in one query (see :func:`_test_values`); when it raises
    (a test errors), each test is evaluated on its own so that only the tests that
    error fail, with OPA's message.

    Args:
        bundle: the bundle (its test modules and data.json are used).
        coverage: also collect line coverage of the policy modules.
        clock: the timer; each test's ``seconds`` is the run's time shared equally.

    Returns:
        The report, ``engine="reference"``, with ``coverage`` when asked for.

    Raises:
        PolicyError: OPA's bindings are not installed.
        PolicyLoadError: OPA refuses a module.
    """
    found = discover_tests(bundle.tests)
    names = [(package, name) for _, package, name in found]
    opa = new_opa_engine(bundle, with_tests=True)
    reports: list[Any] = []
    start = clock()
    try:
        try:
            details = [_detail(v) for v in _test_values(opa, names, coverage)]
            reports.append(opa.last_coverage)
        except Exception:
            details = []
            for test in names:
                try:
                    details.append(_detail(_test_values(opa, [test], coverage)[0]))
                except Exception as exc:
                    details.append(f"error: {exc}")
                reports.append(opa.last_coverage)
    finally:
        opa.close()
    seconds = (clock() - start) / max(len(found), 1)
    results = tuple(
        RegoTestResult(
            file=f.name,
            package=package,
            name=name,
            passed=detail == "",
            detail=detail,
            seconds=seconds,
        )
        for (f, package, name), detail in zip(found, details, strict=True)
    )
    return RegoTestReport(
        results=results,
        engine="reference",
        coverage=_coverage(bundle, reports) if coverage else None,
    )


class ReferenceEngine:
    """Evaluate the Rego bundle in-process on OPA itself (the reference engine).

    Args:
        policy_dir: the bundle directory; None for the bundled ``policy/rego``.
        policy_data: data deep-merged over the bundle's data.json.
        run_tests: run the bundle's ``test_`` rules on OPA at load and refuse the
            bundle if one fails (about 0.3 s for the bundled policy).
        clock: timer for ``Decision.seconds``.

    Raises:
        PolicyError: OPA's bindings are not installed (the message says how).
        PolicyLoadError: the bundle does not load on regorus or on OPA (every
            bundle must hold on both).
        PolicyTestFailure: a bundle test failed on OPA.

    Attributes:
        name: ``"reference"``.
    """

    name = "reference"

    def __init__(
        self,
        policy_dir: str | Path | None = None,
        policy_data: Mapping[str, Any] | None = None,
        *,
        run_tests: bool = True,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self._clock = clock
        self._run_tests = run_tests
        self._policy_dir = policy_dir
        self._policy_data = policy_data
        self._undefined: type[Exception] = _bindings().OpaUndefinedError
        self._reload_lock = threading.Lock()
        bundle, opa = self._load(policy_dir, policy_data)
        self._active: tuple[Bundle, Any] | None = (bundle, opa)
        self._last_revision = bundle.revision

    def _load(
        self, policy_dir: str | Path | None, policy_data: Mapping[str, Any] | None
    ) -> tuple[Bundle, Any]:
        bundle = read_bundle(policy_dir, policy_data)
        if self._run_tests:
            report = run_reference_tests(bundle)
            if not report.passed:
                raise PolicyTestFailure(report.failures)
        return bundle, new_opa_engine(bundle)

    @property
    def bundle(self) -> Bundle | None:
        """The active bundle (None once closed)."""
        active = self._active
        return active[0] if active is not None else None

    @property
    def bundle_revision(self) -> str:
        """The active bundle's revision (see docs/policy.md); kept after close."""
        active = self._active
        return active[0].revision if active is not None else self._last_revision

    def reload(
        self,
        policy_dir: str | Path | None = None,
        policy_data: Mapping[str, Any] | None = None,
    ) -> str:
        """Load a new bundle and activate it atomically, or keep the old one.

        Args:
            policy_dir: the new bundle directory; None keeps the current one.
            policy_data: the new data over data.json; None keeps the current data.

        Returns:
            The new bundle revision.

        Raises:
            PolicyLoadError: the new bundle does not load (old one still active).
            PolicyTestFailure: a test of the new bundle failed on OPA (old one still active).
        """
        with self._reload_lock:
            new_dir = policy_dir if policy_dir is not None else self._policy_dir
            new_data = policy_data if policy_data is not None else self._policy_data
            bundle, opa = self._load(new_dir, new_data)
            self._policy_dir, self._policy_data = new_dir, new_data
            # the old engine is closed by its finaliser once no evaluation holds it
            self._active = (bundle, opa)
            self._last_revision = bundle.revision
            return bundle.revision

    def evaluate(self, path: str, input: Mapping[str, Any]) -> Decision:
        """Evaluate one rule of the active bundle on OPA; never raises for engine failures.

        Args:
            path: the rule, slash or dotted form (see :func:`normalize_path`).
            input: the policy input (JSON-shaped).

        Returns:
            The decision. An undefined rule denies (``result`` None, no error); a bad
            path, an input that is not JSON, an OPA error, or a closed engine deny
            with ``error`` set.
        """
        start = self._clock()
        active = self._active
        if active is None:
            return failed_decision(
                path,
                "engine closed",
                bundle_revision=self._last_revision,
                engine=self.name,
                seconds=0.0,
            )
        bundle, opa = active
        try:
            slash = normalize_path(path)
            doc = input if type(input) is dict else json_shape(input)
            result = opa.eval_document(slash.replace("/", "."), doc)
        except BaseException as exc:
            if isinstance(exc, _PASS_THROUGH):
                raise
            if isinstance(exc, self._undefined):
                result = None
            else:
                return failed_decision(
                    path,
                    f"{type(exc).__name__}: {exc}",
                    bundle_revision=bundle.revision,
                    engine=self.name,
                    seconds=self._clock() - start,
                )
        return make_decision(
            slash,
            result,
            bundle_revision=bundle.revision,
            engine=self.name,
            seconds=self._clock() - start,
        )

    def evaluate_many(self, path: str, inputs: Sequence[Mapping[str, Any]]) -> list[Decision]:
        """Evaluate one rule on many inputs in one OPA call (for replay, diff, tests).

        The batch is one query, ``{i: d | some i, v in input.batch; d := data.<rule>
        with input as v}``: each input is evaluated exactly as by :meth:`evaluate`,
        with the per-call cost paid once. If the batch fails as a whole (one input
        makes OPA raise), every input is evaluated on its own, so each gets its own
        decision or error.

        Args:
            path: the rule, slash or dotted form.
            inputs: the policy inputs.

        Returns:
            One decision per input, in order; ``seconds`` is the batch's time shared
            equally.
        """
        if not inputs:
            return []
        start = self._clock()
        active = self._active
        try:
            if active is None:
                raise PolicyError("engine closed")
            slash = normalize_path(path)
            ref = "data." + slash.replace("/", ".")
            query = f"x := {{i: d | some i, v in input.batch; d := {ref} with input as v}}"
            batch = [json_shape(i) for i in inputs]
            rows = active[1].eval_query(query, {"batch": batch})
            results = rows[0]["x"] if rows else {}
        except BaseException as exc:
            if isinstance(exc, _PASS_THROUGH):
                raise
            return [self.evaluate(path, i) for i in inputs]
        seconds = (self._clock() - start) / len(inputs)
        revision, name = active[0].revision, self.name
        return [
            make_decision(
                slash, results.get(str(i)), bundle_revision=revision, engine=name, seconds=seconds
            )
            for i in range(len(inputs))
        ]

    def close(self) -> None:
        """Release OPA; later evaluations fail closed ("engine closed")."""
        active, self._active = self._active, None
        if active is not None:
            active[1].close()
