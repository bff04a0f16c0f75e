"""CacheScope validation."""

from __future__ import annotations

import pytest

from kvgov.exceptions import InvalidScope
from kvgov.govern import CacheScope
from kvgov.schema import SCOPE_FIELDS

from .conftest import make_scope


def test_valid_scope_round_trips_to_policy_dict() -> None:
    """as_dict gives every field, adapters None for the base model."""
    scope = make_scope()
    d = scope.as_dict()
    assert d["tenant"] == "acme"
    assert d["adapter"] is None and d["adapter_revision"] is None
    assert tuple(d) == SCOPE_FIELDS  # every field, in the order keys and policy use
    assert len(SCOPE_FIELDS) == 9 and SCOPE_FIELDS[0] == "tenant"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("tenant", ""),
        ("tenant", "x" * 257),
        ("model", "bad\nname"),
        ("model_revision", "\x00"),
        ("tokenizer", 7),
        ("template_version", None),
        ("adapter", ""),
    ],
)
def test_bad_field_is_refused_with_the_field_named(field: str, value: object) -> None:
    """Empty, over-long, unprintable or non-string identifiers raise InvalidScope naming it."""
    overrides = {field: value}
    if field == "adapter":
        overrides["adapter_revision"] = "a1"
    with pytest.raises(InvalidScope) as info:
        make_scope(**overrides)
    assert info.value.field == field


def test_adapter_and_its_revision_go_together() -> None:
    """An adapter without a revision, or a revision without an adapter, is refused."""
    with pytest.raises(InvalidScope):
        make_scope(adapter="lora")
    with pytest.raises(InvalidScope):
        make_scope(adapter_revision="a1")
    assert make_scope(adapter="lora", adapter_revision="a1").adapter == "lora"


def test_scope_is_frozen_and_hashable() -> None:
    """Scopes are immutable values usable as dict keys."""
    scope = make_scope()
    with pytest.raises(AttributeError):
        scope.tenant = "other"  # type: ignore[misc]
    assert {scope: 1}[make_scope()] == 1
    assert isinstance(scope, CacheScope)


def test_256_characters_is_the_longest_accepted() -> None:
    """The limit is inclusive."""
    assert make_scope(tenant="t" * 256).tenant == "t" * 256


@pytest.mark.parametrize("field", SCOPE_FIELDS)
@pytest.mark.parametrize("bad", ["a\x00b", "a\ud800b", "limit+1"])
def test_every_field_refuses_what_the_audit_store_would(field: str, bad: str) -> None:
    """NUL, a lone surrogate or one character past the audit column's width is refused."""
    from kvgov.schema import TEXT_LIMITS

    value = "x" * (TEXT_LIMITS[field] + 1) if bad == "limit+1" else bad
    overrides = {field: value}
    if field.startswith("adapter"):
        overrides = {"adapter": "lora", "adapter_revision": "a1", field: value}
    with pytest.raises(InvalidScope) as info:
        make_scope(**overrides)
    assert info.value.field == field


def test_an_accepted_scope_always_makes_a_storable_audit_event() -> None:
    """The longest accepted value of every field passes AuditEvent's store checks."""
    from kvgov.audit import AuditEvent, EventType
    from kvgov.schema import TEXT_LIMITS

    longest = {f: "\u00e9" * TEXT_LIMITS[f] for f in SCOPE_FIELDS}
    scope = make_scope(**longest)
    assert AuditEvent(EventType.ADMISSION, **scope.as_dict()).tenant == longest["tenant"]
