"""``AuditLog(writer="process")`` under faults: its writer process killed, frozen, and
its engine killed.

The rules are docs/audit.md's, unchanged by the hand-off: a critical event is durable
when ``record`` returns, or ``record`` raises and the caller refuses the act; a writer
killed at any point loses nothing (the engine keeps every event until the writer says
it is durable, and sends it again to the writer it starts next); while no writer
serves, what needs evidence fails closed; an engine killed loses nothing its writer
received. Each case reports its figures (conftest.FaultReport).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from kvgov.audit import AuditEvent, AuditLog, EventType, verify
from kvgov.audit.handoff import ProcessAuditLog
from kvgov.audit.store import normalize_url
from kvgov.exceptions import AuditUnavailable

from .conftest import FaultReport
from .load import Load
from .load import seq as _seq

BOUND = 20.0  # seconds: a writer process starts within this even on a loaded machine
ROOT = Path(__file__).resolve().parents[2]


def _rows(url: str, stream: str) -> list[tuple[int, str, str]]:
    engine = create_engine(normalize_url(url))
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text("SELECT seq, type, details FROM audit_events WHERE stream = :s ORDER BY seq"),
                {"s": stream},
            ).all()
    finally:
        engine.dispose()
    return [(int(r[0]), str(r[1]), str(r[2])) for r in rows]


def _wait(pred: Callable[[], bool], what: str, bound: float = BOUND) -> None:
    deadline = time.monotonic() + bound
    while not pred():
        assert time.monotonic() < deadline, f"timed out waiting: {what}"
        time.sleep(0.01)


def _log(tmp_path: Path, stream: str, **kw: float) -> ProcessAuditLog:
    log = AuditLog(
        f"sqlite:///{tmp_path / 'audit.db'}",
        stream,
        spool_path=tmp_path / f"{stream}.spool.jsonl",
        writer="process",
        critical_deadline=kw.get("critical_deadline", 1.0),
        max_queue_age=0.5,
        retry_seconds=0.2,
    )
    assert isinstance(log, ProcessAuditLog)
    return log


def _down(log: ProcessAuditLog) -> bool:
    try:
        log.raise_if_unavailable()
    except AuditUnavailable:
        return True
    return False


def test_writer_process_killed_twice_during_load(tmp_path: Path, fault_report: FaultReport) -> None:
    """SIGKILL of the writer process under load, twice: a new one continues the chain,
    every acknowledged event is stored, no hole, no gap event; erasures fail closed
    while no writer serves."""
    log = _log(tmp_path, "killed")
    load = Load(log, bound=BOUND)
    load.start()
    pids = []
    try:
        for _ in range(2):
            time.sleep(0.5)
            pid = log.writer_pid
            assert pid is not None
            pids.append(pid)
            os.kill(pid, signal.SIGKILL)
            _wait(lambda p=pid: log.writer_pid not in (None, p), "a new writer process")
        time.sleep(0.5)
    finally:
        load.stop()
        log.close()
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    rows = _rows(url, "killed")
    stored = {r[0] for r in rows}
    figures = {
        "written": len(stored),
        "spooled": log.stats().spooled_total,
        "quarantined": log.stats().quarantined,
        "lost": len({_seq(i) for i in load.ordinary} - stored),
        "critical_lost": len({_seq(i) for i in load.critical} - stored),
        "critical_refused": load.refused,
        "slowest_critical_ms": round(load.slowest_critical * 1000),
    }
    fault_report.add("writer process kill -9, twice, during load", **figures)
    assert figures["lost"] == 0 and figures["critical_lost"] == 0
    assert sorted(stored) == list(range(1, max(stored) + 1)), "a hole in the chain"
    assert not [r for r in rows if r[1] == "audit_gap"], "nothing was lost: no gap to record"
    assert load.slowest_critical < BOUND
    assert verify(url).ok


def test_writer_process_down_fails_closed_then_recovers(tmp_path: Path) -> None:
    """While no writer serves, an erasure raises at once (typed), ordinary events are
    kept; a new writer takes them, and erasures are durable again."""
    log = _log(tmp_path, "down")
    try:
        first = log.record_durable(AuditEvent(EventType.ERASURE, tenant="a"))
        assert first.stored
        pid = log.writer_pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)  # it cannot answer: the engine's deadline decides
        t0 = time.monotonic()
        with pytest.raises(AuditUnavailable, match="did not acknowledge"):
            log.record(AuditEvent(EventType.ERASURE, tenant="a"))
        assert time.monotonic() - t0 < 1.0 + 0.5  # critical_deadline, and scheduling slack
        kept = log.record(AuditEvent(EventType.ADMISSION, tenant="a"))
        os.kill(pid, signal.SIGKILL)
        _wait(lambda: _down(log), "the writer's death seen")
        if log.writer_pid is None:  # (a fast restart may already be back)
            t0 = time.monotonic()
            with pytest.raises(AuditUnavailable, match="writer process"):
                log.record(AuditEvent(EventType.ERASURE, tenant="a"))
            assert time.monotonic() - t0 < 0.5  # at once, not after the deadline
        _wait(lambda: log.writer_pid not in (None, pid), "a new writer process")
        again = log.record_durable(AuditEvent(EventType.ERASURE, tenant="a"))
        assert again.stored
        log.flush()
    finally:
        log.close()
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    stored = {r[0] for r in _rows(url, "down")}
    assert _seq(kept) in stored and _seq(again.event_id) in stored
    assert sorted(stored) == list(range(1, max(stored) + 1))
    assert verify(url).ok


ENGINE = """
import os, signal, sys, time
from kvgov.audit import AuditEvent, AuditLog, EventType
log = AuditLog(sys.argv[1], "engine", spool_path=sys.argv[2], writer="process")
print("PID", log.writer_pid, flush=True)
ids = [log.record(AuditEvent(EventType.ADMISSION, tenant="a", block_ids=(i,))) for i in range(500)]
time.sleep(0.5)  # ten sender intervals: the writer has them all
print("HANDED", ids[-1], flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_engine_killed_writer_keeps_what_it_received(
    tmp_path: Path, fault_report: FaultReport
) -> None:
    """SIGKILL of the engine: its writer process stores every event it received, exits,
    and keeps the run marker, so the engine's next start records the gap."""
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    spool = tmp_path / "engine.spool.jsonl"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", ENGINE, url, str(spool)],
        capture_output=True, text=True, timeout=120, env=env, cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == -signal.SIGKILL, out.stderr
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines())
    writer_pid, last = int(lines["PID"]), _seq(lines["HANDED"])

    def gone() -> bool:  # exited: no process, or a zombie nobody reaped yet
        try:
            stat = Path(f"/proc/{writer_pid}/stat").read_text()
        except OSError:
            return True
        return stat.rsplit(")", 1)[1].split()[0] == "Z"

    _wait(gone, "the orphaned writer process to finish and exit")
    stored = {r[0] for r in _rows(url, "engine")}
    fault_report.add(
        "engine kill -9 (writer process keeps what it received)",
        written=len(stored),
        spooled=0,
        quarantined=0,
        lost=len(set(range(1, last + 1)) - stored),
        critical_lost=0,
    )
    assert set(range(1, last + 1)) <= stored
    assert verify(url).ok
    with _log(tmp_path, "engine") as log:  # the engine's next start
        log.flush()
    rows = _rows(url, "engine")
    gaps = [json.loads(r[2]) for r in rows if r[1] == "audit_gap"]
    assert len(gaps) == 1 and gaps[0]["cause"] == "unclean_stop"
    assert gaps[0]["last_stored_seq"] == last
    assert verify(url).ok


