"""`kvgov audit ...` and `kvgov db ...` run and their --json output parses."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvgov.audit import AuditEvent, AuditLog, EventType
from kvgov.cli.audit import audit_group, db_group

from .conftest import attacker, sample_event, sqlite_locked


@pytest.fixture()
def url(sqlite_url: str, tmp_path: Path) -> str:
    """A SQLite audit database with a few events of each queried kind."""
    with AuditLog(sqlite_url, "w1", spool_path=tmp_path / "s.jsonl", checkpoint_every=5) as log:
        for i in range(8):
            log.record(sample_event(i))
        log.record(AuditEvent(EventType.ERASURE, tenant="acme", details={"bytes_zeroized": 8}))
        log.record(AuditEvent(EventType.POLICY_DENIED, tenant="acme", policy_revision="rev-a"))
    return sqlite_url


def _json(args: list[str]) -> object:
    result = CliRunner().invoke(audit_group, args)
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


@pytest.mark.parametrize(
    ("args", "count"),
    [
        (["reuse", "--tenant", "acme"], 2),
        (["erasure", "--tenant", "acme"], 1),
        (["denials"], 1),
        (["denials", "--tenant", "beta"], 0),
        (["decisions", "--policy-revision", "rev-a"], 9),
        (["events", "--type", "admission"], 2),
        (["events", "--since", "2000-01-01T00:00:00"], 10),
    ],
)
def test_query_commands_json(url: str, args: list[str], count: int) -> None:
    """Each query command prints a JSON array of the expected length."""
    rows = _json([*args, "--url", url, "--json"])
    assert isinstance(rows, list) and len(rows) == count


def test_query_commands_table_and_csv(url: str) -> None:
    """The default rich table and --csv output both run."""
    runner = CliRunner()
    table = runner.invoke(audit_group, ["erasure", "--tenant", "acme", "--url", url])
    assert table.exit_code == 0 and "bytes_zeroized" in table.output
    out = runner.invoke(audit_group, ["reuse", "--tenant", "acme", "--url", url, "--csv"])
    assert out.exit_code == 0 and out.output.startswith("event_id,time,")


def test_events_count_by(url: str) -> None:
    """events --count-by type returns counts that add up to every event."""
    counts = _json(["events", "--count-by", "type", "--url", url, "--json"])
    assert isinstance(counts, dict) and sum(counts.values()) == 10


def test_url_from_environment(url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --url the KVGOV_AUDIT_URL environment variable is used."""
    monkeypatch.setenv("KVGOV_AUDIT_URL", url)
    assert len(_json(["denials", "--json"])) == 1  # type: ignore[arg-type]


def test_verify_ok_and_failure_exit_codes(url: str) -> None:
    """verify exits 0 on an intact log and 1 after tampering, naming the first bad event."""
    report = _json(["verify", "--url", url, "--json"])
    assert isinstance(report, dict) and report["ok"] and report["events"] == 10
    attacker(url, "UPDATE audit_events SET tenant = 'x' WHERE seq = 4")
    result = CliRunner().invoke(audit_group, ["verify", "--url", url])
    assert result.exit_code == 1 and "seq 4" in result.output


def test_verify_with_public_key_and_keygen(sqlite_url: str, tmp_path: Path) -> None:
    """keygen writes a key pair; verify --public-key trusts checkpoints signed with it."""
    runner = CliRunner()
    assert runner.invoke(audit_group, ["keygen", str(tmp_path / "k.pem")]).exit_code == 0
    with AuditLog(sqlite_url, "w1", signing_key=str(tmp_path / "k.pem")) as log:
        log.record(sample_event(0))
    args = ["verify", "--url", sqlite_url, "--public-key", str(tmp_path / "k.pem.pub"), "--json"]
    report = _json(args)
    assert isinstance(report, dict) and report["ok"] and report["untrusted_checkpoints"] == 0


def test_export_and_checkpoints(url: str, tmp_path: Path) -> None:
    """export --output writes JSON Lines; checkpoints --json lists the stream's latest."""
    out = tmp_path / "x.jsonl"
    result = CliRunner().invoke(audit_group, ["export", "--url", url, "--output", str(out)])
    assert result.exit_code == 0
    assert len(out.read_text().splitlines()) == 10
    cps = _json(["checkpoints", "--url", url, "--json"])
    assert isinstance(cps, list) and cps[0]["seq"] == 10


