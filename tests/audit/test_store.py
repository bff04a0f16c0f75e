"""Schema revisions, the head-revision check, and the append-only triggers."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.exc import DatabaseError

from kvgov.audit import AuditLog, AuditQueries, current_revision, downgrade, head_revision, upgrade
from kvgov.audit.store import normalize_url, open_engine
from kvgov.exceptions import AuditSchemaError, InvalidAuditUrl

from .conftest import sample_event, table_names


def test_upgrade_downgrade_upgrade(any_db_url: str) -> None:
    """The migration goes up, all the way down (tables gone) and up again."""
    upgrade(any_db_url)
    assert current_revision(any_db_url) == head_revision()
    assert {"audit_events", "audit_checkpoints", "audit_keys"} <= table_names(any_db_url)
    downgrade(any_db_url, "base")
    assert current_revision(any_db_url) is None
    assert not {"audit_events", "audit_checkpoints", "audit_keys"} & table_names(any_db_url)
    upgrade(any_db_url)
    assert current_revision(any_db_url) == head_revision()


def test_database_not_at_head_is_refused(any_db_url: str) -> None:
    """A database without the schema refuses with the `kvgov db upgrade` hint."""
    if any_db_url.startswith("sqlite"):
        upgrade(any_db_url)
        downgrade(any_db_url, "base")  # not empty (alembic_version exists), not at head
    with pytest.raises(AuditSchemaError, match="kvgov db upgrade") as info:
        AuditLog(any_db_url, "w1")
    assert info.value.current is None and info.value.head == head_revision()
    with pytest.raises(AuditSchemaError):
        AuditQueries(any_db_url)


def test_new_sqlite_file_is_created_and_upgraded(tmp_path: Path) -> None:
    """An empty SQLite database is created at head automatically, in WAL mode."""
    url = f"sqlite:///{tmp_path / 'fresh.db'}"
    engine = open_engine(url)
    with engine.connect() as conn:
        assert conn.exec_driver_sql("PRAGMA journal_mode").scalar() == "wal"
    engine.dispose()
    assert current_revision(url) == head_revision()


def test_default_url_is_upgraded_automatically(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The default audit file is upgraded even when it exists below head."""
    monkeypatch.chdir(tmp_path)
    from kvgov.defaults import AUDIT_URL

    upgrade(AUDIT_URL)
    downgrade(AUDIT_URL, "base")
    open_engine(AUDIT_URL).dispose()
    assert current_revision(AUDIT_URL) == head_revision()


def test_offline_sql_renders_triggers(tmp_path: Path) -> None:
    """`--sql` (offline mode) renders the tables and the append-only triggers."""
    sql = upgrade(f"sqlite:///{tmp_path / 'x.db'}", sql=True)
    assert "CREATE TABLE audit_events" in sql and "RAISE(ABORT" in sql
    pg = upgrade("postgresql://u@127.0.0.1:1/none", sql=True)
    assert "JSONB" in pg and "BEFORE TRUNCATE" in pg


@pytest.mark.parametrize("table", ["audit_events", "audit_checkpoints", "audit_keys"])
@pytest.mark.parametrize("verb", ["UPDATE", "DELETE"])
def test_triggers_reject_changes(db_url: str, table: str, verb: str, populate: object) -> None:
    """UPDATE and DELETE on every audit table are rejected by the database."""
    _check_rejected(db_url, table, verb, populate)


@pytest.mark.postgres
@pytest.mark.parametrize("table", ["audit_events", "audit_checkpoints", "audit_keys"])
def test_truncate_rejected_on_postgresql(pg_url: str, table: str, populate: object) -> None:
    """TRUNCATE on every audit table is rejected on PostgreSQL."""
    upgrade(pg_url)
    _check_rejected(pg_url, table, "TRUNCATE", populate)


def _check_rejected(db_url: str, table: str, verb: str, populate: object) -> None:
    populate(db_url, 10)  # type: ignore[operator]
    stmt = {
        "UPDATE": f"UPDATE {table} SET time_us = 0",
        "DELETE": f"DELETE FROM {table}",
        "TRUNCATE": f"TRUNCATE {table}",
    }[verb]
    engine = create_engine(normalize_url(db_url))
    try:
        with pytest.raises(DatabaseError, match="append-only"), engine.begin() as conn:
            conn.execute(text(stmt))
        with engine.connect() as conn:
            assert conn.execute(text(f"SELECT count(*) FROM {table}")).scalar() > 0
    finally:
        engine.dispose()


def test_sample_event_is_valid() -> None:
    """The helper's events construct without error (guards the other tests)."""
    assert sample_event(3).sequence_id == "req-3"


def test_text_columns_match_the_shared_limits(db_url: str) -> None:
    """Every text column of a migrated store is as wide as kvgov.schema.TEXT_LIMITS says."""
    from kvgov.schema import TEXT_LIMITS

    engine = create_engine(normalize_url(db_url))
    try:
        with engine.connect() as conn:
            columns = {c["name"]: c["type"] for c in inspect(conn).get_columns("audit_events")}
    finally:
        engine.dispose()
    for name, limit in TEXT_LIMITS.items():
        assert getattr(columns[name], "length", None) == limit, name


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("not a url", "not a url"),
        ("foo://bar", "foo://bar"),
        ("mysql://root:hunter2@db/audit", "mysql://root:***@db/audit"),
        (12, "12"),
    ],
)
def test_bad_audit_url_is_a_typed_error_without_the_password(url: object, shown: str) -> None:
    """GovernedKVCache.create / AuditLog with a URL that is not SQLite or PostgreSQL: a
    typed error naming the argument, the password hidden, and no file created."""
    with pytest.raises(InvalidAuditUrl) as info:
        AuditLog(url)  # type: ignore[arg-type]
    assert "audit_url" in str(info.value) and shown in str(info.value)
    assert "hunter2" not in str(info.value)
