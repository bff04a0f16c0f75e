"""trusted_event: the governor's fast construction makes the events AuditEvent makes.

The governor builds its per-request events (admission, reuse, eviction, zeroization)
with :func:`kvgov.audit.events.trusted_event`, skipping the checks of values kvgov
made or checked itself; the policy's values still go through ``checked_text`` and
``trusted_details``. These tests hold the fast path to the validated one: the same
fields, of the same types, sealed into the same canonical text and chain hash, and
the same refusals of the policy's bad values. ``tests/govern/test_trusted_call_sites.py``
checks every call site on real workloads.
"""

from __future__ import annotations

from typing import Any

import pytest

from kvgov.audit import AuditEvent, EventType
from kvgov.audit.events import checked_text, trusted_details, trusted_event
from kvgov.exceptions import InvalidAuditEvent
from kvgov.schema import SCOPE_FIELDS
from tests.support.trusted import assert_identical

SCOPE = {
    "tenant": "acme",
    "classification": "internal",
    "model": "meta-llama/Llama-3.1-8B",
    "model_revision": "r1",
    "adapter": None,
    "adapter_revision": None,
    "tokenizer": "llama3",
    "tokenizer_revision": "v1",
    "template_version": "sys-v3",
}
ADAPTER_SCOPE = {**SCOPE, "tenant": "bänk", "adapter": "lora-a", "adapter_revision": "7"}


def _values(scope: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(scope[f] for f in SCOPE_FIELDS)


ADMISSION_DETAILS = [
    {
        "cache": True,
        "priority": 50,
        "reason": "ok",
        "requested_priority": None,
        "ttl_seconds": 3600,
    },
    # an integral float TTL becomes an int, a fractional one stays a float
    {"cache": False, "priority": 0, "reason": "", "requested_priority": 7, "ttl_seconds": 3600.0},
    {"cache": True, "priority": 100, "reason": "r", "requested_priority": 1, "ttl_seconds": 0.25},
    # beyond 2**53 an integral float stays a float
    {"cache": True, "priority": 50, "reason": "r", "requested_priority": None, "ttl_seconds": 1e20},
    # non-ASCII text (AuditEvent's own path), a None TTL
    {
        "cache": True,
        "priority": 9,
        "reason": "erlaubt: ü",
        "requested_priority": None,
        "ttl_seconds": None,
    },
]


@pytest.mark.parametrize("scope", [SCOPE, ADAPTER_SCOPE])
@pytest.mark.parametrize("details", ADMISSION_DETAILS)
def test_admission(scope: dict[str, Any], details: dict[str, Any]) -> None:
    """The governor's admission event, both ways (the policy's values checked)."""
    common: dict[str, Any] = {
        "sequence_id": "req-1",
        "block_ids": (3, 4, 2**40),
        "token_count": 1024,
        "reused_tokens": 32,
    }
    checked = AuditEvent(
        type=EventType.ADMISSION,
        **scope,
        **common,
        decision_id="0b6b0f14-8d55-4d1c-9b7f-5d3b8e2a9c11",
        policy_revision="rev-42",
        details=dict(details),
    )
    fast = trusted_event(
        EventType.ADMISSION,
        _values(scope),
        **common,
        decision_id=checked_text("decision_id", "0b6b0f14-8d55-4d1c-9b7f-5d3b8e2a9c11"),
        policy_revision=checked_text("policy_revision", "rev-42"),
        details=trusted_details(dict(details)),
    )
    assert_identical(fast, checked)


def test_reuse_eviction_and_zeroization() -> None:
    """The other events the governor builds fast: reuse, eviction, zeroization."""
    assert_identical(
        trusted_event(
            EventType.REUSE,
            _values(SCOPE),
            requester_tenant="acme",
            sequence_id="req-2",
            block_ids=tuple(range(63)),
            reused_tokens=1008,
        ),
        AuditEvent(
            type=EventType.REUSE,
            **{**SCOPE, "requester_tenant": "acme"},
            sequence_id="req-2",
            block_ids=tuple(range(63)),
            reused_tokens=1008,
        ),
    )
    assert_identical(
        trusted_event(
            EventType.EVICTION,
            _values(ADAPTER_SCOPE),
            block_ids=(9,),
            details=trusted_details({"reason": "capacity"}),
        ),
        AuditEvent(
            type=EventType.EVICTION, **ADAPTER_SCOPE, block_ids=(9,), details={"reason": "capacity"}
        ),
    )
    assert_identical(
        trusted_event(EventType.EVICTION, None, block_ids=(9,), details=trusted_details({})),
        AuditEvent(type=EventType.EVICTION, block_ids=(9,)),
    )
    for tenant, seconds, extra in (
        ("acme", 0.0, {"state": "ordered"}),
        (None, 1.5e-05, {}),
        ("acme", 0.0, {"state": "done", "steps": 3}),
    ):
        details = {"bytes": 4096, "device": "vllm-worker:cuda", "seconds": seconds, **extra}
        assert_identical(
            trusted_event(
                EventType.ZEROIZATION,
                tenant=tenant,
                block_ids=(1, 2),
                details=trusted_details(dict(details)),
            ),
            AuditEvent(
                type=EventType.ZEROIZATION, tenant=tenant, block_ids=(1, 2), details=dict(details)
            ),
        )


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("decision_id", "x" * 65),
        ("decision_id", "a\x00b"),
        ("policy_revision", "rev-\ud800"),
        ("policy_revision", "r" * 129),
        ("policy_revision", 42),
    ],
)
def test_checked_text_refuses_what_audit_event_refuses(name: str, value: Any) -> None:
    """A policy's bad decision id or revision is refused as AuditEvent refuses it."""
    with pytest.raises(InvalidAuditEvent) as checked:
        AuditEvent(type=EventType.ADMISSION, **{name: value})
    with pytest.raises(InvalidAuditEvent) as fast:
        checked_text(name, value)
    assert str(fast.value) == str(checked.value)


def test_checked_text_keeps_what_audit_event_keeps() -> None:
    """Long non-ASCII but storable text passes, as it is."""
    value = "révision-" + "é" * 100
    assert checked_text("policy_revision", value) is value
    assert checked_text("decision_id", None) is None


@pytest.mark.parametrize(
    "value", ["a\x00b", "lone \udc00", float("nan"), float("inf"), 2**53, object(), {"text": "x"}]
)
def test_trusted_details_refuse_what_audit_event_refuses(value: Any) -> None:
    """A policy's bad reason (or any bad value) is refused with AuditEvent's own error."""
    with pytest.raises(InvalidAuditEvent) as checked:
        AuditEvent(type=EventType.ADMISSION, details={"reason": value})
    with pytest.raises(InvalidAuditEvent) as fast:
        trusted_details({"reason": value})
    assert str(fast.value) == str(checked.value)


def test_trusted_details_nested_values_take_the_checked_path() -> None:
    """A nested value is copied and cleaned as AuditEvent does (integral floats to ints)."""
    src = {"offload": {"deleted": [1.0, 2]}, "n": 2.0}
    out = trusted_details(dict(src))
    assert out == AuditEvent(type=EventType.ERASURE, details=src).details
    assert type(out["offload"]["deleted"][0]) is int and type(out["n"]) is int
