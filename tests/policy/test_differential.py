"""Differential test: every entry point of the bundle gives the same answer on both engines.

The embedded engine (regorus) and the reference engine (OPA v1.20.2) evaluate
generated inputs (absent, null, wrong-typed and extreme fields, unknown tenants
and classifications) under several policy data (the shipped data.json, tenant
overrides and share groups present, overrides with wrong-typed values, no
default token limit). Every rule :class:`~kvgov.policy.client.PolicyClient`
queries must give equal results (JSON equality: ``50`` equals ``50.0``) and
fail on the same inputs.

Each entry point sees at least 10,000 different inputs per run
(:data:`ENTRY_POINTS`): one example draws a batch, a grid of drawn values; the
reference engine takes a batch in one call, the embedded engine one input at a
time, as in production.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from kvgov.policy.embedded import EmbeddedEngine
from kvgov.policy.reference import ReferenceEngine
from tests.policy.samples import SCOPE
from tests.support.policy import needs_reference

pytestmark = needs_reference

#: Policy data the engines run under (deep-merged over data.json).
POLICY_DATA: list[dict[str, Any] | None] = [
    None,
    {
        "kvgov": {
            "config": {
                "tenants": {
                    "acme": {"admission": False, "offload": False},
                    "globex": {"cache": False, "priority": 20, "max_tokens": 4096},
                    "initech": {"retention_seconds": {"internal": 60, "public": 0}},
                },
                "offload_tiers": {"restricted": ["cpu"], "internal": ["cpu", "disk"]},
                "share_groups": {
                    "docs": {
                        "publishers": ["acme"],
                        "readers": ["globex"],
                        "classifications": ["public", "internal"],
                    },
                    "all": {"publishers": ["globex", "initech"], "classifications": ["public"]},
                },
            }
        }
    },
    {
        "kvgov": {
            "config": {
                "tenants": {
                    "acme": {"max_tokens": "lots", "priority": 101, "cache": None},
                    "globex": {"max_tokens": -1, "admission": None, "offload": "no"},
                    "initech": {
                        "max_tokens": 2**60,
                        "retention_seconds": {"internal": "forever", "public": -5},
                        "priority": 2.5,
                    },
                    "umbrella": {"max_tokens": 0.5, "retention_seconds": {"public": 1.5}},
                },
                "retention_seconds": {"confidential": None},
            }
        }
    },
    {"kvgov": {"config": {"max_tokens": None, "tenants": {"acme": {"max_tokens": 64}}}}},
]

EXTREME = [-0.0, 0.5, 1e-7, 2**53 - 1, 2**53, 2**63, 2**64, 10**30, 1e300, -1e300, -(2**64)]
ODD = st.one_of(
    st.sampled_from(
        [None, "", 7, 1.5, True, False, [], ["a"], {}, {"a": 1}, "a\x00b", "ü", *EXTREME]
    ),
    st.integers(),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(st.characters(codec="utf-8"), max_size=6),
)
TENANT = st.one_of(
    st.sampled_from(["acme", "globex", "initech", "umbrella", "hooli"]),
    st.text(st.characters(codec="utf-8"), min_size=1, max_size=6),
)
LABELS = ["public", "internal", "confidential", "restricted"]
UNKNOWN_LABEL = st.sampled_from(["secret", "Public", ""])
#: Mostly known labels (one in two), else unknown ones or odd values.
CLASSIFICATION = st.one_of(st.sampled_from(LABELS), UNKNOWN_LABEL, ODD, st.sampled_from(LABELS))
ADAPTER = st.sampled_from([(None, None), ("lora", "a1"), ("lora", None), (None, "a1"), ("", "a")])
BOUNDARIES = [0, 1, 63, 64, 65, 4095, 4096, 4097, 262143, 262144, 262145]
TOKENS = st.one_of(st.sampled_from(BOUNDARIES), st.integers(0, 400_000), ODD)
PRIORITY = st.one_of(st.none(), st.integers(-5, 105), ODD)
#: A revision or template version (they bind KV state, so sharing compares them):
#: mostly drawn text, so that grids of different examples differ.
REVISION_TEXT = st.text(st.characters(codec="utf-8"), min_size=1, max_size=8)
REVISION = st.one_of(st.sampled_from(["r1", "r2", "sys-v3"]), REVISION_TEXT, REVISION_TEXT)
TIER = st.one_of(st.sampled_from(["cpu", "disk", "gpu", ""]), ODD)


#: Stands for a field left out of the input.
ABSENT = object()


def key(value: Any) -> str:
    """What makes two inputs the same: their JSON (1, 1.0 and true differ; so do 0.0
    and -0.0, as the engines receive them)."""
    return "<absent>" if value is ABSENT else json.dumps(value, sort_keys=True)


def with_fields(**fields: Any) -> dict[str, Any]:
    """An input object of the fields that are not ABSENT."""
    return {k: v for k, v in fields.items() if v is not ABSENT}


@st.composite
def broken_scopes(draw: st.DrawFn) -> Any:
    """A scope with its label, adapter pair or fields broken, extra keys, or no object."""
    scope: dict[str, Any] = {**SCOPE, "tenant": draw(TENANT)}
    breakage = draw(st.integers(0, 4))
    if breakage == 0:
        scope["classification"] = draw(CLASSIFICATION)
    elif breakage == 1:
        scope["adapter"], scope["adapter_revision"] = draw(ADAPTER)
    elif breakage == 2:
        for field in draw(st.lists(st.sampled_from(sorted(SCOPE)), min_size=1, max_size=3)):
            if draw(st.booleans()):
                scope.pop(field, None)
            else:
                scope[field] = draw(ODD)
    elif breakage == 3:
        scope[draw(st.sampled_from(["extra", "Tenant", ""]))] = draw(ODD)
    else:
        return draw(ODD)
    return scope


@st.composite
def scope_grid(draw: st.DrawFn, tenants: int, labels: int, broken: int) -> list[Any]:
    """Scopes: every combination of drawn tenants, labels and adapter pairs, on drawn
    revisions (valid but for an unknown tenant or label), then drawn broken ones,
    then an absent one.

    A grid keeps the cost of generation per input small: 10,000 inputs from a few
    hundred draws, where one draw per field per input takes minutes.
    """
    names = draw(st.lists(TENANT, min_size=tenants, max_size=tenants, unique_by=key))
    classes = draw(st.lists(CLASSIFICATION, min_size=labels, max_size=labels, unique_by=key))
    base = {**SCOPE, "model_revision": draw(REVISION), "template_version": draw(REVISION)}
    grid = [
        {**base, "tenant": t, "classification": c, "adapter": a, "adapter_revision": r}
        for t in names
        for c in classes
        for a, r in [(None, None), ("lora", "a1")]
    ]
    broken_ones = draw(st.lists(BROKEN, min_size=broken, max_size=broken, unique_by=key))
    return [*grid, *broken_ones, ABSENT]


def values(strategy: st.SearchStrategy[Any], n: int) -> st.SearchStrategy[list[Any]]:
    """n different values of a field, the field left out now and then (one in four)."""
    field = st.one_of(strategy, strategy, strategy, st.just(ABSENT))
    return st.lists(field, min_size=n, max_size=n, unique_by=key)


# Built once: a strategy built inside a draw is validated again at every draw.
BROKEN = broken_scopes()
SCOPES = scope_grid(2, 3, 4)
REQUESTERS = scope_grid(3, 3, 4)
MANY_SCOPES = scope_grid(4, 4, 12)
FOUR_TOKENS = values(TOKENS, 4)
THREE_PRIORITIES = values(PRIORITY, 3)
FOUR_TIERS = values(TIER, 4)
TWO_TENANTS = st.lists(TENANT, min_size=2, max_size=2, unique_by=key)
BINDING_FIELD = st.sampled_from(["model_revision", "classification", "adapter"])


@st.composite
def admission_inputs(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Every combination of drawn scopes, token counts and priorities (17 x 4 x 3)."""
    scopes, tokens, priorities = draw(SCOPES), draw(FOUR_TOKENS), draw(THREE_PRIORITIES)
    return [
        with_fields(scope=s, tokens=n, priority=p)
        for s in scopes
        for n in tokens
        for p in priorities
    ]


