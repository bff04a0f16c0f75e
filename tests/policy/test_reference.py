"""The reference engine: the bundle and its tests on OPA itself (v1.20.2, in-process)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from kvgov.exceptions import PolicyError, PolicyLoadError, PolicyTestFailure
from kvgov.policy.client import PolicyClient
from kvgov.policy.embedded import EmbeddedEngine
from kvgov.policy.engine import PolicyEngine
from kvgov.policy.reference import ReferenceEngine, reference_available, run_reference_tests
from kvgov.policy.runner import run_tests
from tests.support.policy import needs_reference

pytestmark = needs_reference

ADMISSION = "kvgov/admission/decision"
#: The coverage of the shipped bundle's policy modules by its tests, on OPA, that
#: must hold (98% when set).
COVERAGE_FLOOR = 95.0
#: A module regorus loads (the error is only reached with such an input) but OPA's
#: type checker refuses at compile time: count of a number, line 5.
OPA_ONLY_TYPE_ERROR = "package kvgov.zz\n\nimport rego.v1\n\nx if count(input.n + 1) > 0\n"


def request(scope: dict[str, Any], tokens: int = 128) -> dict[str, Any]:
    return {"scope": scope, "tokens": tokens, "priority": None}


def test_every_bundle_test_passes_on_opa() -> None:
    """Every test_ rule of the bundled policy passes on OPA, as on the embedded engine."""
    report = run_tests(engine="reference")
    assert report.engine == "reference" and len(report.results) >= 75
    assert report.failures == ()


def test_a_tenant_without_overrides_is_admitted_on_opa(scope: dict[str, Any]) -> None:
    """The bundle's own sample request is admitted on OPA, not failed closed (OPA #1877:
    OPA rewrites `not n > t.max_tokens` so that it is undefined when max_tokens is absent)."""
    engine = ReferenceEngine(run_tests=False)
    d = engine.evaluate(ADMISSION, request(scope))
    engine.close()
    assert d.error is None
    assert d.result == {"allow": True, "cache": True, "priority": 50, "reason": "admitted"}


def test_is_a_policy_engine(reference: ReferenceEngine) -> None:
    """The reference engine satisfies the PolicyEngine protocol and names itself."""
    assert isinstance(reference, PolicyEngine) and reference.name == "reference"


def test_revision_is_the_bundle_revision(
    reference: ReferenceEngine, embedded: EmbeddedEngine
) -> None:
    """The same bundle has the same revision on both engines (a decision names its bundle)."""
    assert reference.bundle_revision == embedded.bundle_revision
    assert reference.bundle is not None


def test_undefined_rule_denies_without_error(reference: ReferenceEngine) -> None:
    """A rule with no value denies with the 'undefined' reason and no error."""
    d = reference.evaluate("kvgov/admission/no_such_rule", {})
    assert d.result is None and not d.allow and d.error is None
    assert d.reason.startswith("undefined")


def test_bad_path_and_bad_input_fail_closed(reference: ReferenceEngine) -> None:
    """A path that is not a rule path, or an input that is not JSON, denies with an error."""
    bad_path = reference.evaluate("kvgov/../x", {})
    assert not bad_path.allow and bad_path.error is not None
    bad_input = reference.evaluate(ADMISSION, {"scope": {1, 2}})
    assert not bad_input.allow and bad_input.error is not None


def test_data_paths_are_documents(reference: ReferenceEngine) -> None:
    """A path to data (not a rule) gives the data, as on the embedded engine."""
    d = reference.evaluate("kvgov/config/default_priority", {})
    assert d.result == 50


def test_evaluate_many_equals_evaluate(reference: ReferenceEngine, scope: dict[str, Any]) -> None:
    """A batch gives, input by input, what one evaluation each gives (undefined included)."""
    inputs = [request(scope), request({**scope, "classification": "secret"}), {}, {"scope": 7}]
    batch = reference.evaluate_many(ADMISSION, inputs)
    assert [d.result for d in batch] == [reference.evaluate(ADMISSION, i).result for i in inputs]
    groups = reference.evaluate_many("kvgov/sharing/publish_group", [{"scope": scope}, {}])
    assert [d.result for d in groups] == [None, None]
    assert reference.evaluate_many(ADMISSION, []) == []


def test_evaluate_many_falls_back_when_the_batch_fails(reference: ReferenceEngine) -> None:
    """An input OPA cannot take fails alone; the others in its batch still get decisions."""
    batch = reference.evaluate_many("kvgov/retention/decision", [{"scope": {1}}, {}])
    assert batch[0].error is not None
    assert batch[1].error is None and batch[1].result["ttl_seconds"] == 0


def test_closed_engine_fails_closed(scope: dict[str, Any]) -> None:
    """After close every evaluation denies with 'engine closed'; the revision stays readable."""
    engine = ReferenceEngine(run_tests=False)
    revision = engine.bundle_revision
    engine.close()
    d = engine.evaluate(ADMISSION, request(scope))
    assert not d.allow and d.error == "engine closed" and d.bundle_revision == revision
    assert engine.evaluate_many(ADMISSION, [request(scope)])[0].error == "engine closed"
    assert engine.bundle is None


def test_reload_swaps_or_keeps_the_bundle(bundle_copy: Path, scope: dict[str, Any]) -> None:
    """reload activates a new bundle, and keeps the old one when the new one fails on OPA."""
    engine = ReferenceEngine(bundle_copy, run_tests=False)
    before = engine.bundle_revision
    data = {"kvgov": {"config": {"retention_seconds": {"internal": 7}}}}
    assert engine.reload(policy_data=data) != before
    assert engine.evaluate("kvgov/retention/decision", {"scope": scope}).result["ttl_seconds"] == 7
    (bundle_copy / "zz.rego").write_text(OPA_ONLY_TYPE_ERROR)
    with pytest.raises(PolicyLoadError, match=r"zz\.rego"):
        engine.reload()
    assert engine.evaluate("kvgov/retention/decision", {"scope": scope}).result["ttl_seconds"] == 7
    engine.close()


def test_an_opa_compile_error_names_file_and_line(bundle_copy: Path) -> None:
    """A module regorus takes but OPA refuses raises PolicyLoadError with OPA's location."""
    (bundle_copy / "zz.rego").write_text(OPA_ONLY_TYPE_ERROR)
    with pytest.raises(PolicyLoadError) as info:
        ReferenceEngine(bundle_copy, run_tests=False)
    assert info.value.file == "zz.rego" and info.value.line == 5


