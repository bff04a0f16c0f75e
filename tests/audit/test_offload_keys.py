"""The SQL store of wrapped offload data keys, on SQLite and PostgreSQL."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import create_engine, inspect

from kvgov.audit import SqlWrappedKeyStore, current_revision, downgrade, upgrade
from kvgov.audit.store import normalize_url
from kvgov.exceptions import KeyStoreUnavailable

from .conftest import scalar

WRAPPED = b"w" * 60


def _create(store: SqlWrappedKeyStore, key_id: str, tenant: str = "acme") -> object:
    return store.create(key_id=key_id, tenant=tenant, kek_id="local:x", wrapped=WRAPPED,
                        created_us=1)  # fmt: skip


def test_create_live_get_destroy(db_url: str) -> None:
    """A key is created live, found by tenant and id, and destroyed with its bytes erased."""
    store = SqlWrappedKeyStore(db_url)
    try:
        rec = _create(store, "a" * 32)
        assert store.live("acme") == rec and store.get("a" * 32) == rec
        assert store.live("beta") is None and store.get("b" * 32) is None
        assert store.destroy("acme", 99) == ["a" * 32]
        gone = store.get("a" * 32)
        assert gone is not None and gone.wrapped is None and gone.destroyed_us == 99
        assert store.live("acme") is None and store.destroy("acme", 100) == []
        assert scalar(db_url, "SELECT count(*) FROM offload_keys WHERE wrapped IS NOT NULL") == 0
    finally:
        store.close()


def test_one_live_key_per_tenant(db_url: str) -> None:
    """A second worker's create returns the first worker's live key (the unique index)."""
    a, b = SqlWrappedKeyStore(db_url), SqlWrappedKeyStore(db_url)
    try:
        first = _create(a, "a" * 32)
        assert _create(b, "b" * 32) == first
        a.destroy("acme", 5)
        assert _create(b, "c" * 32).key_id == "c" * 32  # after a shred, a new key
    finally:
        a.close()
        b.close()


def test_sqlite_destroy_leaves_no_wrapped_bytes_in_the_files(tmp_path: Path) -> None:
    """On SQLite the erased wrapped key is in neither the database nor its WAL file."""
    url = f"sqlite:///{tmp_path / 'k.db'}"
    store = SqlWrappedKeyStore(url)
    secret = b"\x8f\x13WRAPPED-KEY-BYTES\x8f\x13" * 3
    store.create(key_id="a" * 32, tenant="acme", kek_id="k", wrapped=secret, created_us=1)
    store.destroy("acme", 2)
    store.close()
    for f in tmp_path.glob("k.db*"):
        assert secret[:20] not in f.read_bytes(), f.name


def test_migration_up_and_down(any_db_url: str) -> None:
    """0003_offload_keys creates the table and its partial unique index, and drops them."""
    upgrade(any_db_url)
    engine = create_engine(normalize_url(any_db_url))
    try:
        with engine.connect() as conn:
            indexes = {i["name"] for i in inspect(conn).get_indexes("offload_keys")}
        assert "uq_offload_keys_live_tenant" in indexes
        downgrade(any_db_url, "0001")
        assert current_revision(any_db_url) == "0001"
        with engine.connect() as conn:
            assert "offload_keys" not in inspect(conn).get_table_names()
    finally:
        engine.dispose()


def test_a_database_that_is_gone_is_unavailable(tmp_path: Path) -> None:
    """Errors reaching the database raise KeyStoreUnavailable, not a driver error."""
    url = f"sqlite:///{tmp_path / 'k.db'}"
    store = SqlWrappedKeyStore(url)
    store.close()
    with sqlite3.connect(tmp_path / "k.db") as conn:
        conn.execute("DROP TABLE offload_keys")
    with pytest.raises(KeyStoreUnavailable, match="retry"):
        store.live("acme")
