"""The compiled audit chain link (audit/_seal.c) against its specification, the pure sealer.

``Sealer`` hashes each event with ``kvgov.audit._seal.link`` where it is installed; every
row it seals must be the pure path's, byte for byte: the known-answer vectors, random
events (text with quotes, backslashes, controls, non-ASCII and astral characters; None;
integers; block ids; details), and events holding values only the pure path writes
(it falls back to it for those). Skips only where this machine could not have built the
extension; where it could and the install did not, the tests fail.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvgov.audit import AuditEvent, EventType
from kvgov.audit.chain import GENESIS_HASH, canonical_prefix
from kvgov.audit.events import RECORD_FIELDS, CompactEvent, event_record
from kvgov.audit.sealer import NATIVE_LINK, Sealer
from kvgov.audit.signing import SigningKey
from tests.support.native import native_link_skip, native_link_unbuildable

_WHY = native_link_skip()
pytestmark = pytest.mark.skipif(_WHY is not None, reason=_WHY or "")
KEY = SigningKey.ephemeral()
VECTORS = Path(__file__).parents[1] / "vectors" / "chain_format2.json"
TYPES = [t.value for t in EventType]


def test_the_install_built_it_where_it_could() -> None:
    """A machine that can build the extension has it installed (else the install is broken)."""
    if not NATIVE_LINK:
        assert native_link_unbuildable() is not None, (
            "this machine can build kvgov.audit._seal but the install did not: "
            "reinstall kvgov (pip install -e .) and read the build's warnings"
        )


def _seal(items: list[tuple[int, int, Any]], native: bool, every: int = 10**6) -> list[Any]:
    sealer = Sealer("stream-é", KEY, lambda: 1.0, 0, GENESIS_HASH, -1, every, 3600.0, native=native)
    assert sealer.native is native
    rows: list[Any] = []
    sealer.seal(items, rows, [])
    return rows


def _both(items: list[tuple[int, int, Any]]) -> list[Any]:
    pure, native = _seal(items, False), _seal(items, True)
    assert native == pure
    return native


def test_the_vectors_seal_to_their_hashes() -> None:
    """Every format-2 known-answer vector, sealed by the compiled link (and the pure path)."""
    doc = json.loads(VECTORS.read_text("utf-8"))
    items = []
    for v in doc["events"]:
        ev = dict(v["event"])
        time_us = ev.pop("time_us")
        ev["block_ids"] = tuple(ev.get("block_ids", ()))
        items.append((v["seq"], time_us, AuditEvent(**ev)))
    sealer = Sealer(
        doc["stream"], KEY, lambda: 1.0, 0, GENESIS_HASH, -1, 10**6, 3600.0, native=True
    )
    rows: list[Any] = []
    sealer.seal(items, rows, [])
    assert [bytes(r[-1]).hex() for r in rows] == [v["hash"] for v in doc["events"]]
    assert [bytes(r[-2]).hex() for r in rows] == [v["prev_hash"] for v in doc["events"]]


_TEXT = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
    max_size=24,
)
_OPT_TEXT = st.none() | _TEXT
_COUNT = st.none() | st.integers(0, 2**53 - 1)
_DETAILS = st.dictionaries(
    st.sampled_from(["priority", "reason", "state", "bytes", "cache", "b", "zé", "A"]),
    st.none() | st.booleans() | st.integers(-(2**53) + 1, 2**53 - 1) | _TEXT,
    max_size=4,
)


@st.composite
def _events(draw: st.DrawFn) -> AuditEvent:
    return AuditEvent(
        type=draw(st.sampled_from(TYPES)),
        tenant=draw(_OPT_TEXT),
        requester_tenant=draw(_OPT_TEXT),
        classification=draw(_OPT_TEXT),
        model=draw(_OPT_TEXT),
        sequence_id=draw(_OPT_TEXT),
        block_ids=tuple(draw(st.lists(st.integers(0, 2**53 - 1), max_size=40))),
        token_count=draw(_COUNT),
        reused_tokens=draw(_COUNT),
        decision_id=draw(_OPT_TEXT),
        policy_revision=draw(_OPT_TEXT),
        details=draw(_DETAILS),
    )


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_events(), min_size=1, max_size=6), st.integers(0, 2**40))
def test_random_events_seal_the_same_in_both(events: list[AuditEvent], time_us: int) -> None:
    """Any events AuditEvent accepts seal to the same rows in both implementations."""
    _both([(i + 1, time_us + i, e) for i, e in enumerate(events)])


def test_escapes_and_astral_characters() -> None:
    """Every control below U+0020, quotes, backslashes, DEL, U+2028 and U+1F600."""
    text = "".join(chr(i) for i in range(1, 0x20)) + '"\\\x7f\u2028\U0001f600é'
    rows = _both([(1, 5, AuditEvent(EventType.ADMISSION, tenant="t", sequence_id=text))])
    assert len(rows) == 1


def _compact(**fields: Any) -> CompactEvent:
    record = list(event_record(AuditEvent(EventType.ADMISSION, tenant="t")))
    for name, value in fields.items():
        record[RECORD_FIELDS.index(name)] = value
    return CompactEvent(*record)


class _Index:
    """An integer-like block id (``operator.index``), as numpy's integers are."""

    def __init__(self, value: int) -> None:
        self.value = value

    def __index__(self) -> int:
        return self.value


