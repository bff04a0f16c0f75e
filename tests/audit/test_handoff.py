"""``AuditLog(writer="process")``: the same trail as the writer thread, typed errors.

The fault cases (writer process killed or frozen, engine killed) are in
tests/faults/test_writer_process_faults.py; these run in ``make test``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from kvgov.audit import AuditEvent, AuditLog, AuditQueries, EventType, downgrade, upgrade, verify
from kvgov.audit.events import CompactEvent, event_from_record, event_record
from kvgov.audit.handoff import ProcessAuditLog
from kvgov.audit.store import normalize_url
from kvgov.exceptions import AuditSchemaError, AuditUnavailable, InvalidAuditEvent

from .conftest import sample_event


def _rows(url: str) -> list[tuple[object, ...]]:
    engine = create_engine(normalize_url(url))
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT * FROM audit_events ORDER BY stream, seq")).all()
    finally:
        engine.dispose()
    return [tuple(r) for r in rows]


def _workload(log: AuditLog) -> list[str]:
    ids = [log.record(sample_event(i)) for i in range(40)]
    recorded = log.record_durable(AuditEvent(EventType.ERASURE, tenant="acme"))
    assert recorded.stored
    ids.append(recorded.event_id)
    deferred = log.defer(AuditEvent(EventType.CROSS_TENANT_REUSE, tenant="acme"))
    ids.append(deferred.event_id)
    assert deferred.wait().stored
    ids += [log.record(sample_event(i)) for i in range(40, 60)]
    ids.append(log.record(AuditEvent(EventType.POLICY_DENIED, tenant="beta")))  # critical
    log.flush()
    return ids


def test_both_writers_write_the_same_trail(tmp_path: Path) -> None:
    """One workload through each writer, the same clock: row for row the same events,
    hash for hash the same chain (one time for all), the same ids, the same query answers."""
    urls, ids = {}, {}
    for writer in ("thread", "process"):
        urls[writer] = f"sqlite:///{tmp_path / writer}.db"
        log = AuditLog(
            urls[writer],
            "w1",
            # one reading for every event: the writers read the clock a different number
            # of times besides (the thread's checkpoint cadence, the process's own clock)
            clock=lambda: 1_700_000_000.25,
            spool_path=tmp_path / f"{writer}.spool.jsonl",
            writer=writer,  # type: ignore[arg-type]
        )
        assert isinstance(log, ProcessAuditLog) == (writer == "process")
        ids[writer] = _workload(log)
        stats = log.stats()
        assert stats.recorded == stats.durable_seq == stats.stored_seq == 63
        assert stats.in_memory == 0 and stats.unavailable is None
        log.close()
        assert verify(urls[writer]).ok
    assert ids["thread"] == ids["process"] == [f"w1:{s}" for s in range(1, 64)]
    assert _rows(urls["thread"]) == _rows(urls["process"])
    with AuditQueries(urls["thread"]) as a, AuditQueries(urls["process"]) as b:
        assert a.denials() == b.denials() and a.erasure("acme") == b.erasure("acme")
        assert a.counts("type") == b.counts("type")


def test_closed_process_log_refuses(tmp_path: Path) -> None:
    """After close, record raises (typed); close again is a no-op; bad input is typed."""
    log = AuditLog(f"sqlite:///{tmp_path / 'a.db'}", "w1", writer="process")
    with pytest.raises(InvalidAuditEvent, match=r"takes an audit\.AuditEvent"):
        log.record({"type": "admission"})  # type: ignore[arg-type]
    log.record(sample_event(1))
    log.close()
    log.close()
    with pytest.raises(AuditUnavailable, match="closed"):
        log.record(sample_event(2))


def test_unknown_writer_is_refused(tmp_path: Path) -> None:
    with pytest.raises(InvalidAuditEvent, match="writer"):
        AuditLog(f"sqlite:///{tmp_path / 'a.db'}", "w1", writer="fork")  # type: ignore[arg-type]


def test_writer_process_start_errors_are_typed(tmp_path: Path) -> None:
    """The writer process's error at start reaches the caller as the same typed error."""
    url = f"sqlite:///{tmp_path / 'a.db'}"
    upgrade(url)
    downgrade(url, "base")
    with pytest.raises(AuditSchemaError, match="kvgov db upgrade"):
        AuditLog(url, "w1", writer="process", auto_upgrade=False)
    with pytest.raises(InvalidAuditEvent, match="worker_id"):
        AuditLog(url, "", writer="process")


def test_compact_record_round_trip() -> None:
    """The hand-off's tuple rebuilds an event the sealer reads field for field alike."""
    event = sample_event(3)
    compact = event_from_record(event_record(event))
    assert isinstance(compact, CompactEvent)
    assert tuple(compact) == event_record(event)
    assert compact.details == event.details and compact.block_ids == event.block_ids
    with pytest.raises(InvalidAuditEvent):
        event_from_record(("nonsense", *event_record(event)[1:]))
    with pytest.raises(InvalidAuditEvent):
        event_from_record(event_record(event)[:-1])


@pytest.mark.parametrize("native", [False, True], ids=["pure", "native"])
@pytest.mark.parametrize("count", [0, 15, 16, 256])
def test_a_packed_hand_off_seals_as_the_event(native: bool, count: int) -> None:
    """The writer process's records carry many block ids packed (``packed_record``); the
    record it rebuilds seals to the same row as the event itself, in either sealer."""
    from kvgov.audit.chain import GENESIS_HASH
    from kvgov.audit.events import RECORD_FIELDS, event_from_record, packed_record
    from kvgov.audit.sealer import Sealer
    from kvgov.audit.signing import SigningKey
    from tests.support.native import native_link_skip

    if native and native_link_skip() is not None:
        pytest.skip(native_link_skip())
    event = AuditEvent(
        EventType.ADMISSION, tenant="t", block_ids=tuple(range(2**40, 2**40 + count))
    )
    record = packed_record(event)
    assert isinstance(record[RECORD_FIELDS.index("block_ids")], bytes) is (count >= 16)
    rebuilt = event_from_record(record)
    assert list(rebuilt.block_ids) == list(event.block_ids)
    key = SigningKey.ephemeral()
    rows: list[list[object]] = [[], []]
    for out, ev in zip(rows, (rebuilt, event), strict=True):
        Sealer("s", key, lambda: 1.0, 0, GENESIS_HASH, -1, 10**6, 60.0, native=native).seal(
            [(1, 5, ev)], out, []
        )
    assert rows[0] == rows[1]
