"""Read-only commands create nothing, and an empty trail is an error unless --allow-empty."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvgov.audit import AuditLog, upgrade
from kvgov.cli.audit import audit_group, db_group

from .conftest import sample_event

READERS = [
    ["verify"],
    ["reuse", "--tenant", "acme"],
    ["erasure", "--tenant", "acme"],
    ["denials"],
    ["decisions", "--policy-revision", "rev-a"],
    ["events"],
    ["events", "--count-by", "type"],
    ["export"],
    ["checkpoints"],
    ["status"],
    ["quarantine", "list"],
]


@pytest.mark.parametrize("args", READERS)
def test_a_wrong_sqlite_path_fails_and_creates_no_file(args: list[str], tmp_path: Path) -> None:
    """A mistyped file in an existing directory: exit 3 naming it; the directory stays empty."""
    path = tmp_path / "typo.db"
    result = CliRunner().invoke(audit_group, [*args, "--url", f"sqlite:///{path}"])
    assert result.exit_code == 3, result.output
    assert f"no audit database at {path}" in result.output
    assert list(tmp_path.iterdir()) == []


def test_db_current_on_a_wrong_path_creates_no_file(tmp_path: Path) -> None:
    """`kvgov db current` reads: a missing file is an error, not a new empty database."""
    path = tmp_path / "typo.db"
    result = CliRunner().invoke(db_group, ["current", f"sqlite:///{path}"])
    assert result.exit_code == 3 and "no audit database" in result.output
    assert list(tmp_path.iterdir()) == []


def test_status_on_a_missing_spool_dir_or_spool_is_an_error(tmp_path: Path) -> None:
    """--spool-dir or --spool naming nothing: exit 3, not an empty listing."""
    runner = CliRunner()
    gone = runner.invoke(audit_group, ["status", "--spool-dir", str(tmp_path / "nope")])
    assert gone.exit_code == 3 and "no spool directory" in gone.output
    spool = tmp_path / "w9.spool.jsonl"
    listed = runner.invoke(audit_group, ["quarantine", "list", "--spool", str(spool)])
    assert listed.exit_code == 3 and "no spool file" in listed.output
    assert list(tmp_path.iterdir()) == []


EMPTY_READERS = READERS[:9]


@pytest.fixture()
def empty_url(tmp_path: Path) -> str:
    """An audit database at the head revision that holds no event."""
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    upgrade(url)
    return url


@pytest.mark.parametrize("args", EMPTY_READERS)
def test_an_empty_trail_is_an_error_unless_allowed(args: list[str], empty_url: str) -> None:
    """No events: exit 1 with a clear line; --allow-empty makes it a result (exit 0)."""
    runner = CliRunner()
    refused = runner.invoke(audit_group, [*args, "--url", empty_url])
    assert refused.exit_code == 1, refused.output
    assert "holds no events" in refused.output and "--allow-empty" in refused.output
    allowed = runner.invoke(audit_group, [*args, "--url", empty_url, "--allow-empty"])
    assert allowed.exit_code == 0, allowed.output


def test_verify_allow_empty_reports_zero_events(empty_url: str) -> None:
    """verify --allow-empty on an empty trail: ok, 0 events."""
    result = CliRunner().invoke(
        audit_group, ["verify", "--url", empty_url, "--allow-empty", "--json"]
    )
    report = json.loads(result.output)
    assert result.exit_code == 0 and report["ok"] and report["events"] == 0


def test_a_trail_with_events_needs_no_flag(empty_url: str) -> None:
    """One event is enough: queries run without --allow-empty."""
    with AuditLog(empty_url, "w1") as log:
        log.record(sample_event(0))
    result = CliRunner().invoke(audit_group, ["events", "--url", empty_url, "--json"])
    assert result.exit_code == 0 and len(json.loads(result.output)) == 1


def test_streams_refuses_to_sign_an_empty_trail(empty_url: str, tmp_path: Path) -> None:
    """`audit streams` on a trail with no events: exit 1, nothing signed or written."""
    key = tmp_path / "auditor.pem"
    assert CliRunner().invoke(audit_group, ["keygen", str(key)]).exit_code == 0
    out = tmp_path / "streams.json"
    args = ["streams", "--url", empty_url, "--key", str(key), "--output", str(out)]
    refused = CliRunner().invoke(audit_group, args)
    assert refused.exit_code == 1 and "holds no events" in refused.output
    assert not out.exists()
    allowed = CliRunner().invoke(audit_group, [*args, "--allow-empty"])
    assert allowed.exit_code == 0, allowed.output
    assert json.loads(out.read_text())["streams"] == []


KILLED_WRITER = """
import os, signal, sys
from kvgov.audit import AuditLog
from tests.audit.conftest import sample_event
url, spool, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
log = AuditLog(url, "w1", spool_path=spool, checkpoint_every=5)
for i in range(n):
    log.record(sample_event(i))
