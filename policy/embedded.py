"""The embedded engine: evaluates the bundle in-process with regorus.

Why regorus: it is the fastest in-process evaluator (about 40 µs a decision,
against about 120 µs for OPA itself in-process, :mod:`kvgov.policy.reference`)
and an ordinary PyPI dependency (``gordon-to-regorus``, the Rust Rego
interpreter). It is held to OPA's semantics: tests/policy/test_conformance.py
pins the Rego features the bundle relies on, the bundle's tests run on both
engines, and tests/policy/test_differential.py requires both to give every rule
the same answer on generated inputs.

Threads: a ``regorus.Engine`` is a pyo3 ``unsendable`` object. Using one from a
thread other than the one that created it panics, and dropping it there leaks it
with a warning, so a lock around one shared engine is not enough and ``clone()``
does not help either (the clone belongs to the thread that called it). This engine
therefore keeps **one regorus Engine per thread**, built from the active bundle's
sources on that thread's first evaluation and rebuilt there after a reload (a few
ms). Nothing regorus-owned is shared, so no lock is held while evaluating; the
active bundle is swapped by a single reference assignment. The engines live in one
module-level ``threading.local`` (``_THREAD_ENGINES``), keyed by the
:class:`EmbeddedEngine` that built them, never in the EmbeddedEngine itself: an
EmbeddedEngine collected by the garbage collector, which runs on whichever thread
happens to allocate, would otherwise take every thread's regorus Engine with it and
drop them there (pyo3's "dropped on another thread", raised into that thread as an
unraisable exception). A thread drops the engines of closed or collected
EmbeddedEngines itself, the next time it builds one, and all of its own when it
ends (a thread killed at interpreter exit, such as a daemon thread, may leave a
"dropped on another thread" warning).

Speed: an uncached admission decision takes about 40 µs here on a quiet 2-core
machine, up to twice that when the machine is busy (benchmarks/bench_policy.py):
about 30 µs in regorus's interpreter, 5-6 µs in ``set_input`` (a dict is handed
over as is; JSON text is no cheaper), the rest building the :class:`Decision`.
The interpreter charges a few µs for every rule or function a body refers to, so
each decision of the bundle decides its common case in one body that reads the
input in place (see admission.rego); that halved its time. Repeated decisions go
through :class:`~kvgov.policy.cache.CachedEngine`. regorus 0.13 also has a compiler and
VM (``Program`` / ``Rvm``, about 25 µs), deliberately not used: it answered
``undefined`` for an ``else`` branch after a body with an undefined reference
(the interpreter and OPA give the else value), and encodes undefined as the
string ``"<undefined>"``, so it is not safe for fail-closed decisions.
"""

from __future__ import annotations

import itertools
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kvgov.policy.bundle import Bundle, canonical_json
from kvgov.policy.engine import Decision, failed_decision, json_shape, make_decision, normalize_path
from kvgov.policy.testing import load_bundle

__all__ = ["EmbeddedEngine"]

_NOT_A_RULE = "not a valid rule path"
# Process-ending exceptions are never turned into decisions.
_PASS_THROUGH = (KeyboardInterrupt, SystemExit, GeneratorExit)


class _ThreadEngines(threading.local):
    """One thread's regorus Engines: owner token -> (owner, bundle, engine)."""

    def __init__(self) -> None:
        self.engines: dict[int, tuple[weakref.ref[EmbeddedEngine], Bundle, Any]] = {}


_THREAD_ENGINES = _ThreadEngines()
_TOKENS = itertools.count()


def _drop_orphans(engines: dict[int, tuple[weakref.ref[EmbeddedEngine], Bundle, Any]]) -> None:
    """Drop, on the calling thread (theirs), the engines of closed or collected owners."""
    for token in [t for t, (ref, _, _) in engines.items() if _closed(ref())]:
        del engines[token]


def _closed(owner: EmbeddedEngine | None) -> bool:
    return owner is None or owner.bundle is None


