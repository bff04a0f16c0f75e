"""Chain format 2 beside format 1: a trail written before it verifies after the migration,
streams go on in format 2, a mixed trail verifies, tampering with either is named, the
spool keeps the format, and revision 0004_chain_format upgrades and downgrades.

The format-1 trail is ``tests/vectors/trail_format1.json``: rows, checkpoints, keys and a
spool written by kvgov before format 2 existed (its ``source`` names the commit).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from sqlalchemy import create_engine, inspect, text

from kvgov.audit import (
    AuditEvent,
    AuditLog,
    EventType,
    current_revision,
    downgrade,
    upgrade,
    verify,
)
from kvgov.audit import store as store_mod
from kvgov.audit.queries import AuditQueries
from kvgov.audit.signing import SigningKey, public_key_from_raw
from kvgov.audit.spool import Spool
from kvgov.audit.store import head_revision, normalize_url
from kvgov.cli.audit import audit_group
from kvgov.exceptions import AuditDowngradeRefused
from tests.support.pg_proxy import ProxiedPg

from .conftest import attacker, sample_event, scalar, sqlite_locked

TRAIL: dict[str, Any] = json.loads(
    (Path(__file__).parents[1] / "vectors" / "trail_format1.json").read_text("utf-8")
)
#: The key the fixture's checkpoints were signed with (seed 00 01 .. 1f).
KEY = SigningKey.from_private_key(
    Ed25519PrivateKey.from_private_bytes(bytes(range(32))), "configured"
)
PUB = public_key_from_raw(bytes.fromhex(TRAIL["public_key"]))
_HEX = {"prev_hash", "hash", "chain_hash", "signature", "public_key"}


def _insert(conn: Any, table: str, cols: list[str], rows: list[list[Any]]) -> None:
    pg = conn.dialect.name == "postgresql"
    values = ", ".join(
        f"CAST(:{c} AS jsonb)" if pg and c in ("block_ids", "details") else f":{c}" for c in cols
    )
    conn.execute(
        text(f"INSERT INTO {table} ({', '.join(cols)}) VALUES ({values})"),
        [
            {c: bytes.fromhex(v) if c in _HEX else v for c, v in zip(cols, r, strict=True)}
            for r in rows
        ],
    )


def load_format1_trail(url: str) -> None:
    """The fixture's rows, stored at the revision they were written at, then the upgrade."""
    store_format1_trail(url)
    upgrade(url)


def store_format1_trail(url: str) -> str:
    """The fixture's rows, stored at the revision they were written at (returned)."""
    upgrade(url, TRAIL["revision"])
    engine = create_engine(normalize_url(url))
    with engine.begin() as conn:
        _insert(conn, "audit_events", TRAIL["event_columns"], TRAIL["events"])
        _insert(conn, "audit_checkpoints",
                ["stream", "seq", "chain_hash", "signature", "key_id", "time_us"],
                TRAIL["checkpoints"])  # fmt: skip
        _insert(conn, "audit_keys",
                ["key_id", "algorithm", "public_key", "origin", "stream", "time_us"],
                TRAIL["keys"])  # fmt: skip
    engine.dispose()
    return str(TRAIL["revision"])


def _formats(url: str, stream: str) -> dict[int, int]:
    engine = create_engine(normalize_url(url))
    with engine.connect() as conn:
        rows = conn.execute(
            text("SELECT seq, chain_format FROM audit_events WHERE stream = :s ORDER BY seq"),
            {"s": stream},
        ).all()
    engine.dispose()
    return {int(s): int(f) for s, f in rows}


def _first_bad(url: str, *, trusted: bool = True) -> tuple[str, int, str]:
    report = verify(url, [PUB] if trusted else None)
    assert not report.ok
    bad = report.problems[0]
    return bad.stream, bad.seq, bad.kind


def test_a_format1_trail_verifies_after_the_migration(any_db_url: str) -> None:
    """Rows written before format 2 are format 1 after the upgrade, and verify, signed."""
    load_format1_trail(any_db_url)
    assert set(_formats(any_db_url, "old-a").values()) == {1}
    report = verify(any_db_url, [PUB], require_checkpoints=True, max_unsigned_events=0)
    assert report.ok, report.problems
    assert report.events == len(TRAIL["events"]) == 32
    assert report.checkpoints == len(TRAIL["checkpoints"]) and report.untrusted_checkpoints == 0


