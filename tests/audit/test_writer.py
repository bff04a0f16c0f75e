"""AuditLog: batching, synchronous critical events, restart, spool and replay."""

from __future__ import annotations

import random
import socket
import sqlite3
import threading
from pathlib import Path
from typing import ClassVar

import pytest
from sqlalchemy import create_engine, text

from kvgov.audit import AuditEvent, AuditLog, EventType, upgrade, verify
from kvgov.audit import store as store_mod
from kvgov.audit import writer as writer_mod
from kvgov.audit.models import EVENT_INSERT_COLUMNS
from kvgov.audit.persist import HeldConnection, insert_sqlite
from kvgov.audit.store import normalize_url
from kvgov.exceptions import AuditUnavailable, InvalidAuditEvent
from kvgov.retry import Backoff
from tests.support.pg_proxy import ProxiedPg

from .conftest import FixedClock, sample_event, scalar


def _count(url: str, where: str = "1=1") -> int:
    return int(scalar(url, f"SELECT count(*) FROM audit_events WHERE {where}"))  # type: ignore[arg-type]


def test_record_returns_stream_and_seq_ids(db_url: str, tmp_path: Path) -> None:
    """Event ids are "<stream>:<seq>", numbered from 1 without gaps."""
    with AuditLog(db_url, "w1", spool_path=tmp_path / "s.jsonl") as log:
        ids = [log.record(sample_event(i)) for i in range(5)]
    assert ids == [f"w1:{i}" for i in range(1, 6)]
    assert _count(db_url) == 5


def test_derived_stream_id_has_host_and_pid(db_url: str, tmp_path: Path) -> None:
    """Without a worker id the stream is <hostname>-<pid>-<random>."""
    import os

    with AuditLog(db_url, spool_path=tmp_path / "s.jsonl") as log:
        assert log.stream_id.startswith(f"{socket.gethostname()[:64]}-{os.getpid()}-")


def test_critical_event_is_in_the_database_when_record_returns(db_url: str, tmp_path: Path) -> None:
    """A critical event and everything queued before it are written before record returns."""
    log = AuditLog(db_url, "w1", spool_path=tmp_path / "s.jsonl")
    try:
        for i in range(100):
            log.record(sample_event(i))
        log.record(AuditEvent(EventType.ERASURE, tenant="acme", details={"bytes": 4096}))
        assert _count(db_url) == 101
        assert _count(db_url, "type = 'erasure' AND seq = 101") == 1
    finally:
        log.close()


def test_flush_writes_queued_events(db_url: str, tmp_path: Path) -> None:
    """flush() drains the queue; non-critical events are not written synchronously."""
    log = AuditLog(db_url, "w1", spool_path=tmp_path / "s.jsonl", batch_size=10_000)
    try:
        for i in range(50):
            log.record(sample_event(i))
        log.flush()
        assert _count(db_url) == 50
    finally:
        log.close()


def test_restart_continues_the_chain(db_url: str, tmp_path: Path, clock: FixedClock) -> None:
    """A restarted worker with the same id continues from its last (seq, hash)."""
    for _ in range(2):
        with AuditLog(db_url, "w1", clock=clock, spool_path=tmp_path / "s.jsonl") as log:
            for i in range(7):
                log.record(sample_event(i))
    assert _count(db_url) == 14
    assert scalar(db_url, "SELECT max(seq) FROM audit_events") == 14
    report = verify(db_url)
    assert report.ok and report.streams[0].events == 14


def test_checkpoints_every_n_and_at_close(db_url: str, tmp_path: Path) -> None:
    """A new stream signs seq 0, then every N-th event and the last event at close."""
    with AuditLog(db_url, "w1", checkpoint_every=10, spool_path=tmp_path / "s.jsonl") as log:
        for i in range(25):
            log.record(sample_event(i))
    engine = create_engine(normalize_url(db_url))
    with engine.connect() as conn:
        seqs = [r[0] for r in conn.execute(text("SELECT seq FROM audit_checkpoints ORDER BY seq"))]
    engine.dispose()
    assert seqs == [0, 10, 20, 25]


