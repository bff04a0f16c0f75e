"""Recorded policy decisions as OPA decision-log entries (`kvgov audit export --format
opa-decision-log`)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kvgov.audit import AuditEvent, AuditLog, AuditQueries, EventType
from kvgov.audit.export import (
    DECISION_EVENT_TYPES,
    decision_log,
    decision_log_entries,
    write_decision_log,
)
from kvgov.cli.audit import audit_group

from .conftest import FixedClock

SCOPE: dict[str, Any] = {
    "tenant": "acme",
    "classification": "public",
    "model": "llama-3-8b",
    "model_revision": "r1",
    "adapter": None,
    "adapter_revision": None,
    "tokenizer": "llama3",
    "tokenizer_revision": "v1",
    "template_version": "sys-v3",
}
REV = "sha256:0123456789abcdef"


def event(type: str, **kw: Any) -> AuditEvent:
    fields: dict[str, Any] = {**SCOPE, "decision_id": f"d-{type}", "policy_revision": REV}
    return AuditEvent(type=type, **{**fields, **kw})


EVENTS = [
    event(EventType.ADMISSION, token_count=128, details={
        "requested_priority": None, "cache": True, "priority": 50, "reason": "admitted",
        "ttl_seconds": 86400}),
    event(EventType.ADMISSION, decision_id="d-restricted", classification="restricted",
          token_count=8, details={"requested_priority": 80, "cache": False, "priority": 80,
                                  "reason": "admitted; restricted data is never cached",
                                  "ttl_seconds": None}),
    event(EventType.POLICY_DENIED, token_count=200_000, details={
        "requested_priority": None, "reason": "too many", "path": "kvgov/admission/decision"}),
    event(EventType.POLICY_ERROR, token_count=1, details={"reason": "policy error: timeout"}),
    event(EventType.POLICY_ERROR, decision_id="d-ret", details={
        "reason": "policy error: undefined", "path": "kvgov/retention/decision"}),
    event(EventType.CROSS_TENANT_REUSE, requester_tenant="globex", block_ids=(1,)),
    event(EventType.SHARE_DENIED, requester_tenant="initech", details={"reason": "no group"}),
    event(EventType.REUSE, requester_tenant="acme", block_ids=(2,)),
    event(EventType.EVICTION, block_ids=(3,)),
]  # fmt: skip


@pytest.fixture()
def trail(db_url: str, tmp_path: Path) -> str:
    """A trail holding EVENTS, one millisecond apart (SQLite and PostgreSQL)."""
    with AuditLog(db_url, "w1", clock=FixedClock(), spool_path=tmp_path / "s.jsonl") as log:
        for e in EVENTS:
            log.record(e)
    return db_url


def entries(url: str, **kw: Any) -> list[dict[str, Any]]:
    with AuditQueries(url) as q:
        return list(decision_log(q, **kw))


def test_each_decision_event_gives_its_entries(trail: str) -> None:
    """Admissions give the admission (and, when cacheable, the retention); denials a
    deny result; errors an error and no result; lookups the sharing decision;
    other events nothing."""
    got = [(e["path"], e["decision_id"], e.get("result"), e.get("error")) for e in entries(trail)]
    assert got == [
        ("kvgov/admission/decision", "d-admission",
         {"allow": True, "cache": True, "priority": 50, "reason": "admitted"}, None),
        ("kvgov/retention/decision", "d-admission/retention", {"ttl_seconds": 86400}, None),
        ("kvgov/admission/decision", "d-restricted",
         {"allow": True, "cache": False, "priority": 80,
          "reason": "admitted; restricted data is never cached"}, None),
        ("kvgov/admission/decision", "d-policy_denied",
         {"allow": False, "cache": False, "priority": 0, "reason": "too many"}, None),
        ("kvgov/admission/decision", "d-policy_error", None,
         {"code": "kvgov_fail_closed", "message": "policy error: timeout"}),
        ("kvgov/retention/decision", "d-ret", None,
         {"code": "kvgov_fail_closed", "message": "policy error: undefined"}),
        ("kvgov/sharing/decision", "d-cross_tenant_reuse", {"allow": True}, None),
        ("kvgov/sharing/decision", "d-share_denied", {"allow": False, "reason": "no group"}, None),
    ]  # fmt: skip


def test_inputs_are_what_the_decisions_read(trail: str) -> None:
    """Admission input is {scope, tokens, priority}; retention {scope}; sharing the
    owner's scope and the requester's (the owner's with the requester's tenant)."""
    log = entries(trail)
    assert log[0]["input"] == {"scope": SCOPE, "tokens": 128, "priority": None}
    assert log[1]["input"] == {"scope": SCOPE}
    assert log[2]["input"]["priority"] == 80
    assert log[6]["input"] == {"requester": {**SCOPE, "tenant": "globex"}, "owner": SCOPE}


def test_entries_carry_opa_decision_log_fields(trail: str) -> None:
    """Every entry has OPA's decision-log fields: decision_id, path, input, result or
    error, bundles.<name>.revision, an RFC 3339 UTC timestamp, and labels naming the event."""
    for e in entries(trail):
        assert {"decision_id", "path", "input", "bundles", "timestamp", "labels"} <= set(e)
        assert ("result" in e) != ("error" in e)
        assert e["bundles"] == {"kvgov": {"revision": REV}}
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", e["timestamp"])
        assert e["labels"]["kvgov_event"].startswith("w1:")


def test_tenant_selects_decisions_it_asks_or_owns(trail: str) -> None:
    """tenant= keeps events where the tenant is the owner or the requester."""
    assert [e["decision_id"] for e in entries(trail, tenant="globex")] == ["d-cross_tenant_reuse"]
    assert len(entries(trail, tenant="acme")) == 8


def test_unknown_paths_give_no_entry(sqlite_url: str, tmp_path: Path) -> None:
    """A denial of a rule whose input the event does not hold (offload without a tier)
    gives no entry rather than a wrong one."""
    with AuditLog(sqlite_url, "w1", spool_path=tmp_path / "s.jsonl") as log:
        log.record(event(EventType.POLICY_DENIED, details={"path": "kvgov/offload/decision"}))
        log.record(event(EventType.POLICY_DENIED, details={
            "path": "kvgov/offload/decision", "tier": "disk", "reason": "no"}))  # fmt: skip
    with AuditQueries(sqlite_url) as q:
        records = list(q.iter_events(DECISION_EVENT_TYPES))
    assert decision_log_entries(records[0]) == []
    (entry,) = decision_log_entries(records[1])
    assert entry["input"] == {"scope": SCOPE, "tier": "disk"}
    assert entry["result"] == {"allow": False, "reason": "no"}


def test_export_command_writes_one_json_object_per_line(trail: str, tmp_path: Path) -> None:
    """`kvgov audit export --format opa-decision-log` writes the entries as JSON lines
    and says how many decisions it wrote."""
    out = tmp_path / "decisions.jsonl"
    result = CliRunner().invoke(
        audit_group,
        ["export", "--format", "opa-decision-log", "--url", trail, "--output", str(out)],
    )
    assert result.exit_code == 0, result.output
    assert "exported 8 decisions" in result.output
    lines = out.read_text().splitlines()
    assert [json.loads(line) for line in lines] == entries(trail)
    stdout = CliRunner().invoke(
        audit_group, ["export", "--format", "opa-decision-log", "--url", trail]
    )
    assert stdout.output.count('"decision_id"') == 8


def test_write_decision_log_counts_what_it_writes() -> None:
    """write_decision_log writes compact JSON, one entry per line, and returns the count."""
    import io

    buf = io.StringIO()
    assert write_decision_log(buf, [{"a": "é"}, {"b": 1}]) == 2
    assert buf.getvalue() == '{"a":"é"}\n{"b":1}\n'
