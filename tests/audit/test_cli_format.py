"""Scriptable output: full values in a pipe, and --format text|json|jsonl|csv."""

from __future__ import annotations

import csv
import io
import json
import os
import pty
import subprocess
import sys
from datetime import datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvgov.audit import AuditEvent, AuditLog, EventType
from kvgov.cli.audit import audit_group

from .conftest import sample_event

KVGOV = str(Path(sys.executable).with_name("kvgov"))
LONG_TENANT = "tenant-" + "x" * 60
LONG_SEQ = "request-" + "0123456789abcdef" * 4


@pytest.fixture()
def url(sqlite_url: str) -> str:
    """A trail holding events with ids far wider than an 80-column table cell."""
    with AuditLog(sqlite_url, "worker-with-a-rather-long-stream-name-0001") as log:
        for i in range(3):
            log.record(sample_event(i))
        log.record(
            AuditEvent(EventType.ADMISSION, tenant=LONG_TENANT, sequence_id=LONG_SEQ,
                       decision_id="d" * 40)
        )  # fmt: skip
    return sqlite_url


def test_a_pipe_gets_full_values_not_a_cut_table(url: str) -> None:
    """`kvgov audit events | cat`: every id whole, no `…`, one tab-separated line a row."""
    out = subprocess.run(
        [KVGOV, "audit", "events", "--url", url],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "COLUMNS": "80"},
    ).stdout
    assert "…" not in out
    lines = out.splitlines()
    header = lines[0].split("\t")
    assert header[:3] == ["time", "event_id", "type"]
    assert len(lines) == 5 and all(len(line.split("\t")) == len(header) for line in lines)
    row = dict(zip(header, lines[-1].split("\t"), strict=True))
    assert row["tenant"] == LONG_TENANT and row["sequence_id"] == LONG_SEQ
    assert row["event_id"] == "worker-with-a-rather-long-stream-name-0001:4"


def test_a_terminal_still_gets_the_table(url: str) -> None:
    """On a terminal the rich table (with its title) is kept."""
    leader, follower = pty.openpty()
    try:
        proc = subprocess.run(
            [KVGOV, "audit", "events", "--url", url],
            stdout=follower,
            stderr=subprocess.PIPE,
            check=True,
            env={**os.environ, "COLUMNS": "200", "TERM": "xterm"},
        )
        assert proc.returncode == 0
        os.close(follower)
        follower = -1
        chunks = []
        while True:
            try:
                data = os.read(leader, 65536)
            except OSError:
                break
            if not data:
                break
            chunks.append(data)
    finally:
        if follower >= 0:
            os.close(follower)
        os.close(leader)
    text = b"".join(chunks).decode()
    assert "events (4)" in text and "\t" not in text


def _run(args: list[str]) -> str:
    result = CliRunner().invoke(audit_group, args)
    assert result.exit_code == 0, result.output
    return result.output


def _is_utc_iso(value: str) -> bool:
    parsed = datetime.fromisoformat(value)
    return value.endswith("+00:00") and parsed.utcoffset() is not None and "." in value


@pytest.mark.parametrize(
    "args",
    [["events"], ["reuse", "--tenant", "acme"], ["denials", "--allow-empty"],
     ["decisions", "--policy-revision", "rev-a"], ["erasure", "--tenant", "acme"]],
)  # fmt: skip
def test_every_query_prints_json_jsonl_and_csv(url: str, args: list[str]) -> None:
    """json is an array, jsonl one object a line, csv a header and rows: the same records."""
    base = [*args, "--url", url]
    as_json = json.loads(_run([*base, "--format", "json"]))
    assert json.loads(_run([*base, "--json"])) == as_json
    lines = [json.loads(line) for line in _run([*base, "--format", "jsonl"]).splitlines()]
    assert lines == as_json
    rows = list(csv.DictReader(io.StringIO(_run([*base, "--format", "csv"]))))
    assert [r["event_id"] for r in rows] == [r["event_id"] for r in as_json]
    for r in as_json:
        assert _is_utc_iso(r["time"])


def test_times_are_iso_8601_utc_with_offset(url: str) -> None:
    """Every record's time: ISO 8601, microseconds, +00:00 (in json and csv alike)."""
    records = json.loads(_run(["events", "--url", url, "--format", "json"]))
    rows = list(csv.DictReader(io.StringIO(_run(["events", "--url", url, "--format", "csv"]))))
    assert [r["time"] for r in rows] == [r["time"] for r in records]
    assert all(_is_utc_iso(r["time"]) for r in records)
    cps = json.loads(_run(["checkpoints", "--url", url, "--format", "json"]))
    assert cps and all(_is_utc_iso(c["time"]) for c in cps)


def test_counts_and_checkpoints_in_every_format(url: str) -> None:
    """events --count-by and checkpoints take --format too."""
    base = ["events", "--count-by", "type", "--url", url]
    counts = json.loads(_run([*base, "--format", "json"]))
    lines = [json.loads(x) for x in _run([*base, "--format", "jsonl"]).splitlines()]
    assert {x["type"]: x["count"] for x in lines} == counts
    table = _run([*base, "--format", "csv"]).splitlines()
    assert table[0] == "type,count" and len(table) == len(counts) + 1
    cps = list(csv.DictReader(io.StringIO(_run(["checkpoints", "--url", url, "--csv"]))))
    assert cps and set(cps[0]) >= {"stream", "seq", "chain_hash", "signature", "time"}


def test_status_and_quarantine_list_take_format(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """status --format jsonl prints one object per spool; csv a header line."""
    # status also lists the streams of the working directory: an empty one here (a
    # checkout's root holds the markers of any server a benchmark or test ran there)
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    spool = tmp_path / "w1.spool.jsonl"
    spool.write_text("")
    out = _run(["status", "--spool", str(spool), "--format", "jsonl"])
    [entry] = [json.loads(x) for x in out.splitlines()]
    assert entry["spool"] == str(spool)
    assert _run(["status", "--spool", str(spool), "--format", "csv"]).startswith("spool,stream,")
    assert _run(["quarantine", "list", "--spool", str(spool), "--format", "jsonl"]) == ""


def test_two_formats_at_once_are_a_usage_error(url: str) -> None:
    """--format csv --json: exit 2."""
    result = CliRunner().invoke(audit_group, ["events", "--url", url, "--format", "csv", "--json"])
    assert result.exit_code == 2 and "one output format" in result.output


def test_export_takes_json_too(url: str, tmp_path: Path) -> None:
    """export --format json: one array holding the same events as jsonl."""
    result = CliRunner().invoke(audit_group, ["export", "--url", url])
    assert result.exit_code == 0 and result.stderr == "exported 4 events\n"
    jsonl = [json.loads(x) for x in result.stdout.splitlines()]
    out = tmp_path / "all.json"
    _run(["export", "--url", url, "--format", "json", "--output", str(out)])
    assert json.loads(out.read_text()) == jsonl and len(jsonl) == 4


def test_status_lists_a_spool_once_when_its_directory_is_scanned_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spool given by its absolute path, in the working directory status scans, is one
    stream, not two (it was listed under both names)."""
    monkeypatch.chdir(tmp_path)
    spool = tmp_path / "kvgov-audit.w1.spool.jsonl"
    spool.write_text("")
    out = _run(["status", "--spool", str(spool), "--format", "jsonl"])
    [entry] = [json.loads(x) for x in out.splitlines()]
    assert entry["spool"] == str(spool)
