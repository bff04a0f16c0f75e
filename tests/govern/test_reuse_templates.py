"""A REUSE event derived from its owner's template is the event built whole.

Bindings that audit many reuses of one owner's blocks (SGLang's tree: every hit of
a tenant's own pages) keep one validated REUSE event per owner scope
(:class:`kvgov.govern.sharing.ReuseTemplates`) and derive each reuse's from it; the
trail must not tell the two apart, and nothing audit_reuse refuses may pass.
"""

from __future__ import annotations

import pytest

from kvgov.audit import AuditEvent
from kvgov.exceptions import InternalError
from kvgov.govern.ledger import Ledger
from kvgov.govern.sharing import ReuseTemplates, audit_reuse
from kvgov.policy import PolicyClient
from kvgov.policy.embedded import EmbeddedEngine

from .conftest import make_scope


class _Recorder:
    """The audit log's ``record``, keeping the events."""

    def __init__(self) -> None:
        self.events: list[AuditEvent] = []

    def record(self, event: AuditEvent) -> str:
        self.events.append(event)
        return f"s:{len(self.events)}"


@pytest.fixture(scope="module")
def policy() -> PolicyClient:
    return PolicyClient(EmbeddedEngine(run_tests=False))


def test_derived_reuse_events_equal_the_events_built_whole(policy: PolicyClient) -> None:
    ledger = Ledger.create(16, policy)
    mine, other_template = make_scope(), make_scope(template_version="sys-v4")
    ledger.owners.assign([1, 2, 3], mine)
    ledger.owners.assign([4, 5], other_template)  # the same tenant, another scope
    view = ledger.views.view(mine)
    plain, derived = _Recorder(), _Recorder()
    templates = ReuseTemplates(limit=1)  # two owners: emptied on the way, still right
    for seq in ("r1", "r2"):
        audit_reuse(ledger, plain, 4, view, [1, 2, 3, 4, 5], seq, {})  # type: ignore[arg-type]
        audit_reuse(
            ledger,
            derived,  # type: ignore[arg-type]
            4,
            view,
            [1, 2, 3, 4, 5],
            seq,
            {},
            templates=templates,
        )
    assert derived.events == plain.events
    first = [(e.template_version, e.block_ids, e.reused_tokens) for e in plain.events[:2]]
    assert first == [("sys-v3", (1, 2, 3), 12), ("sys-v4", (4, 5), 8)]
    assert {(e.tenant, e.requester_tenant, e.sequence_id) for e in plain.events[:2]} == {
        ("acme", "acme", "r1")
    }
    # an equal scope held by another object gets the same fields
    twin = make_scope()
    assert twin is not mine
    assert templates.event(twin, ledger) == templates.event(mine, ledger)


def test_templates_let_nothing_pass_that_audit_reuse_refuses(policy: PolicyClient) -> None:
    ledger = Ledger.create(16, policy)
    view = ledger.views.view(make_scope())
    ledger.owners.assign([1], make_scope(tenant="bank"))
    recorder = _Recorder()
    templates = ReuseTemplates()
    with pytest.raises(InternalError, match="unjudged"):  # another tenant's, no decision
        audit_reuse(ledger, recorder, 4, view, [1], "r", {}, templates=templates)  # type: ignore[arg-type]
    with pytest.raises(InternalError, match="no owner"):
        audit_reuse(ledger, recorder, 4, view, [7], "r", {}, templates=templates)  # type: ignore[arg-type]
    assert not recorder.events
