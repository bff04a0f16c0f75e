"""Issue 25, defect 3: a spool-directory writer cannot forge what the writer replays and signs.

Each spooled batch is sealed with the writer's Ed25519 key; on replay a batch whose
seal fails is quarantined (not stored, not signed over) and named by an ``audit_gap``
event, and sealed batches missing before an authentic one are reported.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import create_engine, text

from kvgov.audit import AuditEvent, AuditLog, EventType, upgrade
from kvgov.audit import store as store_mod
from kvgov.audit.chain import GENESIS_HASH, ChainHash, canonical_event_bytes, chain_hash
from kvgov.audit.models import EVENT_INSERT_COLUMNS
from kvgov.audit.signing import SigningKey, generate_key_files
from kvgov.audit.spool import Quarantine, Spool, _event_from, quarantine_path
from kvgov.audit.store import normalize_url
from kvgov.cli.audit import audit_group

from .conftest import sample_event

_BIDS = EVENT_INSERT_COLUMNS.index("block_ids")
_DET = EVENT_INSERT_COLUMNS.index("details")
_FMT = EVENT_INSERT_COLUMNS.index("chain_format")


def _lock_sqlite(url: str) -> tuple[Any, Any]:
    """Hold an exclusive lock so that every other writer fails: the database is 'down'."""
    engine = create_engine(normalize_url(url))
    conn = engine.raw_connection()
    conn.driver_connection.isolation_level = None  # type: ignore[union-attr]
    conn.cursor().execute("BEGIN EXCLUSIVE")
    return engine, conn


def _rows(url: str, sql: str) -> list[Any]:
    engine = create_engine(normalize_url(url))
    try:
        with engine.connect() as conn:
            return list(conn.execute(text(sql)).all())
    finally:
        engine.dispose()


def _forge(spool: Path, *, keep_seals: bool) -> None:
    """What the issue's attacker does: drop the cross_tenant_reuse, flip the erasure to
    verified, renumber, recompute the SHA-256 chain, drop the checkpoints it breaks."""
    out: list[str] = []
    prev: ChainHash | None = None
    shift = 0
    for line in spool.read_text().splitlines():
        d = json.loads(line)
        if d["kind"] == "checkpoint":
            continue  # its signature no longer matches: drop it
        if d["kind"] == "seal" and not keep_seals:
            continue
        if d["kind"] == "event":
            if d["type"] == "cross_tenant_reuse":
                shift += 1
                continue
            if d["type"] == "erasure":
                d["details"]["verified"] = True
            d["seq"] -= shift
            if prev is None:
                prev = ChainHash(bytes.fromhex(d["prev_hash"]))
            rec = _event_from({k: v for k, v in d.items() if k != "kind"})
            canonical = canonical_event_bytes(
                rec[:_BIDS], rec[_BIDS], rec[_DET], chain_format=rec[_FMT]
            )
            h = chain_hash(prev, canonical)
            d["prev_hash"], d["hash"] = prev.hex(), h.hex()
            prev = h
        out.append(json.dumps(d, sort_keys=True))
    assert shift == 1 and prev is not None
    spool.write_text("\n".join(out) + "\n")


@pytest.mark.parametrize("attack", ["none", "edit", "edit_and_strip_seals"])
def test_an_edited_spool_is_quarantined_not_signed(
    sqlite_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, attack: str
) -> None:
    """The issue's scenario end to end: edit the spool, recompute the chain, restart the
    worker; ``verify --public-key --require-checkpoints --max-unsigned-events 0`` fails,
    the edited records are in the quarantine and an ``audit_gap`` names them. Untouched,
    the same spool replays and verifies."""
    monkeypatch.setattr(store_mod, "SQLITE_BUSY_TIMEOUT_MS", 50)
    upgrade(sqlite_url)
    keys = generate_key_files(tmp_path / "keys" / "writer.pem")
    spool = tmp_path / "w1.spool.jsonl"
    log = AuditLog(sqlite_url, "w1", str(keys.private), spool_path=spool, retry_seconds=3600)
    for i in range(3):
        log.record(sample_event(i))
    log.flush()
    engine, conn = _lock_sqlite(sqlite_url)
    try:
        log.record(sample_event(3))
        log.record(AuditEvent(EventType.CROSS_TENANT_REUSE, tenant="acme", requester_tenant="beta"))
        log.record(AuditEvent(EventType.ERASURE, tenant="acme", details={"verified": False}))
        log.record(sample_event(4))
        log.close()  # the database is still down: all this stays in the spool
    finally:
        conn.rollback()
        conn.close()
        engine.dispose()
    assert spool.exists()
    if attack != "none":
        _forge(spool, keep_seals=attack == "edit")

    with AuditLog(sqlite_url, "w1", str(keys.private), spool_path=spool) as log2:
        log2.record(sample_event(9))
    args = ["verify", "--url", sqlite_url, "--public-key", str(keys.public),
            "--require-checkpoints", "--max-unsigned-events", "0"]  # fmt: skip
    result = CliRunner().invoke(audit_group, args)
    verified = _rows(sqlite_url, "SELECT details FROM audit_events WHERE type = 'erasure'")
    if attack == "none":
        assert result.exit_code == 0, result.output
        assert len(verified) == 1 and json.loads(verified[0][0])["verified"] is False
        assert not Quarantine(quarantine_path(spool)).outstanding()
        return
    assert result.exit_code == 1, result.output  # the hole left by the edit is evidence
    assert all(json.loads(d)["verified"] is False for (d,) in verified)  # no forgery stored
    quarantined = Quarantine(quarantine_path(spool)).outstanding()
    assert {q.event_type for q in quarantined if q.kind == "event"} >= {"erasure"}
    assert all("seal" in q.refused for q in quarantined)
    [(gap,)] = _rows(sqlite_url, "SELECT details FROM audit_events WHERE type = 'audit_gap'")
    gap = json.loads(gap)
    assert gap["cause"] == "quarantined" and "seal" in gap["reason"]
    assert gap["records"] == len(quarantined)


def _spooled_batches(tmp_path: Path, key: SigningKey) -> tuple[Path, list[list[str]]]:
    """Three batches spooled by a writer with ``key``, and each batch's lines."""
    spool = tmp_path / "s.spool.jsonl"
    from kvgov.audit.sealer import Sealer

    sealer = Sealer("w1", key, lambda: 1_700_000_000.0, 0, GENESIS_HASH, -1, 100, 60.0)
    writer = Spool(spool, key, "w1")
    for b in range(3):
        rows: list[Any] = []
        sealer.seal([(b * 2 + i + 1, 1, sample_event(b * 2 + i)) for i in range(2)], rows, [])
        writer.append(rows)
    lines = spool.read_text().splitlines()
    batches: list[list[str]] = [[]]
    for line in lines:
        batches[-1].append(line)
        if json.loads(line)["kind"] == "seal":
            batches.append([])
    return spool, batches[:-1]


