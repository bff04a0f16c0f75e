"""The bundled Rego policy over generated inputs and policy data.

Each decision rule decides its common case in one body that repeats deny's checks
in place (the hot path, see admission.rego). These properties pin that the
decision still agrees with deny for any input: it allows exactly when deny is
empty, and otherwise its reason is deny's reasons, sorted and joined. The
bundle's own ``*_test.rego`` check the same on a few inputs at every load.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgov.policy.embedded import EmbeddedEngine
from tests.policy.samples import SCOPE

#: Policy data the properties run under: the bundle's, and tenant overrides and
#: share groups that make every deny reason reachable.
POLICY_DATA: list[dict[str, Any] | None] = [
    None,
    {
        "kvgov": {
            "config": {
                "tenants": {
                    "acme": {"admission": False, "offload": False},
                    "globex": {"cache": False, "priority": 20, "max_tokens": 4096},
                },
                "offload_tiers": {"restricted": ["host"], "internal": ["host", "disk"]},
                "share_groups": {
                    "docs": {
                        "publishers": ["acme"],
                        "readers": ["globex"],
                        "classifications": ["public", "internal"],
                    }
                },
            }
        }
    },
]

ODD = st.sampled_from([None, "", 7, 1.5, True, [], ["a"], {}, {"a": 1}])
TENANT = st.sampled_from(["acme", "globex", "initech"])
CLASSIFICATION = st.sampled_from(["public", "internal", "confidential", "restricted", "secret"])
ADAPTER = st.sampled_from([(None, None), ("lora", "a1"), ("lora", None), (None, "a1"), ("", "a")])


@st.composite
def scopes(draw: st.DrawFn) -> Any:
    """A scope: half of them valid (any tenant, known label, with or without an
    adapter), the others with a label, adapter pair or field broken, or no object."""
    scope = {**SCOPE, "tenant": draw(TENANT)}
    scope["classification"] = draw(st.sampled_from(["public", "internal", "restricted"]))
    if draw(st.booleans()):
        scope["adapter"], scope["adapter_revision"] = "lora", "a1"
    breakage = draw(st.integers(0, 9))
    if breakage == 5:
        scope["classification"] = draw(CLASSIFICATION)
    elif breakage == 6:
        scope["adapter"], scope["adapter_revision"] = draw(ADAPTER)
    elif breakage in (7, 8):
        for field in draw(st.lists(st.sampled_from(sorted(SCOPE)), min_size=1, max_size=2)):
            if draw(st.booleans()):
                scope.pop(field, None)
            else:
                scope[field] = draw(ODD)
    elif breakage == 9:
        return draw(ODD)
    return scope


def present(**fields: st.SearchStrategy[Any]) -> st.SearchStrategy[dict[str, Any]]:
    """An input object whose fields are each present or, now and then, absent."""
    return st.fixed_dictionaries({}, optional=fields)


ODD_NUMBERS = st.sampled_from([0, 100, 101, -1, 2.5, 50.0, "12", None, True])
TOKENS = st.one_of(st.sampled_from([1, 512, 4096, 5000]), ODD_NUMBERS)
PRIORITY = st.one_of(st.none(), st.just(30), ODD_NUMBERS)
ADMISSION = present(scope=scopes(), tokens=TOKENS, priority=PRIORITY)
OFFLOAD = present(
    scope=scopes(), tier=st.sampled_from(["host", "disk", "redis", "cpu", "", None, 5])
)


@st.composite
def sharing_inputs(draw: st.DrawFn) -> dict[str, Any]:
    """A requester and an owner: mostly the same scope but for the tenant or one
    binding field, else two drawn apart."""
    requester = draw(scopes())
    owner = draw(scopes())
    if isinstance(requester, dict) and draw(st.integers(0, 3)) > 0:
        field = draw(st.sampled_from(["tenant", "model_revision", "template_version"]))
        owner = {**requester, field: draw(st.sampled_from(["acme", "globex", "r2"]))}
    return draw(present(requester=st.just(requester), owner=st.just(owner)))


@pytest.fixture(scope="module", params=range(len(POLICY_DATA)))
def engine(request: pytest.FixtureRequest) -> EmbeddedEngine:
    """An embedded engine over the bundle with one of POLICY_DATA."""
    return EmbeddedEngine(policy_data=POLICY_DATA[request.param], run_tests=False)


def assert_decision_agrees_with_deny(e: EmbeddedEngine, package: str, input: Any) -> None:
    decision = e.evaluate(f"kvgov/{package}/decision", input)
    deny = e.evaluate(f"kvgov/{package}/deny", input)
    assert decision.error is None and deny.error is None
    reasons = sorted(deny.result)
    assert decision.allow is (reasons == [])
    if not decision.allow:
        assert decision.reason == "; ".join(reasons)


@settings(max_examples=500, deadline=None)
@given(input=ADMISSION)
def test_admission_allows_exactly_when_nothing_is_denied(
    engine: EmbeddedEngine, input: Any
) -> None:
    """Admission allows exactly when deny is empty; a denial gives deny's reasons."""
    assert_decision_agrees_with_deny(engine, "admission", input)


@settings(max_examples=500, deadline=None)
@given(input=sharing_inputs())
def test_sharing_allows_exactly_when_nothing_is_denied(engine: EmbeddedEngine, input: Any) -> None:
    """Sharing allows exactly when deny is empty; a denial gives deny's reasons."""
    assert_decision_agrees_with_deny(engine, "sharing", input)


@settings(max_examples=500, deadline=None)
@given(input=OFFLOAD)
def test_offload_allows_exactly_when_nothing_is_denied(engine: EmbeddedEngine, input: Any) -> None:
    """Offload allows exactly when deny is empty; a denial gives deny's reasons."""
    assert_decision_agrees_with_deny(engine, "offload", input)


@settings(max_examples=500, deadline=None)
@given(input=present(scope=scopes()))
def test_retention_is_zero_unless_configured(engine: EmbeddedEngine, input: Any) -> None:
    """Retention is a number >= 0; anything but a configured retention is 0, and
    restricted data or a scope that is not an object always gets 0."""
    d = engine.evaluate("kvgov/retention/decision", input)
    assert d.error is None
    ttl = d.result["ttl_seconds"]
    assert type(ttl) in (int, float) and ttl >= 0
    assert ttl == 0 or d.reason == "configured retention"
    scope = input.get("scope")
    if not isinstance(scope, dict) or scope.get("classification") == "restricted":
        assert ttl == 0