def test_record_after_close_and_wrong_type_are_refused(db_url: str, tmp_path: Path) -> None:
    """A closed log refuses to record; a non-AuditEvent is a typed error."""
    log = AuditLog(db_url, "w1", spool_path=tmp_path / "s.jsonl")
    with pytest.raises(InvalidAuditEvent):
        log.record({"type": "admission"})  # type: ignore[arg-type]
    log.close()
    with pytest.raises(AuditUnavailable, match="closed"):
        log.record(sample_event(0))


def test_many_threads_keep_one_gapless_chain(db_url: str, tmp_path: Path) -> None:
    """Concurrent callers get distinct seqs and the chain verifies."""
    log = AuditLog(db_url, "w1", spool_path=tmp_path / "s.jsonl", batch_size=64)

    def work() -> None:
        for i in range(200):
            log.record(sample_event(i))
            if i % 50 == 0:
                log.record(AuditEvent(EventType.POLICY_DENIED, tenant="x"))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.close()
    assert _count(db_url) == 4 * 204
    assert verify(db_url).ok


# --------------------------------------------------------------------------- spool


def _lock_sqlite(url: str) -> tuple[object, object]:
    """Hold an exclusive lock so that every other writer fails: the database is 'down'."""
    engine = create_engine(normalize_url(url))
    conn = engine.raw_connection()
    conn.driver_connection.isolation_level = None  # type: ignore[union-attr]
    conn.cursor().execute("BEGIN EXCLUSIVE")
    return engine, conn


