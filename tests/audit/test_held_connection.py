"""The writer keeps its database connection between passes (``HeldConnection``).

Taking a pooled connection for each pass cost a pre-ping and a reset round trip; the
writer now holds one, gives it back after ``HELD_IDLE_SECONDS`` unused, drops it when a
pass fails, and replaces a connection the server ended between passes without losing,
doubling or spooling a pass.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import event

from kvgov.audit import AuditLog, upgrade, verify
from kvgov.audit.persist import HeldConnection
from kvgov.audit.store import create_audit_engine

from .conftest import sample_event, scalar


def _count(url: str) -> int:
    count = scalar(url, "SELECT count(*) FROM audit_events")
    assert isinstance(count, int)
    return count


def _checkouts(log: AuditLog) -> list[int]:
    """Count the pool checkouts of the log's engine from now on."""
    seen: list[int] = []
    event.listen(log._engine, "checkout", lambda *a: seen.append(1))
    return seen


def test_a_writer_takes_one_connection_for_many_passes(db_url: str, tmp_path: Path) -> None:
    """Ten passes (each a flush: a commit) take the pool's connection once, not ten times."""
    with AuditLog(db_url, "w1", spool_path=tmp_path / "s.jsonl") as log:
        log.flush()
        seen = _checkouts(log)
        for i in range(10):
            log.record(sample_event(i))
            log.flush()
        assert len(seen) <= 1, len(seen)
    assert _count(db_url) == 10 and verify(db_url).ok


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_an_idle_connection_is_given_back_and_a_tested_one_taken(sqlite_url: str) -> None:
    """Unused for HELD_IDLE_SECONDS, the held connection goes back; the next pass takes a
    connection from the pool again (where the pre-ping tests it)."""
    upgrade(sqlite_url)
    engine = create_audit_engine(sqlite_url)
    seen: list[int] = []
    event.listen(engine, "checkout", lambda *a: seen.append(1))
    clock = _Clock()
    held = HeldConnection(engine, idle_seconds=5.0, clock=clock)
    try:
        held.store("s", None, [])
        clock.now = 4.9
        held.store("s", None, [])
        assert len(seen) == 1 and held.held
        clock.now = 4.9 + 5.0
        held.store("s", None, [])
        assert len(seen) == 2 and held.held
    finally:
        held.release()
        engine.dispose()
    assert not held.held


def test_a_failed_pass_drops_the_connection(
    sqlite_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pass that raises leaves no connection held (its state is unknown); the next
    pass takes a fresh one and stores."""
    from kvgov.audit import persist

    upgrade(sqlite_url)
    engine = create_audit_engine(sqlite_url)
    held = HeldConnection(engine)
    real = persist.store_on
    try:
        held.store("s", None, [])
        assert held.held

        def broken(*args: object, **kwargs: object) -> object:
            raise OSError("disk gone (test)")

        monkeypatch.setattr(persist, "store_on", broken)
        with pytest.raises(OSError):
            held.store("s", None, [])
        assert not held.held
        monkeypatch.setattr(persist, "store_on", real)
        assert held.store("s", None, []) == []
        assert held.held
    finally:
        held.release()
        engine.dispose()


def test_a_connection_the_server_ended_is_replaced_without_spooling(
    pg_url: str, tmp_path: Path
) -> None:
    """PostgreSQL ends the writer's session between two passes: the next pass notices,
    takes a fresh connection and stores; nothing is spooled, lost or stored twice."""
    upgrade(pg_url)
    with AuditLog(pg_url, "w1", spool_path=tmp_path / "s.jsonl") as log:
        log.record(sample_event(0))
        log.flush()
        ended = scalar(
            pg_url,
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()",
        )
        assert isinstance(ended, int) and ended >= 1  # the writer's held connection
        for i in range(1, 4):
            log.record(sample_event(i))
        log.flush()
        stats = log.stats()
        assert stats.spooled_total == 0 and stats.database_error is None
    assert _count(pg_url) == 4 and verify(pg_url).ok
