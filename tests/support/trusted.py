"""Hold the governor's fast event construction to the validated one, on a real workload.

:func:`shadow_trusted_events` replaces :func:`kvgov.audit.events.trusted_event` in every
module that calls it with a wrapper that also builds the event with
:class:`~kvgov.audit.AuditEvent` (every check run) from the same arguments, and fails
unless the two are identical: the same fields, of the same types, sealed into the same
canonical text and chain hash. A value a call site passed unchecked that AuditEvent
refuses fails the test too (AuditEvent raises).
"""

from __future__ import annotations

import importlib
from collections import Counter
from typing import Any

import pytest

from kvgov.audit import GENESIS_HASH, AuditEvent
from kvgov.audit import events as audit_events
from kvgov.audit.events import RECORD_FIELDS, event_record
from kvgov.audit.sealer import Sealer
from kvgov.audit.signing import SigningKey
from kvgov.schema import SCOPE_FIELDS

#: The modules whose audit events are built with trusted_event (the vLLM binding's,
#: ``kvgov.govern.vllm.binding``, imports vLLM: its tests name it).
CALL_SITES = ("kvgov.govern.governor", "kvgov.govern.sharing")


def sealed(ev: Any) -> list[Any]:
    """The row the sealer makes of ``ev`` as a stream's first event (hash included)."""
    sealer = Sealer("w1", SigningKey.ephemeral(), lambda: 1.0, 0, GENESIS_HASH, -1, 1000, 60.0)
    rows: list[Any] = []
    sealer.seal([(1, 1_700_000_000_000_000, ev)], rows, [])
    return [bytes(v) if isinstance(v, bytearray) else v for v in rows[0]]


def assert_identical(fast: AuditEvent, checked: AuditEvent) -> None:
    """Same fields, same types (a StrEnum or a float for an int would seal differently)."""
    assert type(fast) is AuditEvent
    assert event_record(fast) == event_record(checked)
    for name in RECORD_FIELDS:
        a, b = getattr(fast, name), getattr(checked, name)
        assert type(a) is type(b), name
        if isinstance(a, dict):
            assert [(k, type(v)) for k, v in a.items()] == [(k, type(v)) for k, v in b.items()]
    assert sealed(fast) == sealed(checked)


def shadow_trusted_events(monkeypatch: pytest.MonkeyPatch, *more: str) -> Counter[str]:
    """Check every trusted_event call of :data:`CALL_SITES` and ``more`` modules; count
    them by event type."""
    real = audit_events.trusted_event
    seen: Counter[str] = Counter()

    def shadow(type: Any, scope: Any = None, *, tenant: Any = None, **kwargs: Any) -> AuditEvent:
        fast = real(type, scope, tenant=tenant, **kwargs)
        fields = dict(zip(SCOPE_FIELDS, scope, strict=True)) if scope else {"tenant": tenant}
        kwargs["details"] = kwargs.get("details") or {}
        checked = AuditEvent(type=type, **fields, **kwargs)
        assert_identical(fast, checked)
        seen[str(type)] += 1
        return fast

    for name in (*CALL_SITES, *more):
        module = importlib.import_module(name)
        monkeypatch.setattr(module, "trusted_event", shadow)
    return seen
