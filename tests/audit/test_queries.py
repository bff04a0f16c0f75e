"""Compliance queries: reuse, erasure, denials, decisions, events, counts, export."""

from __future__ import annotations

import csv
import io
import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from kvgov.audit import AuditEvent, AuditLog, AuditQueries, EventType
from kvgov.exceptions import AuditError, InvalidTimeBound

from .conftest import FixedClock

T0 = datetime.fromtimestamp(1_700_000_000, tz=UTC)


@pytest.fixture()
def filled(db_url: str, tmp_path: Path, clock: FixedClock) -> str:
    """A database holding a small, known mix of events."""
    with AuditLog(db_url, "w1", clock=clock, spool_path=tmp_path / "s.jsonl") as log:
        log.record(AuditEvent(EventType.ADMISSION, tenant="acme", token_count=64,
                              decision_id="d1", policy_revision="rev-a"))  # fmt: skip
        log.record(AuditEvent(EventType.REUSE, tenant="acme", requester_tenant="acme",
                              block_ids=(1, 2), reused_tokens=32, decision_id="d2",
                              policy_revision="rev-a"))  # fmt: skip
        log.record(AuditEvent(EventType.CROSS_TENANT_REUSE, tenant="acme",
                              requester_tenant="beta", block_ids=(1,), reused_tokens=16,
                              decision_id="d3", policy_revision="rev-b"))  # fmt: skip
        log.record(AuditEvent(EventType.SHARE_DENIED, tenant="acme", requester_tenant="gamma",
                              decision_id="d4", policy_revision="rev-b",
                              details={"reason": "not in share group"}))  # fmt: skip
        log.record(AuditEvent(EventType.POLICY_ERROR, tenant="beta", decision_id="d5",
                              details={"reason": "engine timeout"}))  # fmt: skip
        log.record(AuditEvent(EventType.ERASURE, tenant="acme", block_ids=(1, 2, 3),
                              details={"blocks": 3, "bytes_zeroized": 3 * 4096,
                                       "verified": True}))  # fmt: skip
    return db_url


def test_reuse_lists_who_reused_under_which_decision(filled: str) -> None:
    """reuse(T) returns both reuse kinds of T's blocks with requester and decision."""
    with AuditQueries(filled) as q:
        rows = q.reuse("acme")
        assert [(r.requester_tenant, r.decision_id, r.policy_revision) for r in rows] == [
            ("acme", "d2", "rev-a"),
            ("beta", "d3", "rev-b"),
        ]
        assert q.reuse("beta") == ()


def test_reuse_time_window(filled: str) -> None:
    """since is inclusive and until exclusive, in UTC."""
    with AuditQueries(filled) as q:
        first, second = q.reuse("acme")
        assert q.reuse("acme", since=second.time) == (second,)
        assert q.reuse("acme", until=second.time) == (first,)


def test_erasure_evidence(filled: str) -> None:
    """erasure(T) returns the erasure event with its zeroization details."""
    with AuditQueries(filled) as q:
        (ev,) = q.erasure("acme")
        assert ev.details == {"blocks": 3, "bytes_zeroized": 12288, "verified": True}
        assert ev.block_ids == (1, 2, 3) and ev.event_id == "w1:6"


def test_denials_by_owner_or_requester(filled: str) -> None:
    """denials() includes share denials and policy errors; a tenant filter matches both roles."""
    with AuditQueries(filled) as q:
        assert [r.decision_id for r in q.denials()] == ["d4", "d5"]
        assert [r.decision_id for r in q.denials("gamma")] == ["d4"]
        assert [r.decision_id for r in q.denials("beta")] == ["d5"]


def test_decisions_and_events_and_counts(filled: str) -> None:
    """decisions(R), events(type, tenant) and counts() agree with what was written."""
    with AuditQueries(filled) as q:
        assert [r.decision_id for r in q.decisions("rev-b")] == ["d3", "d4"]
        assert len(q.events(type=EventType.ERASURE)) == 1
        assert len(q.events(tenant="acme")) == 5
        assert len(q.events(limit=2)) == 2
        assert q.counts("type")["cross_tenant_reuse"] == 1
        assert q.counts("tenant") == {"acme": 5, "beta": 1}
        with pytest.raises(ValueError):
            q.counts("details")


def test_export_jsonl_and_csv(filled: str) -> None:
    """export writes every event; no token or text field exists in the output."""
    with AuditQueries(filled) as q:
        buf = io.StringIO()
        assert q.export(buf, "jsonl") == 6
        lines = [json.loads(line) for line in buf.getvalue().splitlines()]
        assert {"event_id", "hash", "details"} <= set(lines[0])
        assert not {"tokens", "token_ids", "text", "prompt"} & set(lines[0])
        buf = io.StringIO()
        q.export(buf, "csv")
        assert len(list(csv.reader(io.StringIO(buf.getvalue())))) == 7


def test_checkpoints_latest_per_stream(filled: str) -> None:
    """checkpoints() lists the latest checkpoint per stream, for keeping a copy."""
    with AuditQueries(filled) as q:
        (cp,) = q.checkpoints()
        assert cp.stream == "w1" and cp.seq == 6 and len(cp.signature) == 128


def test_time_bounds_as_iso_strings_and_aware_datetimes(filled: str) -> None:
    """An ISO 8601 string (with or without offset: UTC) and an aware datetime in any
    zone bound the window alike."""
    with AuditQueries(filled) as q:
        first, second = q.reuse("acme")
        iso = second.time.isoformat()
        assert q.reuse("acme", since=iso) == (second,)
        assert q.reuse("acme", until=iso) == (first,)
        naive_text = second.time.replace(tzinfo=None).isoformat()  # UTC by convention
        assert q.reuse("acme", since=naive_text) == (second,)
        plus2 = second.time.astimezone(timezone(timedelta(hours=2)))
        assert q.reuse("acme", since=plus2) == (second,)
        assert q.events(since=plus2.isoformat(), until=None)[0] == second


def test_a_naive_datetime_is_refused_with_a_typed_error(filled: str) -> None:
    """A naive datetime (local or UTC? unknown) raises InvalidTimeBound, a ValueError
    with a one-line reason naming the parameter, before any query runs."""
    with AuditQueries(filled) as q:
        with pytest.raises(InvalidTimeBound) as info:
            q.reuse("acme", until=datetime(2030, 1, 1))
        assert isinstance(info.value, AuditError) and isinstance(info.value, ValueError)
        assert info.value.name == "until" and "naive" in str(info.value)
        assert "\n" not in str(info.value)
        with pytest.raises(InvalidTimeBound, match="since="):
            q.denials(since=datetime(2030, 1, 1))
        with pytest.raises(InvalidTimeBound, match="ISO 8601"):
            q.events(since="last tuesday")
        with pytest.raises(InvalidTimeBound):
            list(q.iter_events(until=datetime(2030, 1, 1)))
