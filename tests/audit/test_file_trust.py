"""Files the audit writer creates are its own: never readable by others, never a planted link.

Issue #25's round on "a file the process trusts that another user can write": the
SQLite trail was created 0644 (any local user could read tenants and decisions),
and the run marker's temporary file and the spool were opened through whatever
symlink another user had planted in a shared folder.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from sqlalchemy import text

from kvgov.audit.durability import RunMarker
from kvgov.audit.signing import generate_key_files, load_public_key
from kvgov.audit.spool import KeyRecord, Spool
from kvgov.audit.store import create_audit_engine
from kvgov.exceptions import SigningKeyError


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_a_new_sqlite_trail_and_its_wal_are_readable_by_the_owner_alone(
    tmp_path: Path,
) -> None:
    """Under a permissive umask the file and its -wal/-shm are still 0600."""
    db = tmp_path / "audit.db"
    old = os.umask(0o022)
    try:
        engine = create_audit_engine(f"sqlite:///{db}")
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE t (x INTEGER)"))
            conn.execute(text("INSERT INTO t VALUES (1)"))
        made = [p for p in tmp_path.iterdir() if p.name.startswith("audit.db")]
        assert {p.name for p in made} >= {"audit.db", "audit.db-wal"}
        assert {p.name: _mode(p) for p in made} == {p.name: 0o600 for p in made}
        engine.dispose()
    finally:
        os.umask(old)


def test_an_existing_sqlite_trail_keeps_the_mode_its_operator_chose(tmp_path: Path) -> None:
    """Only a new file is made private: an operator's 0640 for an auditors' group stays."""
    db = tmp_path / "audit.db"
    db.touch()
    db.chmod(0o640)
    engine = create_audit_engine(f"sqlite:///{db}")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE t (x INTEGER)"))
    engine.dispose()
    assert _mode(db) == 0o640


def test_the_run_marker_does_not_follow_a_planted_link(tmp_path: Path) -> None:
    """A symlink planted where the marker's temporary file goes is replaced, not written through."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    marker = tmp_path / "kvgov-audit.w1.run.json"
    (tmp_path / (marker.name + ".tmp")).symlink_to(victim)
    RunMarker.now("w1", "sqlite:///x.db", 1).write(marker)
    assert victim.read_text() == "precious\n"
    assert RunMarker.read(marker) == RunMarker.now("w1", "sqlite:///x.db", 1)
    assert not marker.is_symlink() and _mode(marker) == 0o600


def test_the_spool_is_never_appended_through_a_link(tmp_path: Path) -> None:
    """A spool path that is a symlink (to a file the writer may write) is refused, not followed."""
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    path = tmp_path / "w1.spool.jsonl"
    path.symlink_to(victim)
    key = KeyRecord(key_id="k1", public_key=bytes(32), origin="configured", stream="w1",
                    time_us=1)  # fmt: skip
    with pytest.raises(OSError):
        Spool(path).append([], keys=[key])
    assert victim.read_text() == "precious\n"


def test_a_private_key_given_as_the_public_key_is_refused_when_others_can_read_it(
    tmp_path: Path,
) -> None:
    """``--public-key`` accepts a private key PEM (its public half is used); that file is a
    secret all the same, so the key-file rule holds: 0644 refused, 0600 read."""
    files = generate_key_files(tmp_path / "keys")
    private = files.private
    private.chmod(0o644)
    with pytest.raises(SigningKeyError, match="accessible by group or others") as info:
        load_public_key(private)
    assert "BEGIN" not in str(info.value)
    private.chmod(0o600)
    assert (
        load_public_key(private).public_bytes_raw()
        == load_public_key(files.public).public_bytes_raw()
    )
