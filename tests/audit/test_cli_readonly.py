"""Read-only commands create nothing, and an empty trail is an error unless --allow-empty."""

from __future__ import annotations

import json
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