@pytest.mark.parametrize(
    "fields",
    [
        {"token_count": 1.5},
        {"token_count": 2**70},
        {"reused_tokens": True},
        {"token_count": -3},
        {"block_ids": [3, 1, 2]},
        {"block_ids": (4, _Index(9))},
        {"block_ids": tuple(range(2**18 - 2, 2**18 + 2))},
    ],
    ids=["float", "beyond-64-bits", "bool", "negative", "id-list", "id-index", "ids-past-cache"],
)
def test_values_it_does_not_write_fall_back_to_the_pure_path(fields: dict[str, Any]) -> None:
    """A value outside what AuditEvent lets through (a float, an integer past 64 bits, ids
    in a list or integer-like) is done the pure way; a bool, a negative integer and ids
    past the pure path's text cache it writes as json does."""
    _both([(1, 5, _compact(**fields)), (2, 6, AuditEvent(EventType.EVICTION, tenant="t"))])


def test_a_lone_surrogate_is_refused_by_both() -> None:
    """Text that is not valid Unicode cannot be hashed by either (UTF-8 refuses it)."""
    for native in (False, True):
        with pytest.raises(UnicodeEncodeError):
            _seal([(1, 5, _compact(sequence_id="a\ud800b"))], native)


def test_link_refuses_bad_arguments() -> None:
    """The C functions check what they are given rather than reading past it."""
    from kvgov.audit._seal import ids_json, link  # type: ignore[import-not-found]

    assert ids_json((0, 7, 2**53 - 1)) == "[0,7,9007199254740991]"
    assert ids_json(()) == "[]"
    for bad in ([1], (1.0,), ("1",), (2**64,)):
        with pytest.raises(TypeError):
            ids_json(bad)

    prefix = canonical_prefix("s").encode()
    good = (bytes(32), prefix, 1, 2, "h", ("a", 1, None), "[]", "{}")
    assert len(link(*good)) == 32
    with pytest.raises(ValueError):
        link(bytes(31), *good[1:])
    with pytest.raises(TypeError):
        link(*good[:5], ["a"], *good[6:])
    with pytest.raises(TypeError):
        link(*good[:4], b"h", *good[5:])
    with pytest.raises(TypeError):
        link(*good[:2], "1", *good[3:])
    with pytest.raises(TypeError):
        link(*good[:7])


def test_details_objects_are_told_apart_when_their_ids_are_reused() -> None:
    """The sealer keeps the JSON of details objects by identity: objects created and freed
    one after another (whose ids CPython reuses) each seal to their own JSON."""
    sealer = Sealer("s", KEY, lambda: 1.0, 0, GENESIS_HASH, -1, 10**6, 3600.0)
    rows: list[Any] = []
    for i in range(1, 700):
        sealer.seal(
            [(i, i, AuditEvent(EventType.EVICTION, tenant="t", details={"i": i}))], rows, []
        )
    det = [r[-4] for r in rows]
    assert det == [json.dumps({"i": i}, separators=(",", ":")) for i in range(1, 700)]