def test_a_stream_goes_on_in_format2_and_the_mixed_trail_verifies(
    any_db_url: str, tmp_path: Path
) -> None:
    """A writer continuing a format-1 stream seals format 2, linked by prev_hash."""
    load_format1_trail(any_db_url)
    odd = 'caf\u00e9 \U0001f600 \x7f "q"\n'
    with AuditLog(any_db_url, "old-a", signing_key=KEY, spool_path=tmp_path / "s.jsonl") as log:
        for i in range(4):
            log.record(AuditEvent(EventType.ADMISSION, tenant=odd, details={"x": 1e-05, "i": i}))
    formats = _formats(any_db_url, "old-a")
    assert [formats[s] for s in (1, 25, 26, 29)] == [1, 1, 2, 2]
    stored = scalar(
        any_db_url, "SELECT prev_hash FROM audit_events WHERE seq = 26 AND stream = 'old-a'"
    )
    head = scalar(any_db_url, "SELECT hash FROM audit_events WHERE seq = 25 AND stream = 'old-a'")
    assert bytes(stored) == bytes(head)  # type: ignore[arg-type]
    report = verify(any_db_url, [PUB], require_checkpoints=True, max_unsigned_events=0)
    assert report.ok, report.problems
    assert report.events == 36


def _tamper(url: str, sql: dict[str, str]) -> None:
    attacker(url, sql["postgresql" if url.startswith("postgresql") else "sqlite"])


_EDITS: dict[str, dict[str, str]] = {
    "tenant": dict.fromkeys(("sqlite", "postgresql"), "UPDATE audit_events SET tenant = 'evil'"),
    "details": {
        "sqlite": """UPDATE audit_events SET details = '{"i": 99}'""",
        "postgresql": """UPDATE audit_events SET details = '{"i": 99}'::jsonb""",
    },
    "format_flip": {
        "sqlite": "UPDATE audit_events SET chain_format = 3 - chain_format",
        "postgresql": "UPDATE audit_events SET chain_format = 3 - chain_format",
    },
}


@pytest.mark.parametrize("edit", sorted(_EDITS))
@pytest.mark.parametrize(("seq", "fmt"), [(2, 1), (27, 2)])
def test_tampering_with_a_row_of_either_format_is_named(
    any_db_url: str, tmp_path: Path, edit: str, seq: int, fmt: int
) -> None:
    """An edited field, edited details or a flipped chain_format fail at that row."""
    load_format1_trail(any_db_url)
    with AuditLog(any_db_url, "old-a", signing_key=KEY, spool_path=tmp_path / "s.jsonl") as log:
        for i in range(4):
            log.record(AuditEvent(EventType.ADMISSION, tenant="acme", details={"x": 1e-05, "i": i}))
    assert _formats(any_db_url, "old-a")[seq] == fmt
    where = f" WHERE stream = 'old-a' AND seq = {seq}"
    _tamper(any_db_url, {k: v + where for k, v in _EDITS[edit].items()})
    assert _first_bad(any_db_url) == ("old-a", seq, "hash_mismatch")


def test_an_unknown_chain_format_is_reported(db_url: str, tmp_path: Path) -> None:
    """A chain_format no kvgov writes names the row as unknown_format."""
    with AuditLog(db_url, "w1", spool_path=tmp_path / "s.jsonl") as log:
        for i in range(5):
            log.record(sample_event(i))
    attacker(db_url, "UPDATE audit_events SET chain_format = 7 WHERE stream = 'w1' AND seq = 3")
    report = verify(db_url)
    assert [(p.seq, p.kind) for p in report.problems] == [(3, "unknown_format")]


@pytest.mark.parametrize(
    ("key", "stored"), [("x", "0.50000000000000000001"), ("big", "1000000000000000000001")]
)
def test_a_number_rounding_to_the_same_double_is_an_edit(
    db_url: str, tmp_path: Path, key: str, stored: str
) -> None:
    """Format 2 reads JSONB numbers strictly: another decimal for the same double is caught."""
    with AuditLog(db_url, "w1", spool_path=tmp_path / "s.jsonl") as log:
        for _ in range(3):
            log.record(AuditEvent(EventType.ADMISSION, details={"x": 0.5, "big": 1e21}))
    assert verify(db_url).ok
    written = {"x": "0.5", "big": "1e+21"}[key]
    assert float(stored) == float(written)  # the same double: only the text differs
    where = " WHERE stream = 'w1' AND seq = 2"
    _tamper(db_url, {
        "sqlite": f"UPDATE audit_events SET details = replace(details, '{written}', '{stored}')"
        + where,
        "postgresql": f"UPDATE audit_events SET details = jsonb_set(details, '{{{key}}}', "
        f"'{stored}')" + where,
    })  # fmt: skip
    assert _first_bad(db_url, trusted=False) == ("w1", 2, "hash_mismatch")