def test_failing_bundle_test_refuses_the_bundle(bundle_copy: Path) -> None:
    """With run_tests (the default) a bundle whose tests fail on OPA is not activated."""
    f = bundle_copy / "sharing.rego"
    f.write_text(
        f.read_text().replace(
            'shareable_classification := "public"', 'shareable_classification := "internal"'
        )
    )
    with pytest.raises(PolicyTestFailure):
        ReferenceEngine(bundle_copy)


def test_coverage_of_the_shipped_bundle_holds_its_floor() -> None:
    """The bundle's tests cover at least COVERAGE_FLOOR % of its policy lines on OPA."""
    report = run_tests(engine="reference", coverage=True)
    assert report.coverage is not None
    names = {f.name for f in report.coverage.files}
    assert names == {"admission.rego", "eviction.rego", "kvgov.rego", "offload.rego",
                     "retention.rego", "scope.rego", "sharing.rego"}  # fmt: skip
    assert report.coverage.percent >= COVERAGE_FLOOR, [
        (f.name, sorted(f.not_covered)) for f in report.coverage.files
    ]


def test_coverage_drops_when_tests_are_removed(bundle_copy: Path) -> None:
    """Coverage is measured, not assumed: without the sharing tests sharing.rego is uncovered."""
    (bundle_copy / "sharing_test.rego").unlink()
    from kvgov.policy.testing import load_bundle

    report = run_reference_tests(load_bundle(bundle_copy, run_tests=False), coverage=True)
    assert report.coverage is not None
    sharing = next(f for f in report.coverage.files if f.name == "sharing.rego")
    assert sharing.percent < 50 and sharing.not_covered


def test_a_test_that_errors_fails_alone(tmp_path: Path) -> None:
    """A test rule OPA raises on fails with OPA's error; the other tests still pass."""
    (tmp_path / "p.rego").write_text("package p\n\nimport rego.v1\n\nx := 1\n")
    (tmp_path / "p_test.rego").write_text(
        "package p_test\n\nimport rego.v1\n\n"
        "test_ok if data.p.x == 1\n\n"
        "test_conflict := 1 if data.p.x == 1\n\n"
        "test_conflict := 2 if data.p.x == 1\n\n"
        "test_undefined if data.p.x == 2\n"
    )
    from kvgov.policy.testing import load_bundle

    report = run_reference_tests(load_bundle(tmp_path, run_tests=False))
    outcome = {r.name: r.detail for r in report.results}
    assert outcome["test_ok"] == "" and outcome["test_undefined"] == "undefined"
    assert outcome["test_conflict"].startswith("error:")
    assert report.failures == ("p_test.test_conflict", "p_test.test_undefined")


def test_coverage_needs_the_reference_engine() -> None:
    """Coverage asked of the embedded engine, or an unknown engine, is a PolicyError."""
    with pytest.raises(PolicyError, match="reference"):
        run_tests(engine="embedded", coverage=True)
    with pytest.raises(PolicyError, match="unknown engine"):
        run_tests(engine="opa")


def test_client_over_the_reference_engine(scope: dict[str, Any], bundle_copy: Path) -> None:
    """PolicyClient.create(engine='reference') gives typed, cached decisions and reloads."""
    c = PolicyClient.create(bundle_copy, engine="reference", run_tests=False)
    a = c.admission(scope, 128, None)
    assert a.allow and a.cache and a.priority == 50 and a.decision.engine == "reference"
    assert c.admission(scope, 128, None).decision.cached
    c.reload(policy_data={"kvgov": {"config": {"retention_seconds": {"internal": 9}}}})
    assert c.retention(scope).ttl_seconds == 9
    c.close()


def test_missing_bindings_raise_a_policy_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without OPA's bindings the engine refuses with the command that installs them."""
    monkeypatch.setitem(sys.modules, "opa_bindings", None)
    assert not reference_available()
    with pytest.raises(PolicyError, match="--ignore-requires-python"):
        ReferenceEngine(run_tests=False)
