"""Known-answer vectors pin the canonical bytes and the hash chain of both chain formats."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvgov.audit import GENESIS_HASH, AuditEvent, AuditLog, ChainHash, verify
from kvgov.audit.chain import CHAIN_FORMAT, FORMATS, canonical_event_bytes, chain_hash
from kvgov.canonical import reference_json

VECTORS = sorted((Path(__file__).parent.parent / "vectors").glob("chain_*.json"))
#: The vectors of the format writers write now (the others only verify stored rows).
CURRENT = [p for p in VECTORS if json.loads(p.read_text("utf-8"))["chain_format"] == CHAIN_FORMAT]
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
    fmt = FORMATS[doc["chain_format"]]
    prev = GENESIS_HASH
    for v in doc["events"]:
        ev = v["event"]
        head = (doc["stream"], v["seq"], ev["time_us"], ev["type"], *(ev.get(f) for f in SCALARS))
        canon = canonical_event_bytes(
            head,
            fmt.json(ev.get("block_ids", [])),
            fmt.json(AuditEvent(ev["type"], details=ev.get("details", {})).details),
            fmt.number,
        )
        assert canon.decode(fmt.charset) == v["canonical"]
        assert prev.hex() == v["prev_hash"]
        prev = chain_hash(prev, canon)
        assert prev.hex() == v["hash"]
        assert prev == hashlib.sha256(bytes.fromhex(v["prev_hash"]) + canon).digest()


def test_there_are_vectors_of_both_formats() -> None:
    """Format 1 (stored rows) and the current format each have known-answer vectors."""
    assert {_load(p)["chain_format"] for p in VECTORS} == set(FORMATS)
    assert CURRENT


@pytest.mark.parametrize("path", CURRENT, ids=[p.name for p in CURRENT])
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
        rows = conn.execute(
            text("SELECT seq, hash, chain_format FROM audit_events ORDER BY seq")
        ).all()
    engine.dispose()
    log.close()
    assert [bytes(h).hex() for _s, h, _f in rows] == [v["hash"] for v in doc["events"]]
    assert {f for _s, _h, f in rows} == {doc["chain_format"]}
    assert verify(db_url).ok


def test_chain_hash_is_typed_bytes() -> None:
    """ChainHash values are plain 32-byte strings at run time."""
    h = chain_hash(ChainHash(bytes(32)), b"x")
    assert isinstance(h, bytes) and len(h) == 32


def test_block_ids_json_equals_canonical_json() -> None:
    """The writer's block-id encoder gives exactly each format's JSON, below and above its limit."""
    import random

    from kvgov.audit.chain import BlockIdsJson

    encode = BlockIdsJson(limit=1000)
    rng = random.Random(5)
    cases = [(), (0,), (999,), (1000,), (5, 3, 5), tuple(rng.randrange(2000) for _ in range(300))]
    cases += [tuple(rng.randrange(900) for _ in range(50)) for _ in range(20)]
    cases.append((3, 2**53 - 1, 7))
    for ids in cases:
        for fmt in FORMATS.values():
            assert encode(ids) == fmt.json(list(ids))


_detail_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**53) + 1, 2**53 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text().filter(lambda t: "\x00" not in t and not _has_surrogate(t))
    | st.sampled_from(["v1.0", "e-1", "2e+3", "\U0001f600", "\ufb33", "\x7f"]),
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(
            st.sampled_from(["a", "é", "\U0001f600", "\ufb33", "x.0"]), inner, max_size=4
        )
    ),
    max_leaves=12,
)


def _has_surrogate(t: str) -> bool:
    return any(0xD800 <= ord(c) <= 0xDFFF for c in t)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(st.sampled_from(["n", "é", "\U0001f600", "1.0"]), _detail_values, max_size=5)
)
def test_the_sealers_details_encoder_is_each_formats_json(details: dict[str, Any]) -> None:
    """What the sealer hashes for cleaned details is each format's JSON (RFC 8785 for 2)."""
    cleaned = AuditEvent("admission", details=details).details
    assert FORMATS[2].details_json(cleaned) == reference_json(cleaned)
    assert FORMATS[1].details_json(cleaned) == FORMATS[1].json(cleaned)