@st.composite
def sharing_inputs(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Each drawn requester (23) with five owners: two that differ from it in the
    tenant only (drawn tenants), itself, one that differs in one binding field,
    and a broken scope; a requester that is no object gets three."""
    tenants = draw(TWO_TENANTS)
    inputs = []
    for requester in draw(REQUESTERS):
        other = draw(BROKEN)
        if isinstance(requester, dict):
            field = draw(BINDING_FIELD)
            changed = {**requester, field: draw(CLASSIFICATION)}
            owners = [{**requester, "tenant": t} for t in tenants] + [requester, changed]
        else:
            owners = [SCOPE, ABSENT]
        inputs += [with_fields(requester=requester, owner=o) for o in [*owners, other]]
    return inputs


@st.composite
def scope_inputs(draw: st.DrawFn) -> list[dict[str, Any]]:
    """{scope} for drawn scopes (4 x 4 x 2 + 12 + 1)."""
    return [with_fields(scope=s) for s in draw(MANY_SCOPES)]


@st.composite
def offload_inputs(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Every combination of drawn scopes and tiers (17 x 4)."""
    scopes, tiers = draw(SCOPES), draw(FOUR_TIERS)
    return [with_fields(scope=s, tier=t) for s in scopes for t in tiers]


#: Each entry point, the strategy of one batch of its inputs, and the examples
#: that make at least 10,000 different inputs. Hypothesis repeats parts of earlier
#: examples in later ones (that is how it searches), so only about 35% (sharing)
#: to 90% (admission) of the inputs drawn are new: the test evaluates each input
#: once and counts the different ones.
ENTRY_POINTS: dict[str, tuple[st.SearchStrategy[list[Any]], int]] = {
    "kvgov/admission/decision": (admission_inputs(), 64),  # 204 inputs each
    "kvgov/sharing/decision": (sharing_inputs(), 330),  # 105 or more
    "kvgov/sharing/groups": (scope_inputs(), 360),  # 45
    "kvgov/retention/decision": (scope_inputs(), 360),  # 45
    "kvgov/offload/decision": (offload_inputs(), 210),  # 68
}


Pair = tuple[EmbeddedEngine, ReferenceEngine]


@pytest.fixture(scope="module")
def engines() -> Iterator[list[Pair]]:
    """An embedded and a reference engine for each of POLICY_DATA."""
    pairs = [
        (
            EmbeddedEngine(policy_data=d, run_tests=False),
            ReferenceEngine(policy_data=d, run_tests=False),
        )
        for d in POLICY_DATA
    ]
    yield pairs
    for _, reference in pairs:
        reference.close()


def canonical(value: Any) -> Any:
    """JSON equality: an integral float is its integer (``50.0 == 50``, ``-0.0 == 0``)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [canonical(v) for v in value]
    return value


def assert_engines_agree(pair: Pair, path: str, inputs: list[Any]) -> None:
    embedded, reference = pair
    theirs = reference.evaluate_many(path, inputs)
    for policy_input, ref in zip(inputs, theirs, strict=True):
        emb = embedded.evaluate(path, policy_input)
        got = (emb.error is None, canonical(emb.result))
        want = (ref.error is None, canonical(ref.result))
        assert got == want, (
            f"{path} on {policy_input!r}: "
            f"embedded {emb.error or emb.result!r}, OPA {ref.error or ref.result!r}"
        )


@pytest.mark.parametrize("path", sorted(ENTRY_POINTS))
def test_engines_agree_on_generated_inputs(engines: list[Pair], path: str) -> None:
    """Both engines give every entry point the same result on 10,000 different
    generated inputs."""
    strategy, examples = ENTRY_POINTS[path]
    seen: set[tuple[int, str]] = set()

    # No shrinking: a failure names the one input the engines disagree on.
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        phases=[Phase.explicit, Phase.generate],
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(data=st.integers(0, len(POLICY_DATA) - 1), inputs=strategy)
    def check(data: int, inputs: list[Any]) -> None:
        new = []
        for policy_input in inputs:
            k = (data, key(policy_input))
            if k not in seen:
                seen.add(k)
                new.append(policy_input)
        assert_engines_agree(engines[data], path, new)

    check()
    assert len(seen) >= 10_000, f"only {len(seen)} different inputs: raise the examples"


def test_classifications_agree(engines: list[Pair]) -> None:
    """The classification labels are the same set on both engines, under every data."""
    for embedded, reference in engines:
        emb = embedded.evaluate("kvgov/classifications", {})
        ref = reference.evaluate("kvgov/classifications", {})
        assert emb.error is None and ref.error is None
        assert sorted(emb.result) == sorted(ref.result)