def test_sqlite_down_spools_and_replays(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While SQLite is locked, events (critical ones too) spool; they replay in order after."""
    monkeypatch.setattr(store_mod, "SQLITE_BUSY_TIMEOUT_MS", 50)
    spool = tmp_path / "w1.spool.jsonl"
    log = AuditLog(sqlite_url, "w1", spool_path=spool, retry_seconds=0.0, checkpoint_every=5)
    for i in range(3):
        log.record(sample_event(i))
    log.flush()
    engine, conn = _lock_sqlite(sqlite_url)
    try:
        for i in range(12):
            log.record(sample_event(i))
        log.record(AuditEvent(EventType.SHARE_DENIED, tenant="acme", requester_tenant="beta"))
        assert spool.exists() and log.spooled
        log.raise_if_unavailable()  # the spool works: still auditable
    finally:
        conn.rollback()  # type: ignore[attr-defined]
        conn.close()  # type: ignore[attr-defined]
        engine.dispose()  # type: ignore[attr-defined]
    log.flush()
    assert not spool.exists() and not log.spooled
    log.close()
    assert _count(sqlite_url) == 16
    report = verify(sqlite_url)
    assert report.ok and report.streams[0].checkpoints == 5


def test_leftover_spool_replays_on_restart(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spool left by a stopped worker is replayed when the same worker id starts again."""
    monkeypatch.setattr(store_mod, "SQLITE_BUSY_TIMEOUT_MS", 50)
    spool = tmp_path / "w1.spool.jsonl"
    log = AuditLog(sqlite_url, "w1", spool_path=spool, retry_seconds=3600)
    log.record(sample_event(0))
    log.flush()
    engine, conn = _lock_sqlite(sqlite_url)
    try:
        for i in range(5):
            log.record(sample_event(i))
        log.close()  # database still down: the final events and checkpoint stay spooled
    finally:
        conn.rollback()  # type: ignore[attr-defined]
        conn.close()  # type: ignore[attr-defined]
        engine.dispose()  # type: ignore[attr-defined]
    assert spool.exists()
    with AuditLog(sqlite_url, "w1", spool_path=spool) as log2:
        assert log2.record(sample_event(9)) == "w1:7"
    assert not spool.exists()
    assert _count(sqlite_url) == 7 and verify(sqlite_url).ok


class _NotedBackoff(Backoff):
    """The writer's Backoff, noting each wait it chose (for the test below)."""

    waits: ClassVar[list[float]] = []

    def failed(self) -> float:
        wait = super().failed()
        self.waits.append(wait)
        return wait


def test_database_retries_back_off_while_it_stays_down(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each failure in a row doubles the wait (1, 2, 4 s without jitter); a success resets it."""
    monkeypatch.setattr(store_mod, "SQLITE_BUSY_TIMEOUT_MS", 50)
    monkeypatch.setattr(writer_mod, "Backoff", _NotedBackoff)
    monkeypatch.setattr(random, "uniform", lambda a, b: a)
    monkeypatch.setattr(_NotedBackoff, "waits", [])
    log = AuditLog(sqlite_url, "w1", spool_path=tmp_path / "s.jsonl", retry_seconds=1.0)
    log.record(sample_event(0))
    log.flush()
    engine, conn = _lock_sqlite(sqlite_url)
    try:
        for i in range(3):
            log.record(sample_event(i))
            log.flush()  # tries the database at once, fails, spools
    finally:
        conn.rollback()  # type: ignore[attr-defined]
        conn.close()  # type: ignore[attr-defined]
        engine.dispose()  # type: ignore[attr-defined]
    assert _NotedBackoff.waits == [1.0, 2.0, 4.0]
    log.flush()  # the database answers: spool replayed, the count starts over
    engine, conn = _lock_sqlite(sqlite_url)
    try:
        log.record(sample_event(9))
        log.flush()
    finally:
        conn.rollback()  # type: ignore[attr-defined]
        conn.close()  # type: ignore[attr-defined]
        engine.dispose()  # type: ignore[attr-defined]
    assert _NotedBackoff.waits == [1.0, 2.0, 4.0, 1.0]
    log.close()
    assert verify(sqlite_url).ok


def test_no_database_and_no_spool_raises(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With neither database nor spool writable, critical record and flush raise."""
    monkeypatch.setattr(store_mod, "SQLITE_BUSY_TIMEOUT_MS", 50)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x")
    log = AuditLog(sqlite_url, "w1", spool_path=blocker / "s.jsonl", retry_seconds=0.0)
    engine, conn = _lock_sqlite(sqlite_url)
    try:
        log.record(sample_event(0))
        with pytest.raises(AuditUnavailable):
            log.record(AuditEvent(EventType.ERASURE, tenant="acme"))
        with pytest.raises(AuditUnavailable):
            log.raise_if_unavailable()
        with pytest.raises(AuditUnavailable):
            log.flush()
    finally:
        conn.rollback()  # type: ignore[attr-defined]
        conn.close()  # type: ignore[attr-defined]
        engine.dispose()  # type: ignore[attr-defined]
    log.flush()  # storage is back: the events kept in memory are written
    log.raise_if_unavailable()
    log.close()
    assert _count(sqlite_url) == 2 and verify(sqlite_url).ok


@pytest.mark.postgres
def test_postgresql_unreachable_spools_and_replays(pg_proxy: ProxiedPg, tmp_path: Path) -> None:
    """With the connection to PostgreSQL really cut, events spool; they replay when it returns."""
    url, proxy = pg_proxy.url, pg_proxy.proxy
    spool = tmp_path / "pg.spool.jsonl"
    log = AuditLog(url, "w1", spool_path=spool, retry_seconds=0.0, checkpoint_every=4)
    for i in range(5):
        log.record(sample_event(i))
    log.flush()
    proxy.kill()  # real connection failure: connections reset, new ones refused
    for i in range(6):
        log.record(sample_event(i))
    log.record(AuditEvent(EventType.CROSS_TENANT_REUSE, tenant="acme", requester_tenant="beta"))
    assert spool.exists()
    assert _count(pg_proxy.direct) == 5  # nothing new reached the database
    proxy.start()
    log.flush()
    assert not spool.exists()
    log.close()
    assert _count(pg_proxy.direct) == 12
    report = verify(pg_proxy.direct)
    assert report.ok and report.streams[0].last_seq == 12


def test_large_batches_are_stored_whole(db_url: str, tmp_path: Path) -> None:
    """A batch of every multi-row statement size (and a remainder) is stored and verifies."""
    n = 1024 + 128 + 16 + 3
    with AuditLog(db_url, "w1", spool_path=tmp_path / "s.jsonl", batch_size=5000) as log:
        for i in range(n):
            log.record(sample_event(i))
        log.flush()
        assert _count(db_url) == n
    assert verify(db_url).ok


def test_sqlite_insert_respects_a_low_variable_limit(tmp_path: Path) -> None:
    """With SQLite allowing only 999 bound variables, rows go in smaller statements."""
    url = f"sqlite:///{tmp_path / 'src.db'}"
    with AuditLog(url, "w1", spool_path=tmp_path / "s.jsonl") as log:
        for i in range(300):
            log.record(sample_event(i))
    upgrade(f"sqlite:///{tmp_path / 'dst.db'}")
    src = sqlite3.connect(tmp_path / "src.db")
    rows = src.execute("SELECT * FROM audit_events ORDER BY seq").fetchall()
    cols = [d[0] for d in src.execute("SELECT * FROM audit_events").description]
    src.close()
    dst = sqlite3.connect(tmp_path / "dst.db")
    dst.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 999)
    order = [cols.index(c) for c in EVENT_INSERT_COLUMNS]
    insert_sqlite(dst, [tuple(r[i] for i in order) for r in rows])
    dst.commit()
    assert dst.execute("SELECT count(*) FROM audit_events").fetchone()[0] == 300
    dst.close()


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("critical_deadline", float("nan")),
        ("critical_deadline", 0),
        ("max_queue_age", float("inf")),
        ("statement_timeout", -1.0),
        ("checkpoint_seconds", True),
        ("worker_id", "w\x00"),
        ("worker_id", "w" * 129),
    ],
)
def test_bad_arguments_are_refused_naming_them(
    sqlite_url: str, tmp_path: Path, name: str, value: object
) -> None:
    """Deadlines must be finite and positive; a stream id must be storable."""
    kwargs: dict[str, object] = {"spool_path": tmp_path / "s.jsonl", name: value}
    with pytest.raises(InvalidAuditEvent) as info:
        AuditLog(sqlite_url, **kwargs)  # type: ignore[arg-type]
    assert info.value.field == name


