"""Finding A of issue 17: a hung database never stalls a caller past its deadline.

PostgreSQL is "frozen" by a proxy that stops relaying bytes but keeps the sockets
open (a SIGSTOP-ed server or a partition without RST looks the same to the client);
the shared server itself is never touched. The bounds asserted are generous
(10 s for a 1 s deadline): they test that the wait is bounded, not how fast it is.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from kvgov.audit import AuditEvent, AuditLog, EventType, verify
from kvgov.audit import store as store_mod
from kvgov.audit.spool import Spool
from kvgov.audit.store import create_audit_engine
from tests.support.pg_proxy import ProxiedPg

from .conftest import sample_event, scalar, sqlite_locked

BOUND = 10.0  # seconds: far above every deadline below, far below "hangs"


def _count(url: str) -> int:
    return int(scalar(url, "SELECT count(*) FROM audit_events"))  # type: ignore[arg-type]


def _within(fn: Callable[[], Any], bound: float = BOUND) -> tuple[Any, float]:
    """Run fn on a thread; fail (instead of hanging) if it has not returned within bound."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:  # handed to the test thread below
            out["error"] = exc

    t0 = time.monotonic()
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(bound)
    elapsed = time.monotonic() - t0
    if worker.is_alive():
        pytest.fail(f"still waiting after {bound} s: a hung database stalled the caller")
    if "error" in out:
        raise out["error"]
    return out.get("value"), elapsed


def _erasure(tenant: str = "acme") -> AuditEvent:
    return AuditEvent(EventType.ERASURE, tenant=tenant, details={"bytes_zeroized": 4096})


@pytest.mark.postgres
def test_critical_event_is_spooled_when_postgresql_freezes(
    pg_proxy: ProxiedPg, tmp_path: Path
) -> None:
    """A frozen server: an erasure returns within the deadline, spooled, and says so."""
    url, proxy = pg_proxy.url, pg_proxy.proxy
    spool = tmp_path / "w1.spool.jsonl"
    log = AuditLog(url, "w1", spool_path=spool, critical_deadline=1.0, retry_seconds=0.0)
    try:
        for i in range(20):
            log.record(sample_event(i))
        assert log.record_durable(_erasure()).evidence == "stored"
        proxy.freeze()
        rec, elapsed = _within(lambda: log.record_durable(_erasure("beta")))
        assert rec.evidence == "spooled" and rec.reason and not rec.stored
        assert elapsed < BOUND
        assert rec.event_id in log.stats().critical_spooled
        spooled = {(r[1], r[3]) for r in Spool(spool).read().events}
        assert (int(rec.event_id.split(":")[1]), "erasure") in spooled
        event_id, _ = _within(lambda: log.record(_erasure("gamma")))  # plain record(): bounded
        assert event_id == "w1:23"
        proxy.thaw()
        _within(log.flush)
        assert not log.spooled and log.stats().critical_spooled == ()
    finally:
        proxy.thaw()
        _within(log.close)
    assert _count(pg_proxy.direct) == 23
    assert verify(pg_proxy.direct).ok


@pytest.mark.postgres
def test_frozen_postgresql_spools_ordinary_events_and_replays_them(
    pg_proxy: ProxiedPg, tmp_path: Path
) -> None:
    """While frozen, queued events reach the spool within the queue age; thawed, the store."""
    url, proxy = pg_proxy.url, pg_proxy.proxy
    spool = tmp_path / "w1.spool.jsonl"
    log = AuditLog(
        url, "w1", spool_path=spool, max_queue_age=0.5, critical_deadline=1.0, retry_seconds=0.0
    )
    try:
        log.record(sample_event(0))
        log.flush()
        proxy.freeze()
        for i in range(1, 50):
            log.record(sample_event(i))
        deadline = time.monotonic() + BOUND
        while Spool(spool).read().last_seq < 50 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert Spool(spool).read().last_seq == 50  # on disk although the database hangs
        assert log.stats().in_memory == 0
        proxy.thaw()
        _within(log.flush)
    finally:
        proxy.thaw()
        _within(log.close)
    assert _count(pg_proxy.direct) == 50 and verify(pg_proxy.direct).ok


@pytest.mark.postgres
def test_close_is_bounded_when_postgresql_freezes_and_the_next_start_replays(
    pg_proxy: ProxiedPg, tmp_path: Path
) -> None:
    """close() under a frozen server spools and returns; the same worker later replays."""
    url, proxy = pg_proxy.url, pg_proxy.proxy
    spool = tmp_path / "w1.spool.jsonl"
    log = AuditLog(url, "w1", spool_path=spool, critical_deadline=1.0)
    log.record(sample_event(0))
    log.flush()
    proxy.freeze()
    for i in range(1, 10):
        log.record(sample_event(i))
    _within(log.close)
    assert Spool(spool).read().last_seq == 10
    proxy.kill()  # connections stuck behind the freeze die with it
    proxy.start()
    with AuditLog(url, "w1", spool_path=spool) as log2:
        assert log2.record(sample_event(10)) == "w1:11"
    assert not spool.exists()
    assert _count(pg_proxy.direct) == 11 and verify(pg_proxy.direct).ok


def test_critical_event_is_spooled_when_sqlite_is_locked(sqlite_url: str, tmp_path: Path) -> None:
    """Another writer holding SQLite's lock (default 30 s busy wait) delays no erasure past 1 s."""
    assert store_mod.SQLITE_BUSY_TIMEOUT_MS == 30_000
    spool = tmp_path / "w1.spool.jsonl"
    log = AuditLog(sqlite_url, "w1", spool_path=spool, critical_deadline=1.0)
    log.record(sample_event(0))
    log.flush()
    with sqlite_locked(sqlite_url):
        rec, elapsed = _within(lambda: log.record_durable(_erasure()))
        assert rec.evidence == "spooled" and elapsed < BOUND
    _within(log.flush)  # the lock is gone: the spool replays
    _within(log.close)
    assert _count(sqlite_url) == 2 and verify(sqlite_url).ok


@pytest.mark.postgres
def test_writer_connections_carry_timeouts_and_keepalives(pg_url: str) -> None:
    """statement_timeout, lock_timeout, TCP keepalives and tcp_user_timeout are set."""
    engine = create_audit_engine(pg_url, statement_timeout=5.0)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SHOW statement_timeout")).scalar() == "5s"
            assert conn.execute(text("SHOW lock_timeout")).scalar() == "2s"
            params = conn.connection.driver_connection.info.get_parameters()  # type: ignore[union-attr]
    finally:
        engine.dispose()
    assert params["keepalives"] == "1" and int(params["tcp_user_timeout"]) > 0
    assert int(params["connect_timeout"]) > 0
