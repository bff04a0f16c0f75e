"""Fixtures shared by every test package: databases and capability markers.

PostgreSQL and GPU tests skip only where the resource is truly absent, and
print why. Under ``CI=true`` a missing PostgreSQL is a failure, not a skip:
CI here has one, so a skip there would hide a broken audit store.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

PG_HOST = os.environ.get("KVGOV_TEST_PG_HOST", "127.0.0.1")
PG_PORT = int(os.environ.get("KVGOV_TEST_PG_PORT", "5432"))
PG_USER = os.environ.get("KVGOV_TEST_PG_USER", "postgres")


def _pg_admin_connect():  # type: ignore[no-untyped-def]
    import psycopg

    return psycopg.connect(
        host=PG_HOST,
        port=PG_PORT,
        user=PG_USER,
        dbname="postgres",
        autocommit=True,
        connect_timeout=3,
    )


def _pg_unavailable_reason() -> str | None:
    try:
        with _pg_admin_connect():
            return None
    except Exception as exc:  # any failure to connect means "absent" here
        return f"PostgreSQL not reachable at {PG_HOST}:{PG_PORT}: {exc}"


@pytest.fixture()
def pg_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database for one test, dropped afterwards."""
    reason = _pg_unavailable_reason()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"{reason} (CI has PostgreSQL: this must not be skipped)")
        pytest.skip(reason)
    name = f"kvgov_test_{uuid.uuid4().hex[:12]}"
    with _pg_admin_connect() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql+psycopg://{PG_USER}@{PG_HOST}:{PG_PORT}/{name}"
    finally:
        from sqlalchemy.pool import NullPool  # noqa: F401  (engines are disposed by tests)

        with _pg_admin_connect() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture()
def sqlite_url(tmp_path: Path) -> str:
    """A SQLite audit database in the test's own temporary directory."""
    return f"sqlite:///{tmp_path / 'audit.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def any_db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each audit-store test runs on SQLite and on a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'audit.db'}"
    url: str = request.getfixturevalue("pg_url")
    return url


def _cuda_available() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _cuda_available():
        return
    skip_gpu = pytest.mark.skip(
        reason="no CUDA device on this machine (torch.cuda.is_available() is False)"
    )
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
