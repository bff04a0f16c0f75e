"""A writer killed with SIGKILL: bounded loss, and the loss is visible (issue 17).

Events a killed process held only in memory are lost; they are bounded (the writer
stores or spools within ``max_queue_age`` while it keeps up), and the next start of
the stream records an ``audit_gap`` event naming the last sequence number that
reached the store, so the loss is in the trail instead of silent.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kvgov.audit import AuditLog, verify

from .conftest import sample_event, scalar

WRITER = """
import sys, time
from kvgov.audit import AuditEvent, AuditLog, EventType
url, spool, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
log = AuditLog(url, "w1", spool_path=spool)
i = 0
while n < 0 or i < n:
    log.record(AuditEvent(EventType.ADMISSION, tenant="acme", sequence_id=f"r{i}"))
    i += 1
    if i % 200 == 0 or i == n:
        print(i, flush=True)
while True:
    time.sleep(1)  # recorded, never closed: waits for SIGKILL
"""
BOUND = 10.0


def _start(url: str, spool: Path, n: int) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", WRITER, url, str(spool), str(n)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "KVGOV_LOG_LEVEL": "error"},
    )


def _count(url: str) -> int:
    return int(scalar(url, "SELECT count(*) FROM audit_events"))  # type: ignore[arg-type]


def _gap(url: str) -> dict[str, Any]:
    details = scalar(url, "SELECT details FROM audit_events WHERE type = 'audit_gap'")
    return details if isinstance(details, dict) else json.loads(str(details))


def _kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(BOUND)


def test_events_of_an_idle_killed_writer_were_stored_and_the_restart_records_the_gap(
    sqlite_url: str, tmp_path: Path
) -> None:
    """Recorded events reach the store within the bound without close(); kill -9 loses none."""
    spool = tmp_path / "w1.spool.jsonl"
    proc = _start(sqlite_url, spool, 500)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "200"
        while proc.stdout.readline().strip() != "500":
            pass
        deadline = time.monotonic() + BOUND
        while _count(sqlite_url) < 500 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _count(sqlite_url) == 500  # durable although the process never closed
    finally:
        _kill(proc)
    with AuditLog(sqlite_url, "w1", spool_path=spool) as log:
        assert log.record(sample_event(0)) == "w1:502"  # 501 is the gap event
    gap = _gap(sqlite_url)
    assert gap["cause"] == "unclean_stop" and gap["last_stored_seq"] == 500
    assert gap["previous_pid"] == proc.pid
    assert verify(sqlite_url).ok


def test_a_writer_killed_mid_stream_leaves_a_gap_event_naming_what_reached_the_store(
    sqlite_url: str, tmp_path: Path
) -> None:
    """SIGKILL while recording: the restart names the last stored seq; the chain verifies."""
    spool = tmp_path / "w1.spool.jsonl"
    proc = _start(sqlite_url, spool, -1)
    try:
        assert proc.stdout is not None
        assert int(proc.stdout.readline()) > 0
        deadline = time.monotonic() + BOUND
        while _count(sqlite_url) == 0 and time.monotonic() < deadline:
            time.sleep(0.01)  # killed while it writes, after some events reached the store
    finally:
        _kill(proc)
    with AuditLog(sqlite_url, "w1", spool_path=spool) as log:
        log.record(sample_event(0))
    gap = _gap(sqlite_url)
    gap_seq = int(scalar(sqlite_url, "SELECT seq FROM audit_events WHERE type = 'audit_gap'"))  # type: ignore[arg-type]
    assert gap["last_stored_seq"] == gap_seq - 1 >= 1  # everything before it is stored
    assert _count(sqlite_url) == gap_seq + 1
    assert verify(sqlite_url).ok


def test_a_clean_close_leaves_no_gap(sqlite_url: str, tmp_path: Path) -> None:
    """close() removes the run marker: the next start records no gap event."""
    spool = tmp_path / "w1.spool.jsonl"
    for _ in range(2):
        with AuditLog(sqlite_url, "w1", spool_path=spool) as log:
            log.record(sample_event(0))
    assert scalar(sqlite_url, "SELECT count(*) FROM audit_events WHERE type = 'audit_gap'") == 0
