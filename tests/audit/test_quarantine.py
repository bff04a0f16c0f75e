"""Finding B of issue 17: a record the store refuses never blocks the events behind it.

It is quarantined (kept on disk, counted, named by an ``audit_gap`` event, listed by
``kvgov audit status`` and ``quarantine list``) and can be replayed once the cause
is fixed; it is never dropped and never replayed forever.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, text

from kvgov.audit import AuditEvent, AuditLog, EventType, verify
from kvgov.audit.sealer import Sealer
from kvgov.audit.signing import SigningKey
from kvgov.audit.spool import Quarantine, Spool, quarantine_path
from kvgov.audit.store import normalize_url
from kvgov.cli.audit import audit_group

from .conftest import FixedClock, sample_event, scalar, sqlite_locked

POISON_SQLITE = (
    "CREATE TRIGGER poison BEFORE INSERT ON audit_events WHEN NEW.tenant = 'poison' "
    "BEGIN SELECT RAISE(ABORT, 'poisoned by the test'); END"
)
POISON_PG = (
    "CREATE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    "IF NEW.tenant = 'poison' THEN RAISE EXCEPTION 'poisoned by the test' "
    "USING ERRCODE = 'check_violation'; END IF; RETURN NEW; END $$",
    "CREATE TRIGGER poison BEFORE INSERT ON audit_events FOR EACH ROW EXECUTE FUNCTION poison()",
)


def _sql(url: str, *statements: str) -> None:
    engine = create_engine(normalize_url(url))
    try:
        with engine.begin() as conn:
            for s in statements:
                conn.execute(text(s))
    finally:
        engine.dispose()


def _poison(url: str) -> None:
    _sql(url, *(POISON_PG if url.startswith("postgresql") else (POISON_SQLITE,)))


def _cure(url: str) -> None:
    if url.startswith("postgresql"):
        _sql(url, "DROP TRIGGER poison ON audit_events", "DROP FUNCTION poison()")
    else:
        _sql(url, "DROP TRIGGER poison")


def _types(url: str) -> list[str]:
    engine = create_engine(normalize_url(url))
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT type FROM audit_events ORDER BY seq")).all()
    engine.dispose()
    return [r[0] for r in rows]


def test_a_refused_record_is_quarantined_and_the_rest_is_stored(
    db_url: str, tmp_path: Path
) -> None:
    """One event the database refuses: the nine around it are stored, it is kept aside."""
    _poison(db_url)
    spool = tmp_path / "w1.spool.jsonl"
    with AuditLog(db_url, "w1", spool_path=spool) as log:
        for i in range(10):
            ev = sample_event(i)
            if i == 3:
                ev = AuditEvent(EventType.ADMISSION, tenant="poison", sequence_id="req-3")
            log.record(ev)
    stats = log.stats()
    assert stats.quarantined == 1 and stats.in_memory == 0 and stats.recorded == 11
    assert int(scalar(db_url, "SELECT count(*) FROM audit_events WHERE seq <= 10")) == 9  # type: ignore[arg-type]
    assert "audit_gap" in _types(db_url)
    details = scalar(db_url, "SELECT details FROM audit_events WHERE type = 'audit_gap'")
    gap = details if isinstance(details, dict) else json.loads(str(details))
    assert gap["cause"] == "quarantined" and gap["seqs"] == [4]
    report = verify(db_url)
    assert [(p.seq, p.kind) for p in report.problems] == [(5, "seq_gap")]  # honest: 4 is missing

    listed = CliRunner().invoke(
        audit_group, ["quarantine", "list", "--spool", str(spool), "--json"]
    )
    assert listed.exit_code == 0, listed.output
    assert [(q["seq"], q["kind"]) for q in json.loads(listed.output)] == [(4, "event")]
    status = CliRunner().invoke(audit_group, ["status", "--spool", str(spool), "--json"])
    assert json.loads(status.output)[0]["quarantined"][0]["seq"] == 4

    refused = CliRunner().invoke(
        audit_group, ["quarantine", "replay", "--url", db_url, "--spool", str(spool)]
    )
    assert refused.exit_code == 1 and "still refused" in refused.output  # cause not fixed yet
    _cure(db_url)
    replayed = CliRunner().invoke(
        audit_group, ["quarantine", "replay", "--url", db_url, "--spool", str(spool)]
    )
    assert replayed.exit_code == 0, replayed.output
    assert "1 stored, 0 still quarantined" in replayed.output
    assert Quarantine(quarantine_path(spool)).outstanding() == []
    assert verify(db_url).ok


def _sealed(stream: str, events: list[AuditEvent]) -> tuple[list[tuple[object, ...]], list[object]]:
    rows: list[tuple[object, ...]] = []
    cps: list[object] = []
    sealer = Sealer(stream, SigningKey.ephemeral(), FixedClock(), 0, bytes(32), -1, 10**6, 3600.0)  # type: ignore[arg-type]
    clock = FixedClock()
    sealer.seal(
        [(i + 1, round(clock() * 1e6), ev) for i, ev in enumerate(events)],
        rows,  # type: ignore[arg-type]
        cps,  # type: ignore[arg-type]
    )
    return rows, cps


@pytest.mark.postgres
def test_a_spool_jammed_by_a_record_postgresql_refuses_replays_the_rest(
    pg_url: str, tmp_path: Path
) -> None:
    """A spool left by an older kvgov with a NUL byte no longer replays forever."""
    from kvgov.audit import upgrade

    upgrade(pg_url)
    bad = AuditEvent(EventType.ADMISSION, sequence_id="ok")
    object.__setattr__(bad, "sequence_id", "req\x00-4")  # what AuditEvent now refuses
    events = [sample_event(i) for i in range(3)] + [bad] + [sample_event(i) for i in range(4, 8)]
    rows, cps = _sealed("w1", events)
    spool = tmp_path / "w1.spool.jsonl"
    Spool(spool).append(rows, cps)  # type: ignore[arg-type]
    with AuditLog(pg_url, "w1", spool_path=spool) as log:
        assert log.stats().quarantined == 1
        log.record(sample_event(99))
    assert not spool.exists()
    assert int(scalar(pg_url, "SELECT count(*) FROM audit_events WHERE seq <= 8")) == 7  # type: ignore[arg-type]
    assert int(scalar(pg_url, "SELECT max(seq) FROM audit_events")) == 10  # type: ignore[arg-type]  # gap event, then 99
    [q] = Quarantine(quarantine_path(spool)).outstanding()
    assert q.seq == 4 and "NUL" in q.refused


def test_a_damaged_spool_line_is_quarantined_and_the_rest_replayed(
    sqlite_url: str, tmp_path: Path
) -> None:
    """A line that does not parse (disk damage) no longer stops the replay."""
    from kvgov.audit import upgrade

    upgrade(sqlite_url)
    rows, cps = _sealed("w1", [sample_event(i) for i in range(4)])
    spool = tmp_path / "w1.spool.jsonl"
    Spool(spool).append(rows[:2])  # type: ignore[arg-type]
    with spool.open("a") as f:
        f.write('{"kind": "event", "stream": "w1", "seq": \n')  # damaged, then more lines
    Spool(spool).append(rows[2:], cps)  # type: ignore[arg-type]
    assert len(Spool(spool).read().damaged) == 1
    with AuditLog(sqlite_url, "w1", spool_path=spool) as log:
        assert log.stats().damaged_lines == 1
    assert _types(sqlite_url)[:4] == ["admission", "reuse", "eviction", "release"]
    [q] = Quarantine(quarantine_path(spool)).outstanding()
    assert q.kind == "damaged" and q.record.startswith('{"kind": "event"')


def test_a_torn_last_line_is_ended_before_the_next_append(tmp_path: Path) -> None:
    """A crash mid-write leaves a partial line; the next append starts a fresh line."""
    rows, _ = _sealed("w1", [sample_event(i) for i in range(2)])
    spool = tmp_path / "w1.spool.jsonl"
    Spool(spool).append(rows[:1])  # type: ignore[arg-type]
    with spool.open("a") as f:
        f.write('{"kind": "event", "str')  # the crash
    Spool(spool).append(rows[1:])  # type: ignore[arg-type]
    contents = Spool(spool).read()
    assert [r[1] for r in contents.events] == [1, 2] and len(contents.damaged) == 1


def test_quarantine_and_spool_are_prometheus_metrics(sqlite_url: str, tmp_path: Path) -> None:
    """AuditCollector exposes the quarantine count and the spool for alerting."""
    from prometheus_client import CollectorRegistry

    from kvgov.audit import upgrade
    from kvgov.audit.metrics import AuditCollector

    upgrade(sqlite_url)
    _poison(sqlite_url)
    with AuditLog(sqlite_url, "w1", spool_path=tmp_path / "w1.spool.jsonl") as log:
        log.record(AuditEvent(EventType.ADMISSION, tenant="poison"))
        log.flush()  # quarantines the poisoned record and records an audit_gap event ...
        log.flush()  # ... which this one writes (flush covers what was recorded before it)
        registry = CollectorRegistry()
        registry.register(AuditCollector(log))
        value = registry.get_sample_value
        assert value("kvgov_audit_quarantined_records_total", {"stream": "w1"}) == 1
        assert value("kvgov_audit_unavailable", {"stream": "w1"}) == 0
        assert value("kvgov_audit_critical_spooled_events", {"stream": "w1"}) == 0
        assert value("kvgov_audit_queue_depth", {"stream": "w1"}) == 0  # flushed
        assert value("kvgov_audit_spool_bytes", {"stream": "w1"}) == 0


def test_spool_size_and_queue_depth_are_prometheus_metrics(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the database is locked: the spool's events and bytes, the critical ones, the queue."""
    from prometheus_client import CollectorRegistry

    from kvgov.audit import store as store_mod
    from kvgov.audit import upgrade
    from kvgov.audit.metrics import AuditCollector

    upgrade(sqlite_url)
    monkeypatch.setattr(store_mod, "SQLITE_BUSY_TIMEOUT_MS", 50)
    spool = tmp_path / "w1.spool.jsonl"
    log = AuditLog(sqlite_url, "w1", spool_path=spool, retry_seconds=60.0)
    registry = CollectorRegistry()
    registry.register(AuditCollector(log))
    value = registry.get_sample_value
    log.record(sample_event(0))
    log.flush()
    with sqlite_locked(sqlite_url):
        rec = log.record_durable(AuditEvent(EventType.ERASURE, tenant="acme"))
        assert rec.evidence == "spooled"
        for i in range(3):  # queued behind the database's retry wait
            log.record(sample_event(i))
        labels = {"stream": "w1"}
        assert value("kvgov_audit_spool_bytes", labels) == spool.stat().st_size > 0
        assert value("kvgov_audit_spool_events", labels) == log.stats().spooled >= 1
        assert value("kvgov_audit_spooled_events_total", labels) >= 1
        assert value("kvgov_audit_critical_spooled_events", labels) == 1
        assert value("kvgov_audit_queue_depth", labels) == log.stats().queue_depth == 3
    log.close()
    assert not spool.exists()