def test_db_commands(tmp_path: Path) -> None:
    """db upgrade / current / downgrade run; a query on a downgraded db says to upgrade (3)."""
    runner = CliRunner()
    url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    assert runner.invoke(db_group, ["upgrade", url]).exit_code == 0
    current = runner.invoke(db_group, ["current", "--url", url])
    assert "up to date" in current.output
    assert runner.invoke(db_group, ["downgrade", url, "--revision", "base"]).exit_code == 0
    refused = runner.invoke(audit_group, ["denials", "--url", url])
    assert refused.exit_code == 3 and "kvgov db upgrade" in refused.output  # environment
    sql = runner.invoke(db_group, ["upgrade", url, "--sql"])
    assert sql.exit_code == 0 and "CREATE TABLE audit_events" in sql.output


def test_status_lists_critical_events_whose_evidence_is_only_spooled(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An erasure spooled while the database is locked is listed by `audit status`."""

    from kvgov.audit import store as store_mod

    monkeypatch.setattr(store_mod, "SQLITE_BUSY_TIMEOUT_MS", 50)
    log = AuditLog(sqlite_url, "w1", retry_seconds=0.0)  # default spool: next to the file
    log.record(sample_event(0))
    log.flush()
    with sqlite_locked(sqlite_url):
        rec = log.record_durable(AuditEvent(EventType.ERASURE, tenant="acme"))
        assert rec.evidence == "spooled"
        result = CliRunner().invoke(audit_group, ["status", "--url", sqlite_url, "--json"])
        assert result.exit_code == 0, result.output
        [entry] = json.loads(result.output)
        assert entry["streams"] == ["w1"] and entry["writer"]["alive"] is True
        assert [c["event_id"] for c in entry["critical_spooled"]] == [rec.event_id]
        assert entry["critical_spooled"][0]["tenant"] == "acme"
        table = CliRunner().invoke(audit_group, ["status", "--url", sqlite_url])
        assert "only spooled" in table.output and rec.event_id in table.output
    log.close()
    after = CliRunner().invoke(audit_group, ["status", "--url", sqlite_url, "--json"])
    assert json.loads(after.output) == []  # replayed at close; the marker is gone


def test_verify_options_and_signed_stream_list(sqlite_url: str, tmp_path: Path) -> None:
    """`audit streams` signs the list; verify --require-checkpoints / --expect-streams use it."""
    runner = CliRunner()
    for name in ("writer", "auditor"):
        assert runner.invoke(audit_group, ["keygen", str(tmp_path / f"{name}.pem")]).exit_code == 0
    with AuditLog(sqlite_url, "w1", signing_key=str(tmp_path / "writer.pem")) as log:
        for i in range(5):
            log.record(sample_event(i))
    listing = tmp_path / "streams.json"
    pub = ["--public-key", str(tmp_path / "writer.pem.pub")]
    signed = runner.invoke(
        audit_group,
        ["streams", "--url", sqlite_url, "--key", str(tmp_path / "auditor.pem"),
         "--output", str(listing), *pub],
    )  # fmt: skip
    assert signed.exit_code == 0, signed.output
    assert json.loads(listing.read_text())["streams"][0]["seq"] == 5
    args = ["verify", "--url", sqlite_url, "--json", "--require-checkpoints",
            "--expect-streams", str(listing), *pub,
            "--public-key", str(tmp_path / "auditor.pem.pub")]  # fmt: skip
    assert json.loads(runner.invoke(audit_group, args).output)["ok"]
    with AuditLog(sqlite_url, "intruder") as log:  # a stream the list does not know
        log.record(sample_event(0))
    failed = runner.invoke(audit_group, args)
    assert failed.exit_code == 1
    problems = {
        (s["stream"], p["kind"])
        for s in json.loads(failed.output)["streams"]
        for p in s["problems"]
    }
    assert ("intruder", "unexpected_stream") in problems
    assert ("intruder", "untrusted_key") in problems
    listing.write_text(listing.read_text().replace('"seq": 5', '"seq": 4'))
    altered = runner.invoke(audit_group, args)
    assert altered.exit_code == 1 and altered.output.startswith("error: ")