log.flush()  # committed: the pages are in -wal, which only a close would checkpoint
os.kill(os.getpid(), signal.SIGKILL)
"""
KILLED_EVENTS = 12


def _files(folder: Path) -> dict[str, tuple[bytes, int, int]]:
    """Every file of ``folder``: content, size and mtime (ns)."""
    return {
        p.name: (p.read_bytes(), p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(folder.iterdir())
    }


@pytest.fixture()
def killed_writer_db(tmp_path: Path) -> Path:
    """An audit file whose writer committed events and was SIGKILLed: they are in -wal."""
    folder = tmp_path / "evidence"
    folder.mkdir()
    db = folder / "audit.db"
    upgrade(f"sqlite:///{db}")  # closed cleanly: the schema is in the file itself
    spool = tmp_path / "w1.spool.jsonl"
    proc = subprocess.run(
        [sys.executable, "-c", KILLED_WRITER, f"sqlite:///{db}", str(spool), str(KILLED_EVENTS)],
        cwd=Path(__file__).parents[2],
        env={**os.environ, "KVGOV_LOG_LEVEL": "error"},
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr
    assert {p.name for p in folder.iterdir()} == {"audit.db", "audit.db-wal", "audit.db-shm"}
    assert (folder / "audit.db-wal").stat().st_size > 0
    return db


@pytest.mark.parametrize("args", [*READERS, ["verify", "--json"], ["export", "--format", "csv"]])
def test_readers_leave_a_killed_writers_files_byte_identical(
    args: list[str], killed_writer_db: Path
) -> None:
    """After a SIGKILLed writer, a reader changes no byte or mtime of audit.db, -wal, -shm,
    creates nothing, and still sees the events only -wal holds (issue 25, defect 8)."""
    before = _files(killed_writer_db.parent)
    time.sleep(0.01)  # a write by the reader would get a later mtime
    result = CliRunner().invoke(audit_group, [*args, "--url", f"sqlite:///{killed_writer_db}"])
    assert result.exit_code == 0, result.output
    assert _files(killed_writer_db.parent) == before


def test_readers_see_the_events_a_killed_writer_left_in_the_wal(killed_writer_db: Path) -> None:
    """verify and events read the committed events that only -wal holds."""
    url = f"sqlite:///{killed_writer_db}"
    before = _files(killed_writer_db.parent)
    runner = CliRunner()
    verified = runner.invoke(audit_group, ["verify", "--url", url, "--json"])
    assert verified.exit_code == 0, verified.output
    assert json.loads(verified.output)["events"] == KILLED_EVENTS
    listed = runner.invoke(audit_group, ["events", "--url", url, "--json"])
    assert len(json.loads(listed.output)) == KILLED_EVENTS
    assert _files(killed_writer_db.parent) == before


def test_db_current_leaves_a_killed_writers_files_byte_identical(killed_writer_db: Path) -> None:
    """`kvgov db current` reads the revision without checkpointing -wal into the file."""
    before = _files(killed_writer_db.parent)
    time.sleep(0.01)
    result = CliRunner().invoke(db_group, ["current", f"sqlite:///{killed_writer_db}"])
    assert result.exit_code == 0 and "up to date" in result.output, result.output
    assert _files(killed_writer_db.parent) == before


def test_a_reader_of_a_closed_trail_creates_no_wal_or_shm(tmp_path: Path) -> None:
    """A trail no writer has open (no -wal): readers create neither -wal nor -shm."""
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    with AuditLog(url, "w1", spool_path=tmp_path / "spool" / "w1.jsonl") as log:
        log.record(sample_event(0))
    (tmp_path / "spool").rename(tmp_path.parent / f"{tmp_path.name}-spool")
    before = _files(tmp_path)
    assert set(before) == {"audit.db"}
    for args in (["verify"], ["events"], ["status"]):
        result = CliRunner().invoke(audit_group, [*args, "--url", url])
        assert result.exit_code == 0, result.output
    assert CliRunner().invoke(db_group, ["current", url]).exit_code == 0
    assert _files(tmp_path) == before


def test_a_wal_without_its_shm_index_is_an_environment_error(killed_writer_db: Path) -> None:
    """-wal without -shm: reading it would mean writing an index; exit 3 saying so."""
    (killed_writer_db.parent / "audit.db-shm").unlink()
    before = _files(killed_writer_db.parent)
    result = CliRunner().invoke(audit_group, ["verify", "--url", f"sqlite:///{killed_writer_db}"])
    assert result.exit_code == 3, result.output
    assert "audit.db-wal exists without" in result.output
    assert _files(killed_writer_db.parent) == before