# --------------------------------------------------------------------------- the spool


def _spooled_formats(path: Path) -> list[int]:
    lines = [json.loads(x) for x in path.read_text("utf-8").splitlines()]
    return [d["chain_format"] for d in lines if d["kind"] == "event"]


_FLOATS = {"x": 1e-05, "big": 1e20, "huge": 1e21, "s": "\u00e9\U0001f600"}


def test_sqlite_spool_keeps_the_format(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Events spooled while SQLite is locked are format 2 in the spool and after replay."""
    monkeypatch.setattr(store_mod, "SQLITE_BUSY_TIMEOUT_MS", 50)
    spool = tmp_path / "w1.spool.jsonl"
    log = AuditLog(sqlite_url, "w1", spool_path=spool, retry_seconds=3600, checkpoint_every=3)
    log.record(sample_event(0))
    log.flush()
    with sqlite_locked(sqlite_url):
        for _ in range(4):
            log.record(AuditEvent(EventType.ERASURE, tenant="acme", details=_FLOATS))
        assert _spooled_formats(spool) == [2, 2, 2, 2]
        assert [r[-3] for r in Spool(spool).read().events] == [2, 2, 2, 2]
    log.close()
    assert not spool.exists()
    assert set(_formats(sqlite_url, "w1").values()) == {2}
    assert verify(sqlite_url, require_checkpoints=True).ok


@pytest.mark.postgres
def test_postgresql_spool_keeps_the_format(pg_proxy: ProxiedPg, tmp_path: Path) -> None:
    """Events spooled while PostgreSQL is cut off replay as format 2 and verify."""
    spool = tmp_path / "pg.spool.jsonl"
    log = AuditLog(pg_proxy.url, "w1", spool_path=spool, retry_seconds=0.0, checkpoint_every=3)
    log.record(sample_event(0))
    log.flush()
    pg_proxy.proxy.kill()
    for _ in range(3):
        log.record(AuditEvent(EventType.ERASURE, tenant="acme", details=_FLOATS))
    assert _spooled_formats(spool) == [2, 2, 2]
    pg_proxy.proxy.start()
    log.flush()
    log.close()
    assert not spool.exists()
    assert set(_formats(pg_proxy.direct, "w1").values()) == {2}
    assert verify(pg_proxy.direct, require_checkpoints=True).ok


def test_a_spool_written_before_format2_replays_as_format1(db_url: str, tmp_path: Path) -> None:
    """A leftover spool from the old writer (no chain_format, no seals) replays as format 1
    where no signing key is configured (a spool nothing can authenticate, as documented);
    the stream goes on in format 2."""
    spool = tmp_path / "old.spool.jsonl"
    spool.write_text("\n".join(TRAIL["spool_lines"]) + "\n", encoding="utf-8")
    assert _spooled_formats_or_none(spool) == [None] * 6
    with AuditLog(db_url, "old-spool", spool_path=spool) as log:
        assert log.record(sample_event(1)) == "old-spool:7"
    assert not spool.exists()
    assert list(_formats(db_url, "old-spool").values()) == [1] * 6 + [2]
    # the old events verify under the old writer's key; only the new one (signed by this
    # process's ephemeral key) is outside the trusted checkpoints
    report = verify(db_url, [PUB], require_checkpoints=True, max_unsigned_events=0)
    assert {(p.seq, p.kind) for p in report.problems} <= {
        (7, "untrusted_key"),
        (7, "unsigned_tail"),
    }


def test_an_unsealed_old_spool_under_a_configured_key_is_quarantined_then_replayed(
    db_url: str, tmp_path: Path
) -> None:
    """With the writers' key configured, a spool without seals (an older kvgov, or a forgery
    by someone who can write the spool directory) is not replayed unauthenticated: it is
    quarantined and an audit_gap says so. After review, ``quarantine replay`` stores the old
    events in format 1, and verify shows the interruption exactly where the gap event is."""
    spool = tmp_path / "old.spool.jsonl"
    spool.write_text("\n".join(TRAIL["spool_lines"]) + "\n", encoding="utf-8")
    with AuditLog(db_url, "old-spool", signing_key=KEY, spool_path=spool) as log:
        assert log.record(sample_event(1)) == "old-spool:8"
    assert list(_formats(db_url, "old-spool")) == [7, 8]
    with AuditQueries(db_url) as q:
        (gap,) = q.events(type="audit_gap")
    assert gap.event_id == "old-spool:7"
    result = CliRunner().invoke(
        audit_group, ["quarantine", "replay", "--url", db_url, "--spool", str(spool)]
    )
    assert result.exit_code == 0, result.output
    assert list(_formats(db_url, "old-spool").values()) == [1] * 6 + [2, 2]
    report = verify(db_url, [PUB], require_checkpoints=True, max_unsigned_events=0)
    assert [(p.seq, p.kind) for p in report.problems] == [(7, "broken_link")]


def _spooled_formats_or_none(path: Path) -> list[int | None]:
    lines = [json.loads(x) for x in path.read_text("utf-8").splitlines()]
    return [d.get("chain_format") for d in lines if d["kind"] == "event"]


@pytest.mark.parametrize(
    ("old", "new"),
    [
        ('"big": 100000000000000000000', '"big": 100000000000000000001'),  # no double is it
        ('"chain_format": 2', '"chain_format": 3'),
    ],
)
def test_a_spool_line_no_writer_wrote_is_damaged_not_read(
    tmp_path: Path, old: str, new: str
) -> None:
    """A format-2 line whose number is no double, or of an unknown format, is set apart."""
    from kvgov.audit.chain import GENESIS_HASH
    from kvgov.audit.sealer import Sealer

    sealer = Sealer("w1", KEY, lambda: 1.0, 0, GENESIS_HASH, -1, 100, 60.0)
    rows: list[Any] = []
    sealer.seal([(1, 1, AuditEvent(EventType.ADMISSION, details={"big": 1e20}))], rows, [])
    spool = Spool(tmp_path / "s.jsonl")
    spool.append(rows)
    line = spool.path.read_text("utf-8")
    assert old in line
    spool.path.write_text(line.replace(old, new), encoding="utf-8")
    contents = spool.read()
    assert contents.events == () and len(contents.damaged) == 1
    spool.path.write_text(line, encoding="utf-8")  # untouched, it reads back as sealed
    (event,) = spool.read().events
    assert event == tuple(bytes(v) if isinstance(v, bytearray) else v for v in rows[0])
    assert event[-4] == '{"big":100000000000000000000}'


# --------------------------------------------------------------------------- the migration


def _columns(url: str) -> set[str]:
    engine = create_engine(normalize_url(url))
    with engine.connect() as conn:
        cols = {c["name"] for c in inspect(conn).get_columns("audit_events")}
    engine.dispose()
    return cols


def test_0004_upgrades_and_downgrades(any_db_url: str, tmp_path: Path) -> None:
    """Format-1 rows survive a downgrade and upgrade; format-2 rows refuse the downgrade
    (nothing changed) except to base, which drops the trail."""
    load_format1_trail(any_db_url)
    assert "chain_format" in _columns(any_db_url)
    downgrade(any_db_url, TRAIL["revision"])
    assert current_revision(any_db_url) == TRAIL["revision"]
    assert "chain_format" not in _columns(any_db_url)
    upgrade(any_db_url)
    assert verify(any_db_url, [PUB]).ok
    with AuditLog(any_db_url, "new", signing_key=KEY, spool_path=tmp_path / "s.jsonl") as log:
        log.record(sample_event(0))
    with pytest.raises(AuditDowngradeRefused, match="1 audit event"):
        downgrade(any_db_url, "0003_offload_keys")
    assert current_revision(any_db_url) == head_revision()  # nothing changed
    assert "chain_format" in _columns(any_db_url)
    assert verify(any_db_url, [PUB]).ok
    downgrade(any_db_url, "base")
    assert current_revision(any_db_url) is None


def test_0004_offline_sql(sqlite_url: str) -> None:
    """``--sql`` renders the column's DDL; the downgrade script states what it cannot check."""
    up = upgrade(sqlite_url, "0003_offload_keys:0004_chain_format", sql=True)
    assert "ADD COLUMN chain_format SMALLINT DEFAULT 1 NOT NULL" in up
    down = downgrade(sqlite_url, "0004_chain_format:0003_offload_keys", sql=True)
    assert "chain_format <> 1" in down and "DROP COLUMN chain_format" in down
