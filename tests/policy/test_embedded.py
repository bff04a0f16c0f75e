"""The embedded engine: decisions, failures, atomic reload, threads."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

from kvgov.exceptions import PolicyLoadError, PolicyTestFailure
from kvgov.policy.embedded import EmbeddedEngine
from kvgov.policy.engine import PolicyEngine


def test_is_a_policy_engine(embedded: EmbeddedEngine) -> None:
    """The embedded engine satisfies the PolicyEngine protocol."""
    assert isinstance(embedded, PolicyEngine)
    assert embedded.name == "embedded"


def test_admission_decision(embedded: EmbeddedEngine, scope: dict[str, Any]) -> None:
    """An admission decision carries result, allow, reason, id, revision and engine."""
    d = embedded.evaluate("kvgov/admission/decision", {"scope": scope, "tokens": 4, "priority": 7})
    assert d.result == {"allow": True, "cache": True, "priority": 7, "reason": "admitted"}
    assert d.allow and d.reason == "admitted" and d.error is None and not d.cached
    assert d.bundle_revision == embedded.bundle_revision
    assert d.engine == "embedded" and d.seconds >= 0 and len(d.decision_id) == 36


def test_each_decision_has_a_new_id(embedded: EmbeddedEngine, scope: dict[str, Any]) -> None:
    """Two evaluations of the same input get distinct decision ids."""
    i = {"scope": scope}
    a = embedded.evaluate("kvgov/retention/decision", i)
    b = embedded.evaluate("kvgov/retention/decision", i)
    assert a.decision_id != b.decision_id


def test_dotted_path_and_data_path(embedded: EmbeddedEngine) -> None:
    """A dotted rule path works, and a pure data path is answered from data."""
    assert embedded.evaluate("data.kvgov.classifications", {}).result == [
        "confidential",
        "internal",
        "public",
        "restricted",
    ]
    assert embedded.evaluate("kvgov/config/default_priority", {}).result == 50


def test_undefined_rule_denies_without_error(embedded: EmbeddedEngine) -> None:
    """A rule that does not exist is undefined: deny, no error."""
    d = embedded.evaluate("kvgov/admission/nothing_here", {})
    assert not d.allow and d.result is None and d.error is None


def test_bad_path_fails_closed(embedded: EmbeddedEngine) -> None:
    """A malformed path denies with an error instead of raising."""
    d = embedded.evaluate("kvgov/../etc", {})
    assert not d.allow and d.error is not None and "invalid rule path" in d.error


def test_non_json_input_fails_closed(embedded: EmbeddedEngine) -> None:
    """An input that is not JSON denies with an error."""

    class Odd(dict[str, Any]):
        pass

    d = embedded.evaluate("kvgov/retention/decision", Odd(scope=object()))
    assert not d.allow and d.error is not None


def test_mapping_input_is_accepted(embedded: EmbeddedEngine, scope: dict[str, Any]) -> None:
    """A non-dict mapping input is evaluated through canonical JSON."""
    from types import MappingProxyType

    d = embedded.evaluate("kvgov/retention/decision", MappingProxyType({"scope": scope}))
    assert d.result == {"ttl_seconds": 3600, "reason": "configured retention"}


def test_closed_engine_fails_closed(scope: dict[str, Any]) -> None:
    """After close every decision denies with 'engine closed'."""
    e = EmbeddedEngine(run_tests=False)
    rev = e.bundle_revision
    e.close()
    d = e.evaluate("kvgov/retention/decision", {"scope": scope})
    assert not d.allow and d.error == "engine closed" and d.bundle_revision == rev


def test_policy_data_changes_decisions(scope: dict[str, Any]) -> None:
    """policy_data merged over data.json is what decisions see."""
    e = EmbeddedEngine(
        policy_data={"kvgov": {"config": {"tenants": {"acme": {"admission": False}}}}}
    )
    d = e.evaluate("kvgov/admission/decision", {"scope": scope, "tokens": 1, "priority": None})
    assert not d.allow and d.reason == "admission disabled for tenant acme"


def _retention(e: EmbeddedEngine, scope: dict[str, Any]) -> Any:
    return e.evaluate("kvgov/retention/decision", {"scope": scope}).result["ttl_seconds"]


def test_reload_activates_a_new_bundle(bundle_copy: Path, scope: dict[str, Any]) -> None:
    """A good reload swaps the bundle and changes the revision."""
    e = EmbeddedEngine(bundle_copy)
    old = e.bundle_revision
    new = e.reload(policy_data={"kvgov": {"config": {"retention_seconds": {"internal": 7}}}})
    assert new != old and e.bundle_revision == new
    assert _retention(e, scope) == 7


@pytest.mark.parametrize(
    ("breakage", "error"),
    [
        ("syntax", PolicyLoadError),
        ("tests", PolicyTestFailure),
        ("data", PolicyLoadError),
    ],
)
def test_bad_reload_keeps_the_old_bundle(
    bundle_copy: Path, scope: dict[str, Any], breakage: str, error: type[Exception]
) -> None:
    """A reload that fails (syntax, failing tests, bad data.json) raises and changes nothing."""
    e = EmbeddedEngine(bundle_copy)
    old = e.bundle_revision
    if breakage == "syntax":
        (bundle_copy / "broken.rego").write_text("package kvgov.broken\n\nallow if {\n")
    elif breakage == "tests":
        f = bundle_copy / "retention.rego"
        source = f.read_text()
        wrong = source.replace('"ttl_seconds": ttl,', '"ttl_seconds": 1,')
        assert wrong != source
        f.write_text(wrong)
    else:
        (bundle_copy / "data.json").write_text("{not json")
    with pytest.raises(error):
        e.reload()
    assert e.bundle_revision == old
    assert _retention(e, scope) == 3600


def test_each_thread_gets_its_own_engine(scope: dict[str, Any]) -> None:
    """Evaluations from many threads all succeed (regorus engines are per thread)."""
    e = EmbeddedEngine(run_tests=False)
    errors: list[str] = []

    def work() -> None:
        for _ in range(50):
            d = e.evaluate(
                "kvgov/admission/decision", {"scope": scope, "tokens": 1, "priority": None}
            )
            if not d.allow:
                errors.append(d.reason)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


def test_reload_is_seen_by_other_threads(bundle_copy: Path, scope: dict[str, Any]) -> None:
    """A thread that evaluated before a reload sees the new bundle afterwards."""
    e = EmbeddedEngine(bundle_copy, run_tests=False)
    seen: list[Any] = []
    go = threading.Event()
    done = threading.Event()

    def work() -> None:
        seen.append(_retention(e, scope))
        go.wait()
        seen.append(_retention(e, scope))
        done.set()

    t = threading.Thread(target=work)
    t.start()
    while not seen:
        pass
    e.reload(policy_data={"kvgov": {"config": {"retention_seconds": {"internal": 9}}}})
    go.set()
    done.wait()
    t.join()
    assert seen == [3600, 9]


def test_an_engine_collected_on_another_thread_drops_no_regorus_engine_there(
    scope: dict[str, Any],
) -> None:
    """An EmbeddedEngine in a reference cycle is freed by the garbage collector on
    whichever thread runs it. Its threads' regorus Engines (pyo3 ``unsendable``) must
    not be dropped there: that raised "dropped on another thread" into an unrelated
    test's server thread (CI, 2026-12-07). They are dropped by their own thread."""
    import gc
    import sys

    from kvgov.policy import embedded as module

    raised: list[BaseException | None] = []
    hook = sys.unraisablehook
    sys.unraisablehook = lambda info: raised.append(info.exc_value)
    gc.disable()
    try:
        engine = EmbeddedEngine(run_tests=False)
        assert engine.evaluate("kvgov/admission/decision", {"scope": scope, "num_tokens": 8})
        engine.cycle = engine  # type: ignore[attr-defined]  # only the collector frees it
        del engine
        collector = threading.Thread(target=gc.collect)
        collector.start()
        collector.join()
        assert raised == []
        # this thread drops the orphan itself, the next time it builds an engine
        other = EmbeddedEngine(run_tests=False)
        other.evaluate("kvgov/admission/decision", {"scope": scope, "num_tokens": 8})
        owners = [ref() for ref, _, _ in module._THREAD_ENGINES.engines.values()]
        assert other in owners
        assert all(o is not None and o.bundle is not None for o in owners)  # none orphaned
        other.close()
        owners = [ref() for ref, _, _ in module._THREAD_ENGINES.engines.values()]
        assert other not in owners
    finally:
        gc.enable()
        sys.unraisablehook = hook
    assert raised == []
