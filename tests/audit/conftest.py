"""Helpers for the audit tests: populated logs, fixed clocks, and an attacker's SQL."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text

from kvgov.audit import AuditEvent, AuditLog, EventType, upgrade
from kvgov.audit.store import normalize_url
from tests.support.pg_proxy import pg_proxy  # noqa: F401 - shared fixture


class FixedClock:
    """A clock that advances one millisecond per call, from a fixed start."""

    def __init__(self, start: float = 1_700_000_000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        self.now += 0.001
        return self.now


@pytest.fixture()
def clock() -> FixedClock:
    """A deterministic clock for event times."""
    return FixedClock()


@pytest.fixture()
def db_url(any_db_url: str) -> str:
    """An audit database (SQLite and PostgreSQL) already at the head revision."""
    upgrade(any_db_url)
    return any_db_url


def sample_event(i: int) -> AuditEvent:
    """A varied but deterministic event number ``i``."""
    kinds = [EventType.ADMISSION, EventType.REUSE, EventType.EVICTION, EventType.RELEASE]
    return AuditEvent(
        type=kinds[i % len(kinds)],
        tenant="acme" if i % 3 else "beta",
        requester_tenant="beta" if i % 4 == 1 else None,
        classification="internal",
        model="llama-3-8b",
        model_revision="r1",
        tokenizer="llama3",
        tokenizer_revision="v1",
        template_version="sys-v3",
        sequence_id=f"req-{i}",
        block_ids=(i, i + 1),
        token_count=16 * (i % 7),
        decision_id=f"dec-{i}",
        policy_revision="rev-a",
        details={"i": i, "note": "ok"},
    )


@pytest.fixture()
def populate(clock: FixedClock, tmp_path: Path) -> Iterator[Callable[..., AuditLog]]:
    """Write ``n`` sample events to a stream and close it; returns the closed log."""

    def _populate(url: str, n: int = 25, *, worker_id: str = "w1", every: int = 10) -> AuditLog:
        log = AuditLog(
            url,
            worker_id,
            clock=clock,
            checkpoint_every=every,
            spool_path=tmp_path / f"{worker_id}.spool.jsonl",
        )
        for i in range(n):
            log.record(sample_event(i))
        log.close()
        return log

    yield _populate


def attacker(url: str, *statements: str) -> None:
    """Run SQL as someone with database access: drop the append-only triggers, then edit."""
    engine = create_engine(normalize_url(url))
    try:
        with engine.begin() as conn:
            if conn.dialect.name == "postgresql":
                for t in ("audit_events", "audit_checkpoints", "audit_keys"):
                    conn.execute(text(f"DROP TRIGGER IF EXISTS {t}_append_only ON {t}"))
            else:
                for t in ("audit_events", "audit_checkpoints", "audit_keys"):
                    conn.execute(text(f"DROP TRIGGER IF EXISTS {t}_no_update"))
                    conn.execute(text(f"DROP TRIGGER IF EXISTS {t}_no_delete"))
            for s in statements:
                conn.execute(text(s))
    finally:
        engine.dispose()


def scalar(url: str, sql: str) -> object:
    """Run one query and return its single value."""
    engine = create_engine(normalize_url(url))
    try:
        with engine.connect() as conn:
            return conn.execute(text(sql)).scalar()
    finally:
        engine.dispose()


def table_names(url: str) -> set[str]:
    """The names of the tables in the audit database at ``url``."""
    engine = create_engine(normalize_url(url))
    try:
        with engine.connect() as conn:
            return set(inspect(conn).get_table_names())
    finally:
        engine.dispose()


@contextlib.contextmanager
def sqlite_locked(url: str) -> Iterator[None]:
    """Hold an exclusive lock on a SQLite audit database (writers time out) while inside."""
    engine = create_engine(normalize_url(url))
    conn = engine.raw_connection()
    conn.driver_connection.isolation_level = None  # type: ignore[union-attr]
    conn.cursor().execute("BEGIN EXCLUSIVE")
    try:
        yield
    finally:
        conn.rollback()
        conn.close()
        engine.dispose()
