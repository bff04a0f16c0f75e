"""Known-answer vectors pin the canonical bytes and the hash chain (writer and verifier)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from kvgov.audit import GENESIS_HASH, AuditEvent, AuditLog, ChainHash, verify
from kvgov.audit.chain import canonical_event_bytes, canonical_json, chain_hash

VECTORS = sorted((Path(__file__).parent.parent / "vectors").glob("chain_*.json"))
SCALARS = ("tenant", "requester_tenant", "classification", "model", "model_revision",
           "adapter", "adapter_revision", "tokenizer", "tokenizer_revision",
           "template_version", "sequence_id", "token_count", "reused_tokens",
           "decision_id", "policy_revision")  # fmt: skip


def _load(path: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return doc


@pytest.mark.parametrize("path", VECTORS, ids=[p.name for p in VECTORS])
def test_canonical_bytes_and_hashes_match_vectors(path: Path) -> None:
    """canonical_event_bytes and chain_hash reproduce every vector byte for byte."""
    doc = _load(path)
    prev = GENESIS_HASH
    for v in doc["events"]:
        ev = v["event"]
        head = (doc["stream"], v["seq"], ev["time_us"], ev["type"], *(ev.get(f) for f in SCALARS))
        canon = canonical_event_bytes(
            head,
            canonical_json(ev.get("block_ids", [])),
            canonical_json(AuditEvent(ev["type"], details=ev.get("details", {})).details),
        )
        assert canon.decode("ascii") == v["canonical"]
        assert prev.hex() == v["prev_hash"]
        prev = chain_hash(prev, canon)
        assert prev.hex() == v["hash"]
        assert prev == hashlib.sha256(bytes.fromhex(v["prev_hash"]) + canon).digest()


@pytest.mark.parametrize("path", VECTORS, ids=[p.name for p in VECTORS])
def test_writer_stores_vector_hashes_after_db_round_trip(path: Path, db_url: str) -> None:
    """AuditLog seals the vector events to the same hashes on SQLite and PostgreSQL."""
    from sqlalchemy import create_engine, text

    from kvgov.audit.store import normalize_url

    doc = _load(path)
    now = [0.0]
    log = AuditLog(db_url, doc["stream"], clock=lambda: now[0], checkpoint_every=1000)
    for v in doc["events"]:
        ev = dict(v["event"])
        now[0] = ev.pop("time_us") / 1_000_000
        ev["block_ids"] = tuple(ev.get("block_ids", ()))
        log.record(AuditEvent(**ev))
    log.flush()
    engine = create_engine(normalize_url(db_url))
    with engine.connect() as conn:
        rows = conn.execute(text("SELECT seq, hash FROM audit_events ORDER BY seq")).all()
    engine.dispose()
    log.close()
    assert [bytes(h).hex() for _s, h in rows] == [v["hash"] for v in doc["events"]]
    assert verify(db_url).ok


def test_chain_hash_is_typed_bytes() -> None:
    """ChainHash values are plain 32-byte strings at run time."""
    h = chain_hash(ChainHash(bytes(32)), b"x")
    assert isinstance(h, bytes) and len(h) == 32


def test_block_ids_json_equals_canonical_json() -> None:
    """The writer's block-id encoder gives exactly canonical_json, below and above its limit."""
    import random

    from kvgov.audit.chain import BlockIdsJson, canonical_json

    encode = BlockIdsJson(limit=1000)
    rng = random.Random(5)
    cases = [(), (0,), (999,), (1000,), (5, 3, 5), tuple(rng.randrange(2000) for _ in range(300))]
    cases += [tuple(rng.randrange(900) for _ in range(50)) for _ in range(20)]
    for ids in cases:
        assert encode(ids) == canonical_json(list(ids))
