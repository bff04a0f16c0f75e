"""verify(): every kind of tampering is found (after the attacker drops the triggers)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, text

from kvgov.audit import AuditLog, load_public_key, verify
from kvgov.audit.chain import GENESIS_HASH, canonical_event_bytes, chain_hash
from kvgov.audit.models import EVENT_INSERT_COLUMNS
from kvgov.audit.signing import generate_key_files
from kvgov.audit.store import normalize_url
from kvgov.cli.audit import audit_group

from .conftest import attacker, sample_event

Populate = Callable[..., AuditLog]
W = "stream = 'w1'"


def _first(url: str) -> tuple[int, str]:
    report = verify(url)
    assert not report.ok
    bad = report.streams[0].first_bad
    assert bad is not None
    return bad.seq, bad.kind


def test_untouched_log_verifies(db_url: str, populate: Populate) -> None:
    """A log nobody touched verifies, with its checkpoints reported untrusted."""
    populate(db_url, 25)
    report = verify(db_url)
    assert report.ok and report.events == 25 and report.checkpoints == 4
    assert report.untrusted_checkpoints == 4


def test_edited_field_is_detected(db_url: str, populate: Populate) -> None:
    """Changing one stored field of one event is reported at that event."""
    populate(db_url, 25)
    attacker(db_url, f"UPDATE audit_events SET requester_tenant = 'evil' WHERE {W} AND seq = 7")
    assert _first(db_url) == (7, "hash_mismatch")


def test_edited_details_are_detected(db_url: str, populate: Populate) -> None:
    """Changing the JSON details is detected even though JSONB reorders keys."""
    populate(db_url, 25)
    attacker(db_url, f"UPDATE audit_events SET block_ids = '[1, 2, 3]' WHERE {W} AND seq = 3")
    assert _first(db_url) == (3, "hash_mismatch")


def test_deleted_row_is_detected(db_url: str, populate: Populate) -> None:
    """Deleting an event shows as a gap at the next event."""
    populate(db_url, 25)
    attacker(db_url, f"DELETE FROM audit_events WHERE {W} AND seq = 12")
    assert _first(db_url) == (13, "seq_gap")


def test_inserted_row_is_detected(db_url: str, populate: Populate) -> None:
    """Inserting an event (renumbering the ones after it) breaks the chain there."""
    populate(db_url, 25)
    cols = ", ".join(c for c in EVENT_INSERT_COLUMNS if c != "seq")
    attacker(
        db_url,
        f"UPDATE audit_events SET seq = seq + 1000 WHERE {W} AND seq > 5",
        f"UPDATE audit_events SET seq = seq - 999 WHERE {W} AND seq > 1000",
        f"INSERT INTO audit_events (seq, {cols}) SELECT 6, {cols} FROM audit_events "
        f"WHERE {W} AND seq = 5",
    )
    assert _first(db_url) == (6, "broken_link")


def test_swapped_rows_are_detected(db_url: str, populate: Populate) -> None:
    """Swapping the order of two events is reported at the first of them."""
    populate(db_url, 25)
    attacker(
        db_url,
        f"UPDATE audit_events SET seq = -3 WHERE {W} AND seq = 3",
        f"UPDATE audit_events SET seq = 3 WHERE {W} AND seq = 4",
        f"UPDATE audit_events SET seq = 4 WHERE {W} AND seq = -3",
    )
    assert _first(db_url) == (3, "broken_link")


def test_tail_cut_before_a_checkpoint_is_detected(db_url: str, populate: Populate) -> None:
    """Events removed up to a surviving checkpoint are reported as cut off."""
    populate(db_url, 25)  # checkpoints at 10, 20, 25
    attacker(
        db_url,
        f"DELETE FROM audit_events WHERE {W} AND seq > 15",
        f"DELETE FROM audit_checkpoints WHERE {W} AND seq = 25",
    )
    assert _first(db_url) == (20, "checkpoint_beyond_end")


def test_tail_cut_with_its_checkpoints_is_not_detectable(db_url: str, populate: Populate) -> None:
    """Documented limit: a cut back to a checkpoint, deleting later ones too, looks intact."""
    populate(db_url, 25)
    attacker(
        db_url,
        f"DELETE FROM audit_events WHERE {W} AND seq > 20",
        f"DELETE FROM audit_checkpoints WHERE {W} AND seq > 20",
    )
    report = verify(db_url)
    assert report.ok and report.streams[0].last_seq == 20


def test_rewritten_chain_is_caught_by_checkpoints(db_url: str, populate: Populate) -> None:
    """An attacker who edits an event and recomputes every later hash fails the checkpoint."""
    populate(db_url, 25)
    engine = create_engine(normalize_url(db_url))
    with engine.connect() as conn:
        rows = conn.execute(
            text(
                f"SELECT {', '.join(EVENT_INSERT_COLUMNS[1:19])} FROM audit_events "
                "WHERE stream = 'w1' ORDER BY seq"  # seq .. policy_revision
            )
        ).all()
    engine.dispose()
    prev = GENESIS_HASH
    stmts = []
    for r in rows:
        ev = sample_event(r[0] - 1)
        head = ("w1", *r)
        if r[0] == 4:
            head = (*head[:4], "forged", *head[5:])  # tenant column
        bids = "[" + ",".join(str(b) for b in ev.block_ids) + "]"
        det = f'{{"i":{r[0] - 1},"note":"ok"}}'
        h = chain_hash(prev, canonical_event_bytes(head, bids, det))
        if r[0] >= 4:
            tenant = "'forged'" if r[0] == 4 else f"'{head[4]}'"
            stmts.append(
                f"UPDATE audit_events SET tenant = {tenant}, prev_hash = {_lit(db_url, prev)}, "
                f"hash = {_lit(db_url, h)} WHERE {W} AND seq = {r[0]}"
            )
        prev = h
    attacker(db_url, *stmts)
    assert _first(db_url) == (10, "checkpoint_mismatch")


def _lit(url: str, b: bytes) -> str:
    return f"'\\x{b.hex()}'::bytea" if url.startswith("postgresql") else f"X'{b.hex()}'"


def test_forged_checkpoint_signature_is_detected(db_url: str, populate: Populate) -> None:
    """A checkpoint whose signature was altered fails."""
    populate(db_url, 25)
    zero = _lit(db_url, bytes(64))
    attacker(db_url, f"UPDATE audit_checkpoints SET signature = {zero} WHERE seq = 10")
    assert _first(db_url) == (10, "bad_signature")


def test_trusted_keys(db_url: str, tmp_path: Path, clock: object) -> None:
    """With --public-key, the configured key is trusted and any other key fails."""
    files = generate_key_files(tmp_path / "k.pem")
    other = generate_key_files(tmp_path / "o.pem")
    with AuditLog(db_url, "w1", signing_key=str(files.private), checkpoint_every=5) as log:
        for i in range(10):
            log.record(sample_event(i))
    good = verify(db_url, [load_public_key(files.public)])
    assert good.ok and good.untrusted_checkpoints == 0 and good.checkpoints == 3
    bad = verify(db_url, [load_public_key(other.public)])
    assert not bad.ok and bad.problems[0].kind == "untrusted_key"


def test_signing_key_from_env(db_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """KVGOV_SIGNING_KEY may hold PEM text; its key id is the one checkpoints carry."""
    files = generate_key_files(tmp_path / "k.pem")
    monkeypatch.setenv("KVGOV_SIGNING_KEY", files.private.read_text())
    with AuditLog(db_url, "w1") as log:
        log.record(sample_event(0))
        assert log.key_id == files.key_id
    assert verify(db_url, [load_public_key(files.public)]).ok


def test_many_streams_verify_independently(db_url: str, populate: Populate) -> None:
    """Tampering with one stream leaves the others verified."""
    populate(db_url, 12, worker_id="w1")
    populate(db_url, 12, worker_id="w2")
    attacker(db_url, f"UPDATE audit_events SET tenant = 'x' WHERE {W} AND seq = 2")
    report = verify(db_url)
    by = {s.stream: s for s in report.streams}
    assert not by["w1"].ok and by["w2"].ok


def test_non_ascii_and_control_characters_verify(db_url: str, tmp_path: Path) -> None:
    """Text fields with non-ASCII, DEL, quotes and control characters verify, and edits show."""
    from kvgov.audit import AuditEvent, EventType

    odd = 'caf\u00e9 \u2603 \U0001f600 \x7f "q" \\ \n\t\x01'
    with AuditLog(db_url, "w1", spool_path=tmp_path / "s.jsonl") as log:
        for i in range(3):
            log.record(AuditEvent(EventType.ADMISSION, tenant=odd, model=f"m\u00fc{i}"))
    assert verify(db_url).ok
    attacker(db_url, f"UPDATE audit_events SET model = 'mu1' WHERE {W} AND seq = 2")
    assert _first(db_url) == (2, "hash_mismatch")


def test_blob_in_a_text_column_is_reported(tmp_path: Path, populate: Populate) -> None:
    """A value JSON cannot hold (SQLite lets a BLOB into any column) shows as an edit."""
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    populate(url, 12)
    attacker(url, f"UPDATE audit_events SET tenant = X'00ff' WHERE {W} AND seq = 5")
    assert _first(url) == (5, "hash_mismatch")


# --------------------------------------------------------------------------- issue 17 H


def _forge(url: str, stream: str, first_seq: int, prev: bytes, n: int, t0: int) -> bytes:
    """Insert n format-2 events with correct chain hashes (anyone can compute SHA-256)."""
    from sqlalchemy import insert

    from kvgov.audit.events import FIELDS
    from kvgov.audit.models import AuditEventRow

    rows = []
    for i in range(n):
        seq = first_seq + i
        values = dict.fromkeys(FIELDS)
        values["tenant"] = "forged"
        head = (stream, seq, t0 + i, "admission", *(values[f] for f in FIELDS))
        h = chain_hash(prev, canonical_event_bytes(head, "[]", "{}"))  # type: ignore[arg-type]
        rows.append(
            {"stream": stream, "seq": seq, "time_us": t0 + i, "type": "admission", **values,
             "block_ids": [], "details": {}, "chain_format": 2, "prev_hash": prev, "hash": h}
        )  # fmt: skip
        prev = h
    engine = create_engine(normalize_url(url))
    with engine.begin() as conn:
        conn.execute(insert(AuditEventRow), rows)
    engine.dispose()
    return prev


def _head(url: str, stream: str = "w1") -> tuple[int, bytes, int]:
    engine = create_engine(normalize_url(url))
    with engine.connect() as conn:
        seq, h, t = conn.execute(
            text(f"SELECT seq, hash, time_us FROM audit_events WHERE stream = '{stream}' "
                 "ORDER BY seq DESC LIMIT 1")
        ).one()  # fmt: skip
    engine.dispose()
    return int(seq), bytes(h), int(t)


def _signed(url: str, tmp_path: Path, n: int = 25, worker: str = "w1") -> object:
    files = tmp_path / "writer.pem"
    if not files.exists():
        generate_key_files(files)
    with AuditLog(url, worker, signing_key=str(files), checkpoint_every=10) as log:
        for i in range(n):
            log.record(sample_event(i))
    return load_public_key(tmp_path / "writer.pem.pub")


def test_edited_prev_hash_column_is_detected(db_url: str, populate: Populate) -> None:
    """prev_hash is checked against the recomputed chain, not only used to diagnose."""
    populate(db_url, 25)
    attacker(db_url, f"UPDATE audit_events SET prev_hash = {_lit(db_url, bytes(32))} "
             f"WHERE {W} AND seq = 7")  # fmt: skip
    assert _first(db_url) == (7, "broken_link")


def test_deleted_checkpoints_and_rewritten_history_fail_when_checkpoints_are_required(
    db_url: str, tmp_path: Path
) -> None:
    """Without checkpoints a rewritten chain is self-consistent; requiring them finds it."""
    pub = _signed(db_url, tmp_path)
    attacker(db_url, "DELETE FROM audit_checkpoints", f"DELETE FROM audit_events WHERE {W}")
    _forge(db_url, "w1", 1, bytes(32), 25, 1_700_000_000_000_000)
    assert verify(db_url, [pub]).ok  # type: ignore[list-item]  # the documented limit
    report = verify(db_url, [pub], require_checkpoints=True)  # type: ignore[list-item]
    assert not report.ok and report.problems[0].kind == "no_checkpoint"


def test_a_forged_stream_fails_with_required_checkpoints_or_expected_streams(
    db_url: str, tmp_path: Path
) -> None:
    """A whole stream made up by someone with database access is found two ways."""
    from kvgov.audit.expect import ExpectedStream, load_expected_streams, sign_expected_streams
    from kvgov.audit.signing import load_signing_key

    pub = _signed(db_url, tmp_path)
    auditor = generate_key_files(tmp_path / "auditor.pem")
    key = load_signing_key(str(auditor.private))
    assert key is not None
    head = verify(db_url, [pub]).streams[0]  # type: ignore[list-item]
    listing = tmp_path / "streams.json"
    listing.write_text(
        sign_expected_streams([ExpectedStream("w1", head.last_seq, head.head_hash)], key, 0)
    )
    _forge(db_url, "intruder", 1, bytes(32), 5, 1_700_000_000_000_000)
    assert verify(db_url, [pub]).ok  # type: ignore[list-item]  # the documented limit
    required = verify(db_url, [pub], require_checkpoints=True)  # type: ignore[list-item]
    assert [(p.stream, p.kind) for p in required.problems] == [("intruder", "no_checkpoint")]
    trusted = {auditor.key_id: load_public_key(auditor.public)}
    expected = load_expected_streams(listing, trusted)
    report = verify(db_url, [pub], expected=expected)  # type: ignore[list-item]
    assert [(p.stream, p.kind) for p in report.problems] == [("intruder", "unexpected_stream")]


def test_a_deleted_or_cut_stream_fails_against_the_expected_streams(
    db_url: str, tmp_path: Path
) -> None:
    """A stream deleted whole, or cut with its checkpoints, no longer matches the signed list."""
    from kvgov.audit.expect import ExpectedStream, load_expected_streams, sign_expected_streams
    from kvgov.audit.signing import load_signing_key

    pub = _signed(db_url, tmp_path, worker="w1")
    _signed(db_url, tmp_path, worker="w2")
    auditor = generate_key_files(tmp_path / "auditor.pem")
    key = load_signing_key(str(auditor.private))
    assert key is not None
    streams = [
        ExpectedStream(s.stream, s.last_seq, s.head_hash)
        for s in verify(db_url, [pub]).streams  # type: ignore[list-item]
    ]
    listing = tmp_path / "streams.json"
    listing.write_text(sign_expected_streams(streams, key, 0))
    attacker(
        db_url,
        "DELETE FROM audit_events WHERE stream = 'w2'",
        "DELETE FROM audit_checkpoints WHERE stream = 'w2'",
        f"DELETE FROM audit_events WHERE {W} AND seq > 20",
        f"DELETE FROM audit_checkpoints WHERE {W} AND seq > 20",
    )
    assert verify(db_url, [pub]).ok  # type: ignore[list-item]  # the documented limit
    expected = load_expected_streams(listing, {auditor.key_id: load_public_key(auditor.public)})
    report = verify(db_url, [pub], expected=expected)  # type: ignore[list-item]
    kinds = sorted((p.stream, p.kind) for p in report.problems)
    assert kinds == [("w1", "expected_beyond_end"), ("w2", "missing_stream")]


def test_events_appended_after_the_last_checkpoint_are_bounded(db_url: str, tmp_path: Path) -> None:
    """Forged events after the last checkpoint pass only within the allowed unsigned tail."""
    pub = _signed(db_url, tmp_path)
    seq, h, t = _head(db_url)
    _forge(db_url, "w1", seq + 1, h, 3, t + 1)
    assert verify(db_url, [pub], require_checkpoints=True).ok  # type: ignore[list-item]
    strict = verify(db_url, [pub], require_checkpoints=True, max_unsigned_events=0)  # type: ignore[list-item]
    assert [p.kind for p in strict.problems] == ["unsigned_tail"]
    late = seq + 4
    _forge(db_url, "w1", late, _head(db_url)[1], 1, t + 10**9)  # 1000 s of event time later
    timed = verify(db_url, [pub], require_checkpoints=True, max_unsigned_seconds=60)  # type: ignore[list-item]
    assert [p.kind for p in timed.problems] == ["unsigned_tail"]


def test_an_altered_or_untrusted_expected_streams_list_is_refused(
    db_url: str, tmp_path: Path
) -> None:
    """A list whose signature fails, or that no trusted key signed, is an error, not a pass."""
    from kvgov.audit.expect import ExpectedStream, load_expected_streams, sign_expected_streams
    from kvgov.audit.signing import load_signing_key
    from kvgov.exceptions import ExpectedStreamsError

    auditor = generate_key_files(tmp_path / "auditor.pem")
    key = load_signing_key(str(auditor.private))
    assert key is not None
    listing = tmp_path / "streams.json"
    listing.write_text(sign_expected_streams([ExpectedStream("w1", 0, "00" * 32)], key, 0))
    trusted = {auditor.key_id: load_public_key(auditor.public)}
    assert load_expected_streams(listing, trusted).streams[0].stream == "w1"
    with pytest.raises(ExpectedStreamsError) as untrusted:
        load_expected_streams(listing, {})
    assert untrusted.value.tampered
    listing.write_text(listing.read_text().replace('"w1"', '"w2"'))
    with pytest.raises(ExpectedStreamsError, match="altered") as altered:
        load_expected_streams(listing, trusted)
    assert altered.value.tampered


# --------------------------------------------------------------------------- issue 25, 9

#: (table, column, value, where): a value of the wrong type, which SQLite stores in any
#: column (only NOT NULL is enforced).
WRONG_TYPES_SQLITE = [
    ("audit_events", "stream", "X'7731'", f"{W} AND seq = 5"),
    ("audit_events", "seq", "'five'", f"{W} AND seq = 5"),
    ("audit_events", "seq", "X'05'", f"{W} AND seq = 5"),
    ("audit_events", "seq", "5.5", f"{W} AND seq = 5"),
    ("audit_events", "time_us", "1700000000.5", f"{W} AND seq = 5"),
    ("audit_events", "time_us", "'soon'", f"{W} AND seq = 5"),
    ("audit_events", "type", "X'00ff'", f"{W} AND seq = 5"),
    ("audit_events", "token_count", "'many'", f"{W} AND seq = 5"),
    ("audit_events", "block_ids", "X'5b315d'", f"{W} AND seq = 5"),
    ("audit_events", "block_ids", "7", f"{W} AND seq = 5"),
    ("audit_events", "details", "42", f"{W} AND seq = 5"),
    ("audit_events", "details", "X'7b7d'", f"{W} AND seq = 5"),
    ("audit_events", "prev_hash", "'text'", f"{W} AND seq = 5"),
    ("audit_events", "hash", "'text'", f"{W} AND seq = 5"),
    ("audit_events", "hash", "5", f"{W} AND seq = 5"),
    ("audit_events", "hash", "2.5", f"{W} AND seq = 5"),
    ("audit_events", "chain_format", "'two'", f"{W} AND seq = 5"),
    ("audit_events", "chain_format", "X'02'", f"{W} AND seq = 5"),
    ("audit_checkpoints", "stream", "X'7731'", "seq = 10"),
    ("audit_checkpoints", "seq", "'ten'", "seq = 10"),
    ("audit_checkpoints", "chain_hash", "'text'", "seq = 10"),
    ("audit_checkpoints", "signature", "64", "seq = 10"),
    ("audit_checkpoints", "key_id", "X'00'", "seq = 10"),
    ("audit_keys", "public_key", "'text'", "1 = 1"),
]
#: What PostgreSQL can store of the same kind: its types are strict, JSONB holds any JSON.
WRONG_TYPES_ANY_DB = [
    ("audit_events", "block_ids", "'\"1\"'", f"{W} AND seq = 5"),
    ("audit_events", "block_ids", "'{\"a\": 1}'", f"{W} AND seq = 5"),
    ("audit_events", "details", "'42'", f"{W} AND seq = 5"),
    ("audit_events", "details", "'null'", f"{W} AND seq = 5"),
    ("audit_events", "details", "'[\"x\"]'", f"{W} AND seq = 5"),
    ("audit_events", "hash", "X'00'", f"{W} AND seq = 5"),
]


def _verify_wrong_type(url: str, tmp_path: Path, table: str, column: str, value: str,
                       where: str) -> None:  # fmt: skip
    """Sign a trail, store ``value`` in one column; verify must report it and exit 1."""
    _signed(url, tmp_path, 20)
    if url.startswith("postgresql") and value.startswith("X'"):
        value = _lit(url, bytes.fromhex(value[2:-1]))
    attacker(url, f"UPDATE {table} SET {column} = {value} WHERE {where}")
    result = CliRunner().invoke(audit_group, ["verify", "--url", url, "--json"])
    assert result.exit_code == 1, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    report = json.loads(result.output)
    assert not report["ok"]
    assert [p for s in report["streams"] for p in s["problems"]]


@pytest.mark.parametrize(("table", "column", "value", "where"), WRONG_TYPES_SQLITE)
def test_a_wrongly_typed_column_is_an_edit_on_sqlite(
    tmp_path: Path, table: str, column: str, value: str, where: str
) -> None:
    """A BLOB, text, real or integer where another type belongs: exit 1, no traceback."""
    _verify_wrong_type(f"sqlite:///{tmp_path / 'audit.db'}", tmp_path, table, column, value, where)


@pytest.mark.parametrize(("table", "column", "value", "where"), WRONG_TYPES_ANY_DB)
def test_a_wrongly_typed_json_column_is_an_edit(
    db_url: str, tmp_path: Path, table: str, column: str, value: str, where: str
) -> None:
    """JSON of the wrong shape (SQLite and PostgreSQL): exit 1, no traceback."""
    _verify_wrong_type(db_url, tmp_path, table, column, value, where)


def test_a_wrongly_typed_hash_is_named_and_the_chain_goes_on(tmp_path: Path) -> None:
    """The report names the column and its type; the events after it still verify."""
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    _signed(url, tmp_path, 20)
    attacker(url, f"UPDATE audit_events SET hash = 'text' WHERE {W} AND seq = 5")
    report = verify(url)
    problems = report.problems
    assert (problems[0].seq, problems[0].kind) == (5, "wrong_type")
    assert "hash holds text ('text'), not a BLOB" in problems[0].message
    assert {p.seq for p in problems} <= {5, 6}  # 6's link names the lost hash; no more


def test_a_blob_stream_is_reported_under_its_repr(tmp_path: Path) -> None:
    """Events moved to a BLOB stream: reported (no `bytes is not JSON` crash) and missing
    from their own stream."""
    url = f"sqlite:///{tmp_path / 'audit.db'}"
    _signed(url, tmp_path, 20)
    attacker(url, f"UPDATE audit_events SET stream = X'7731' WHERE {W} AND seq = 5")
    streams = {s.stream: s for s in verify(url).streams}
    assert streams["b'w1'"].problems[0].kind == "wrong_type"
    assert streams["b'w1'"].events == 1
    assert streams["w1"].first_bad is not None and streams["w1"].first_bad.kind == "seq_gap"
