"""``AuditEvent.derive(details=...)``: another ``details``, checked and copied as at construction.

The SGLang binding derives a request's ``admission`` event that also holds its own
reuse (``details.own_reuse``) from the scope's validated admission event; the
``details`` it gives are checked by the rules of construction, and the result equals
the event built from all its fields.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

import pytest

from kvgov.audit import AuditEvent, EventType
from kvgov.audit.events import OWN_REUSE_KEY
from kvgov.exceptions import InvalidAuditEvent

FIELDS: dict[str, Any] = {
    "tenant": "acme",
    "classification": "internal",
    "model": "m",
    "model_revision": "r1",
    "tokenizer": "m",
    "tokenizer_revision": "r1",
    "template_version": "v1",
    "token_count": 1024,
    "reused_tokens": 0,
    "decision_id": "d-1",
    "policy_revision": "rev",
    "details": {"cache": True, "priority": 50, "ttl_seconds": 3600.0},
}


def test_derived_details_equal_the_event_built_whole() -> None:
    source = AuditEvent(EventType.ADMISSION, **FIELDS)
    fold = {OWN_REUSE_KEY: {"blocks": 3, "reused_tokens": 48}}
    details = {**source.details, **fold}
    got = source.derive(sequence_id="r7", block_ids=(4, 5, 6), reused_tokens=48, details=details)
    given = {"sequence_id": "r7", "block_ids": (4, 5, 6), "reused_tokens": 48, "details": details}
    assert got == AuditEvent(EventType.ADMISSION, **{**FIELDS, **given})
    assert got.details == {"cache": True, "priority": 50, "ttl_seconds": 3600, **fold}
    assert source.details == {"cache": True, "priority": 50, "ttl_seconds": 3600}  # unchanged
    # a private copy, as at construction: the caller's dict and its nested dicts stay theirs
    details[OWN_REUSE_KEY]["blocks"] = 99
    details["extra"] = 1
    assert got.details[OWN_REUSE_KEY] == {"blocks": 3, "reused_tokens": 48}
    assert "extra" not in got.details
    # integral floats become ints; any mapping is taken; not given: the source's
    assert source.derive(details={"x": 2.0}).details == {"x": 2}
    assert type(source.derive(details={"x": 2.0}).details["x"]) is int
    assert source.derive(details=MappingProxyType({"a": [1, 2]})).details == {"a": [1, 2]}
    assert source.derive(details={}).details == {}
    assert source.derive(sequence_id="r8").details is source.details


@pytest.mark.parametrize(
    "details",
    [
        {"tokens": [1, 2, 3]},  # a forbidden key: prompt content
        {"own_reuse": {"Prompt": "hi"}},  # forbidden at any depth, any case
        {"x": float("nan")},
        {"x": 2**53},
        {"x": "a\x00b"},
        {"x": "\ud800"},
        {"x": object()},
        {1: "x"},
        [("x", 1)],
        "x",
        None,
    ],
)
def test_derived_details_are_checked_as_at_construction(details: Any) -> None:
    source = AuditEvent(EventType.ADMISSION, **FIELDS)
    with pytest.raises(InvalidAuditEvent, match="details") as info:
        source.derive(details=details)
    assert info.value.field == "details"
    with pytest.raises(InvalidAuditEvent, match="details"):  # the same rule as a whole event
        AuditEvent(EventType.ADMISSION, **{**FIELDS, "details": details})