def test_a_busy_caller_gets_one_commit_per_interval_not_one_per_handful(
    db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Events recorded during a commit wait for the next pass instead of starting another commit.

    Each database call takes 2 ms here; a caller records an event every 0.5 ms. A
    writer that committed again as soon as one returned would commit every ~2 ms;
    this one commits about once per ``WRITER_INTERVAL_SECONDS`` (50 ms), counted from
    the start of each pass. Every event still arrives, in order.
    """
    import time

    calls: list[int] = []
    real = HeldConnection.store

    def slow_store(
        self: HeldConnection, stream: str, replay: object, records: list[object], *rest: object
    ) -> object:
        calls.append(len(records))
        time.sleep(0.002)
        return real(self, stream, replay, records, *rest)  # type: ignore[arg-type]

    log = AuditLog(db_url, "w1", spool_path=tmp_path / "s.jsonl")
    try:
        log.flush()
        monkeypatch.setattr(HeldConnection, "store", slow_store)
        started = time.monotonic()
        for i in range(500):
            log.record(sample_event(i))
            time.sleep(0.0005)
        elapsed = time.monotonic() - started
        log.flush()
    finally:
        log.close()
    assert _count(db_url) == 500 and verify(db_url).ok
    # passes at most once per interval, plus the flush (and the close) that woke it
    assert len(calls) <= elapsed / writer_mod.WRITER_INTERVAL_SECONDS + 4, (len(calls), elapsed)


def test_a_closed_writer_whose_database_call_hung_leaves_the_spool_to_the_next(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 25: close() under a hung database call hands the spool over; when the call
    returns, the closed writer's thread makes no database call and does not replay or
    remove the spool of a new writer of the same worker id in the same process."""
    real = HeldConnection.store
    hold, hung, release, down = (threading.Event() for _ in range(4))
    old: dict[str, threading.Thread] = {}
    after_close: list[str] = []

    def store(*args: object, **kwargs: object) -> object:
        me = threading.current_thread()
        if me is old.get("thread"):
            if hold.is_set() and not hung.is_set():
                hung.set()
                release.wait(30)  # a database call that has not returned
            elif hung.is_set():
                after_close.append(me.name)
        elif down.is_set() and me is not threading.main_thread():
            raise OSError("database down (test)")  # the new writer's thread: it spools
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(HeldConnection, "store", store)
    spool = tmp_path / "w1.spool.jsonl"
    log = AuditLog(sqlite_url, "w1", spool_path=spool, max_queue_age=0.2, retry_seconds=0.0)
    old["thread"] = log._thread
    for i in range(3):
        log.record(sample_event(i))
    log.flush()
    hold.set()
    log.record(sample_event(3))
    assert hung.wait(10)
    log.close()  # gives up on the call in flight: the rest is spooled
    assert log._thread.is_alive() and spool.exists()

    log2 = AuditLog(sqlite_url, "w1", spool_path=spool, retry_seconds=0.0)
    assert not spool.exists()  # replayed by the new writer at start
    down.set()
    assert log2.record_durable(sample_event(4)).evidence == "spooled"
    assert spool.exists()
    release.set()  # the closed writer's call returns now
    log._thread.join(10)
    assert not log._thread.is_alive()
    assert after_close == []  # no database call after close() returned
    assert spool.exists()  # the new writer's spool is still there, still its own
    down.clear()
    log2.close()
    assert not spool.exists()
    report = verify(sqlite_url)
    assert report.ok, report
    assert _count(sqlite_url, "type = 'audit_gap'") == 0
    assert log2.stats().quarantined == 0


def test_an_idle_writer_sleeps_and_its_next_event_wakes_it(db_url: str, tmp_path: Path) -> None:
    """With nothing to write, the writer stops passing every interval (an idle pass costs
    CPU 20 times a second); the next event wakes it at once, not at its idle poll."""
    import time

    with AuditLog(db_url, "w1", spool_path=tmp_path / "s.jsonl") as log:
        log.flush()
        passes: list[float] = []
        real = log._pass

        def counted(*, final: bool = False) -> bool:
            passes.append(time.monotonic())
            return real(final=final)

        log._pass = counted  # type: ignore[method-assign]
        time.sleep(1.2)  # 24 intervals
        assert len(passes) <= writer_mod.IDLE_AFTER_PASSES + 2, len(passes)
        seq = int(log.record(sample_event(1)).rpartition(":")[2])
        recorded = time.monotonic()
        while log.stats().durable_seq < seq and time.monotonic() - recorded < 5:
            time.sleep(0.005)
        took = time.monotonic() - recorded
        assert log.stats().durable_seq >= seq
        assert took < writer_mod.IDLE_POLL_SECONDS / 2, took
    assert _count(db_url) == 1 and verify(db_url).ok


def test_an_idle_writer_process_is_woken_by_its_next_event(sqlite_url: str, tmp_path: Path) -> None:
    """The writer process's writer sleeps when idle too; an event the engine hands over
    wakes it (not its idle poll, up to IDLE_POLL_SECONDS later)."""
    import time

    with AuditLog(sqlite_url, "w1", spool_path=tmp_path / "s.jsonl", writer="process") as log:
        log.flush()
        time.sleep(1.2)
        took = []
        for i in range(3):
            seq = int(log.record(sample_event(i)).rpartition(":")[2])
            recorded = time.monotonic()
            while log.stats().durable_seq < seq and time.monotonic() - recorded < 5:
                time.sleep(0.005)
            took.append(time.monotonic() - recorded)
            time.sleep(0.6)  # idle again (4 empty passes: 0.2 s)
        assert max(took) < writer_mod.IDLE_POLL_SECONDS / 2, took
    assert _count(sqlite_url) == 3 and verify(sqlite_url).ok
