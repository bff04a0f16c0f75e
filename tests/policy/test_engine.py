"""Rule paths and the construction of decisions."""

from __future__ import annotations

import uuid
from typing import Any

import pytest

from kvgov.policy.engine import failed_decision, make_decision, new_decision_id, normalize_path


@pytest.mark.parametrize(
    "path",
    [
        "kvgov/admission/decision",
        "/kvgov/admission/decision",
        "kvgov.admission.decision",
        "data.kvgov.admission.decision",
    ],
)
def test_paths_normalise_to_slash_form(path: str) -> None:
    """Slash, dotted and data-prefixed spellings name the same rule."""
    assert normalize_path(path) == "kvgov/admission/decision"


@pytest.mark.parametrize("path", ["", "kvgov/../x", "kvgov/a b", "kvgov//x", "x?y=1"])
def test_bad_paths_are_refused(path: str) -> None:
    """A path whose segments are not identifiers raises ValueError."""
    with pytest.raises(ValueError, match="invalid rule path"):
        normalize_path(path)


def test_allow_follows_the_result() -> None:
    """allow is the result's allow key, a boolean result, or True for other defined values."""
    kw: dict[str, Any] = {"bundle_revision": "r", "engine": "e", "seconds": 0.0}
    assert make_decision("p", {"allow": True, "reason": "ok"}, **kw).allow
    assert not make_decision("p", {"allow": "yes"}, **kw).allow
    assert not make_decision("p", False, **kw).allow
    assert make_decision("p", {"ttl_seconds": 5}, **kw).allow
    undefined = make_decision("p", None, **kw)
    assert not undefined.allow and undefined.error is None
    assert undefined.reason.startswith("undefined")


def test_sets_become_sorted_lists() -> None:
    """A set result is reported as a sorted list (the shape OPA's JSON has)."""
    d = make_decision("p", {"b", "a"}, bundle_revision="r", engine="e", seconds=0.0)
    assert d.result == ["a", "b"]


def test_nested_sets_and_tuples_take_json_shape() -> None:
    """Sets inside a result become sorted lists and tuples lists; the input is not changed."""
    result = {"read": {"b", "a"}, "pair": (1, 2), "n": 1}
    d = make_decision("p", result, bundle_revision="r", engine="e", seconds=0.0)
    assert d.result == {"read": ["a", "b"], "pair": [1, 2], "n": 1}
    assert result["read"] == {"a", "b"}


def test_decision_ids_are_random_version_4_uuids() -> None:
    """A decision id is the text form of a fresh RFC 4122 version-4 UUID."""
    ids = {new_decision_id() for _ in range(1000)}
    assert len(ids) == 1000
    for text in list(ids)[:50]:
        u = uuid.UUID(text)
        assert str(u) == text
        assert u.version == 4 and u.variant == uuid.RFC_4122


def test_failed_decision_denies_with_the_error() -> None:
    """A failed decision denies, carries the error and a fresh id."""
    d = failed_decision("p", "boom", bundle_revision="r", engine="e", seconds=0.1)
    e = failed_decision("p", "boom", bundle_revision="r", engine="e", seconds=0.1)
    assert not d.allow and d.error == "boom" and d.result is None
    assert d.reason == "policy error: boom"
    assert d.decision_id != e.decision_id
