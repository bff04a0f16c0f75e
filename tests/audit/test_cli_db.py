"""`kvgov db downgrade`: an explicit target, no silent loss of events, the migration audited."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from kvgov.audit import AuditLog, current_revision, head_revision, upgrade
from kvgov.cli.audit import MIGRATION_STREAM, audit_group, db_group

from .conftest import sample_event, table_names
from .test_chain_format import store_format1_trail

FIXTURE_KEY_PRIVATE = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))


def _populated(url: str, n: int = 3) -> str:
    with AuditLog(url, "w1") as log:
        for i in range(n):
            log.record(sample_event(i))
    return url


def test_downgrade_without_a_target_refuses_and_counts_the_events(sqlite_url: str) -> None:
    """No --revision: exit 2, the number of events at stake named, nothing changed."""
    _populated(sqlite_url, 3)
    result = CliRunner().invoke(db_group, ["downgrade", sqlite_url])
    assert result.exit_code == 2, result.output
    assert "--revision" in result.output and "3 audit event(s)" in result.output
    assert current_revision(sqlite_url) == head_revision()


def test_relative_or_unknown_targets_are_refused(sqlite_url: str) -> None:
    """-1 (the old default), head or a typo are not explicit targets: exit 2."""
    _populated(sqlite_url)
    for revision in ("-1", "head", "0003", "nope"):
        result = CliRunner().invoke(db_group, ["downgrade", sqlite_url, "--revision", revision])
        assert result.exit_code == 2, (revision, result.output)
        assert "explicit target revision" in result.output
    assert current_revision(sqlite_url) == head_revision()


def test_downgrade_to_base_refuses_to_drop_events_without_the_flag(sqlite_url: str) -> None:
    """--revision base on a trail with events: exit 2 naming the loss; the flag goes on."""
    _populated(sqlite_url, 4)
    runner = CliRunner()
    refused = runner.invoke(db_group, ["downgrade", sqlite_url, "--revision", "base"])
    assert refused.exit_code == 2, refused.output
    assert "4 audit event(s) would be lost" in refused.output
    assert "--yes-destroy-audit-trail" in refused.output
    assert "audit_events" in table_names(sqlite_url)
    done = runner.invoke(
        db_group, ["downgrade", sqlite_url, "--revision", "base", "--yes-destroy-audit-trail"]
    )
    assert done.exit_code == 0, done.output
    assert "4 audit event(s) deleted" in done.output
    assert "audit_events" not in table_names(sqlite_url)


def test_downgrade_of_an_empty_schema_needs_no_flag(tmp_path: Path) -> None:
    """Dropping tables that hold no rows loses nothing: no flag needed."""
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    upgrade(url)
    result = CliRunner().invoke(db_group, ["downgrade", url, "--revision", "base"])
    assert result.exit_code == 0, result.output
    assert current_revision(url) is None


def test_a_downgrade_that_keeps_the_trail_below_chain_format_2_is_refused_first(
    sqlite_url: str,
) -> None:
    """head -> 0001 would keep audit_events full of chain-format-2 rows that 0001 cannot
    verify: refused (exit 2) before anything is recorded or changed."""
    _populated(sqlite_url, 2)
    result = CliRunner().invoke(db_group, ["downgrade", sqlite_url, "--revision", "0001"])
    assert result.exit_code == 2, result.output
    assert "below 0004_chain_format refused" in result.output
    assert "holds 2 audit event(s)" in result.output
    assert current_revision(sqlite_url) == head_revision()
    assert _migration_events(sqlite_url) == []
    verify = CliRunner().invoke(audit_group, ["verify", "--url", sqlite_url, "--json"])
    assert verify.exit_code == 0 and json.loads(verify.output)["events"] == 2


def test_a_downgrade_that_keeps_an_empty_trail_runs(tmp_path: Path) -> None:
    """With no event there is nothing to keep verifiable: head -> 0001 runs, records
    nothing (a record would be the first format-2 row), and upgrades back."""
    url = f"sqlite:///{tmp_path / 'empty.db'}"
    upgrade(url)
    result = CliRunner().invoke(db_group, ["downgrade", url, "--revision", "0001"])
    assert result.exit_code == 0, result.output
    assert current_revision(url) == "0001"
    upgrade(url)
    assert _migration_events(url) == []


def test_downgrade_of_a_missing_file_creates_nothing(tmp_path: Path) -> None:
    """A mistyped SQLite path: exit 3, and no empty file left behind."""
    path = tmp_path / "typo.db"
    result = CliRunner().invoke(db_group, ["downgrade", f"sqlite:///{path}"])
    assert result.exit_code == 3 and "no audit database" in result.output
    assert not path.exists()


def _migration_events(url: str) -> list[dict[str, object]]:
    out = CliRunner().invoke(
        audit_group,
        ["events", "--type", "schema_migration", "--url", url, "--json", "--allow-empty"],
    )
    assert out.exit_code == 0, out.output
    return [e["details"] for e in json.loads(out.output)]


def test_an_upgrade_of_a_trail_with_events_is_audited(sqlite_url: str) -> None:
    """An older trail holding events (written before chain format 2) upgraded to the
    head: a schema_migration event after it, and the mixed trail verifies."""
    old = store_format1_trail(sqlite_url)
    result = CliRunner().invoke(db_group, ["upgrade", sqlite_url])
    assert result.exit_code == 0, result.output
    assert _migration_events(sqlite_url) == [
        {"operation": "upgrade", "from": old, "to": head_revision()}
    ]
    verify = CliRunner().invoke(audit_group, ["verify", "--url", sqlite_url, "--json"])
    assert verify.exit_code == 0, verify.output


def test_creating_a_schema_records_nothing(tmp_path: Path) -> None:
    """A new database (no events) gets no event: the trail stays empty."""
    url = f"sqlite:///{tmp_path / 'new.db'}"
    assert CliRunner().invoke(db_group, ["upgrade", url]).exit_code == 0
    assert _migration_events(url) == []
    assert CliRunner().invoke(db_group, ["upgrade", url]).exit_code == 0  # already at head
    assert _migration_events(url) == []


def test_the_migration_event_is_signed_with_the_writers_key(
    sqlite_url: str, tmp_path: Path
) -> None:
    """--signing-key: verify --require-checkpoints with the writers' public key passes,
    the kvgov-db stream included (an older trail, signed with that key, upgraded)."""
    key = tmp_path / "writer.pem"
    writer = FIXTURE_KEY_PRIVATE
    key.write_bytes(writer.private_bytes(Encoding.PEM, PrivateFormat.PKCS8, NoEncryption()))
    key.chmod(0o600)  # a key file open to group or others is refused
    pub = tmp_path / "writer.pem.pub"
    pub.write_bytes(
        writer.public_key().public_bytes(Encoding.PEM, PublicFormat.SubjectPublicKeyInfo)
    )
    store_format1_trail(sqlite_url)
    result = CliRunner().invoke(db_group, ["upgrade", sqlite_url, "--signing-key", str(key)])
    assert result.exit_code == 0, result.output
    args = ["verify", "--url", sqlite_url, "--json", "--require-checkpoints",
            "--public-key", str(pub)]  # fmt: skip
    report = json.loads(CliRunner().invoke(audit_group, args).output)
    assert report["ok"], report
    assert MIGRATION_STREAM in {s["stream"] for s in report["streams"]}