def _write(spool: Path, batches: list[list[str]]) -> None:
    spool.write_text("".join(line + "\n" for batch in batches for line in batch))


def test_spool_seals_detect_removed_reordered_and_unsealed_batches(tmp_path: Path) -> None:
    """A batch removed from the middle or moved is a break; lines without a seal, or
    sealed by another key, are rejected by a writer whose key is configured."""
    key = SigningKey.from_private_key(SigningKey.ephemeral().private_key, "configured")
    spool, batches = _spooled_batches(tmp_path, key)
    reader = Spool(spool, key, "w1")
    whole = reader.read()
    assert [int(r[1]) for r in whole.events] == [1, 2, 3, 4, 5, 6]
    assert not whole.rejected and not whole.breaks

    _write(spool, [batches[0], batches[2]])  # the middle batch deleted
    cut = reader.read()
    assert [int(r[1]) for r in cut.events] == [1, 2, 5, 6] and not cut.rejected
    assert cut.breaks == ("sealed spool batches are missing or reordered before seq 5",)

    _write(spool, [batches[1], batches[0], batches[2]])  # reordered
    assert reader.read().breaks

    _write(spool, [batches[0], batches[1][:-1], batches[2]])  # a seal removed
    unsealed = reader.read()
    assert [int(r[1]) for r, _ in unsealed.rejected] == [3, 4]
    assert {why for _, why in unsealed.rejected} == {"spool lines not covered by a seal"}

    other = SigningKey.from_private_key(SigningKey.ephemeral().private_key, "configured")
    _write(spool, batches)
    foreign = Spool(spool, other, "w1").read()
    assert not foreign.events and len(foreign.rejected) == 6
    assert "not by this writer's key" in foreign.rejected[0][1]
    # an ephemeral (unsigned-trail) writer cannot authenticate another process's key
    unsigned = Spool(spool, SigningKey.ephemeral(), "w1").read()
    assert len(unsigned.events) == 6 and not unsigned.rejected
    # a reader without a key (``kvgov audit status``) sees every record, seals skipped
    plain = Spool(spool).read()
    assert len(plain.events) == 6 and not plain.damaged