def test_restarted_writer_hands_its_gap_event_to_the_engine(tmp_path: Path) -> None:
    """A writer killed with a damaged line in its spool: the next writer quarantines the
    line and its ``audit_gap`` event takes the engine's next number, after the events
    the engine sends again: no two events share a number."""
    log = _log(tmp_path, "torn")
    try:
        before = [log.record(AuditEvent(EventType.ADMISSION, tenant="a")) for _ in range(20)]
        log.flush()
        pid = log.writer_pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)
        held = [log.record(AuditEvent(EventType.ADMISSION, tenant="a")) for _ in range(20)]
        with log.spool_path.open("a") as spool:  # a line damaged on disk (a cut-short
            spool.write('{"kind": "event", "seq": 21, "da\n')  # last one is just dropped)
        os.kill(pid, signal.SIGKILL)
        _wait(lambda: log.writer_pid not in (None, pid), "a new writer process")
        after = log.record(AuditEvent(EventType.ADMISSION, tenant="a"))
        log.flush()
    finally:
        log.close()
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    rows = _rows(url, "torn")
    seqs = [r[0] for r in rows]
    assert seqs == list(range(1, len(rows) + 1)), "a hole or a number used twice"
    kinds = {r[0]: r[1] for r in rows}
    # every id the engine handed out is its own event (not the writer's gap event)
    assert all(kinds.get(_seq(i)) == "admission" for i in [*before, *held, after])
    gaps = [json.loads(r[2]) for r in rows if r[1] == "audit_gap"]
    assert len(gaps) == 1 and gaps[0]["cause"] == "quarantined", gaps
    assert verify(url).ok