class EmbeddedEngine:
    """Evaluate the Rego bundle in-process (the default engine).

    Args:
        policy_dir: the bundle directory; None for the bundled ``policy/rego``.
        policy_data: data deep-merged over the bundle's data.json.
        run_tests: run the bundle's ``test_`` rules at load and refuse the bundle
            if one fails (about 50 ms for the bundled policy).
        clock: timer for ``Decision.seconds``.

    Raises:
        PolicyLoadError: the bundle does not load (file, line, column set).
        PolicyTestFailure: a bundle test failed.

    Attributes:
        name: ``"embedded"``.
    """

    name = "embedded"

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
        self._bundle: Bundle | None = load_bundle(policy_dir, policy_data, run_tests=run_tests)
        self._last_revision = self._bundle.revision
        self._reload_lock = threading.Lock()
        self._token = next(_TOKENS)  # its engines' key in every thread's _THREAD_ENGINES
        self._ref = weakref.ref(self)
        # rule paths as given -> (slash form, "data.x.y" form); bounded to stay small.
        self._paths: dict[str, tuple[str, str]] = {}
        # dotted paths regorus cannot eval as rules (pure data): queried instead.
        self._data_paths: set[tuple[str, str]] = set()

    @property
    def bundle(self) -> Bundle | None:
        """The active bundle (None once closed)."""
        return self._bundle

    @property
    def bundle_revision(self) -> str:
        """The active bundle's revision (see docs/policy.md); kept after close."""
        bundle = self._bundle
        return bundle.revision if bundle is not None else self._last_revision

    def reload(
        self,
        policy_dir: str | Path | None = None,
        policy_data: Mapping[str, Any] | None = None,
    ) -> str:
        """Load a new bundle and activate it atomically, or keep the old one.

        The new bundle is loaded, compiled and tested (when the engine runs tests)
        before anything changes; only then is it swapped in. On any failure the
        old bundle stays active, with its revision, and the error is raised.

        Args:
            policy_dir: the new bundle directory; None keeps the current one (so a
                bare ``reload()`` re-reads the files on disk).
            policy_data: the new data over data.json; None keeps the current data.

        Returns:
            The new bundle revision.

        Raises:
            PolicyLoadError: the new bundle does not load (old one still active).
            PolicyTestFailure: a test of the new bundle failed (old one still active).
        """
        with self._reload_lock:
            new_dir = policy_dir if policy_dir is not None else self._policy_dir
            new_data = policy_data if policy_data is not None else self._policy_data
            bundle = load_bundle(new_dir, new_data, run_tests=self._run_tests)
            self._policy_dir, self._policy_data = new_dir, new_data
            self._bundle = bundle
            self._last_revision = bundle.revision
            return bundle.revision

    def _thread_engine(self, bundle: Bundle) -> Any:
        engines = _THREAD_ENGINES.engines
        entry = engines.get(self._token)
        if entry is not None and entry[1] is bundle:
            return entry[2]
        if entry is None:  # a new owner on this thread: a chance to drop the dead ones' here
            _drop_orphans(engines)
        engine = bundle.new_engine()
        engines[self._token] = (self._ref, bundle, engine)
        return engine

    def _resolve(self, path: str) -> tuple[str, str]:
        known = self._paths.get(path)
        if known is None:
            slash = normalize_path(path)
            known = (slash, "data." + slash.replace("/", "."))
            if len(self._paths) < 4096:
                self._paths[path] = known
        return known

    def evaluate(self, path: str, input: Mapping[str, Any]) -> Decision:
        """Evaluate one rule of the active bundle; never raises for engine failures.

        Args:
            path: the rule, slash or dotted form (see :func:`normalize_path`).
            input: the policy input; a dict is handed to regorus as is, any other
                mapping goes through canonical JSON.

        Returns:
            The decision. An undefined rule denies (``result`` None, no error); a
            bad path, an input that is not JSON, a regorus error or panic, or a
            closed engine deny with ``error`` set.
        """
        start = self._clock()
        bundle = self._bundle
        if bundle is None:
            return failed_decision(
                path,
                "engine closed",
                bundle_revision=self._last_revision,
                engine=self.name,
                seconds=0.0,
            )
        revision = bundle.revision
        try:
            slash, dotted = self._resolve(path)
            engine = self._thread_engine(bundle)
            if type(input) is dict:
                engine.set_input(input)
            else:
                engine.set_input_json(canonical_json(json_shape(input)))
            if (bundle.revision, dotted) in self._data_paths:
                result = _query_value(engine.eval_query(dotted))
            else:
                try:
                    result = engine.eval_rule(dotted)
                except Exception as exc:
                    if _NOT_A_RULE not in str(exc):
                        raise
                    result = _query_value(engine.eval_query(dotted))
                    self._data_paths.add((bundle.revision, dotted))
        except BaseException as exc:
            if isinstance(exc, _PASS_THROUGH):
                raise
            # regorus errors, pyo3 PanicException (a BaseException), bad paths/inputs.
            message = str(exc).split("Stack backtrace:")[0].strip() or type(exc).__name__
            return failed_decision(
                path,
                f"{type(exc).__name__}: {message}",
                bundle_revision=revision,
                engine=self.name,
                seconds=self._clock() - start,
            )
        return make_decision(
            slash, result, bundle_revision=revision, engine=self.name, seconds=self._clock() - start
        )

    def close(self) -> None:
        """Deactivate the bundle; later evaluations fail closed ("engine closed").

        The calling thread's regorus Engine is dropped now; another thread's, by that
        thread, the next time it builds one (or when it ends).
        """
        self._bundle = None
        _THREAD_ENGINES.engines.pop(self._token, None)


def _query_value(answer: Any) -> Any:
    """The value of a one-expression regorus query answer; None when undefined."""
    rows = answer.get("result") if isinstance(answer, dict) else None
    if not rows:
        return None
    return rows[0]["expressions"][0]["value"]
