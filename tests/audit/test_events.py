"""AuditEvent validation: typed, JSON-only, never tokens or text."""

from __future__ import annotations

import pytest

from kvgov.audit import CRITICAL_EVENT_TYPES, AuditEvent, EventType
from kvgov.exceptions import InvalidAuditEvent


@pytest.mark.parametrize("key", ["tokens", "token_ids", "text", "prompt", "Prompt", "input_ids"])
def test_forbidden_detail_keys_are_refused(key: str) -> None:
    """A details key that would hold tokens or text raises InvalidAuditEvent."""
    with pytest.raises(InvalidAuditEvent, match="never audited"):
        AuditEvent(EventType.ADMISSION, details={key: [1, 2, 3]})


def test_forbidden_keys_are_refused_when_nested() -> None:
    """Forbidden keys are found at any depth, inside lists too."""
    with pytest.raises(InvalidAuditEvent):
        AuditEvent(EventType.ADMISSION, details={"a": [{"b": {"text": "hi"}}]})


def test_unknown_type_is_refused() -> None:
    """An event type outside EventType is a typed error."""
    with pytest.raises(InvalidAuditEvent, match="unknown event type"):
        AuditEvent("made_up")


@pytest.mark.parametrize("value", [float("nan"), float("inf"), object(), b"bytes", {1: "x"}])
def test_non_json_details_are_refused(value: object) -> None:
    """Details must be finite JSON with string keys."""
    with pytest.raises(InvalidAuditEvent):
        AuditEvent(EventType.ADMISSION, details={"v": value})


def test_integral_floats_become_ints_and_details_are_copied() -> None:
    """Integral floats within +-(2**53 - 1) become ints; larger ones stay floats (RFC 8785
    has no form for such an int); later caller edits do not leak in."""
    src = {"big": 1e20, "edge": 9007199254740991.0, "half": 0.5, "inner": {"n": 2.0}}
    ev = AuditEvent(EventType.ADMISSION, details=src)
    src["inner"]["n"] = 99  # type: ignore[index]
    assert ev.details == {"big": 1e20, "edge": 2**53 - 1, "half": 0.5, "inner": {"n": 2}}
    assert type(ev.details["big"]) is float and type(ev.details["edge"]) is int


def test_block_ids_and_counts_are_checked() -> None:
    """Block ids are coerced to a tuple of non-negative ints; counts must be non-negative."""
    assert AuditEvent(EventType.RELEASE, block_ids=[3, 4]).block_ids == (3, 4)  # type: ignore[arg-type]
    with pytest.raises(InvalidAuditEvent):
        AuditEvent(EventType.RELEASE, block_ids=(-1,))
    with pytest.raises(InvalidAuditEvent):
        AuditEvent(EventType.RELEASE, token_count=-5)
    with pytest.raises(InvalidAuditEvent):
        AuditEvent(EventType.RELEASE, tenant=5)  # type: ignore[arg-type]


def test_critical_types_are_the_security_events() -> None:
    """The synchronous set is exactly the contract's seven security-critical types."""
    assert {
        "policy_denied",
        "policy_error",
        "cross_tenant_reuse",
        "share_denied",
        "erasure",
        "zeroization_failure",
        "offload_refused",
    } == set(CRITICAL_EVENT_TYPES)


@pytest.mark.parametrize("ids", [(1.5,), ("3",), (2, -1), (2**64,), (None,)])
def test_bad_block_ids_are_refused(ids: tuple[object, ...]) -> None:
    """A block id that is not a non-negative integer is a typed error naming it."""
    with pytest.raises(InvalidAuditEvent, match="block_ids"):
        AuditEvent(EventType.RELEASE, block_ids=ids)  # type: ignore[arg-type]


def test_block_ids_tuple_is_kept_and_iterables_are_copied() -> None:
    """A tuple of ids is stored as given (no copy); a generator becomes a tuple."""
    ids = tuple(range(1000))
    assert AuditEvent(EventType.RELEASE, block_ids=ids).block_ids is ids
    gen = AuditEvent(EventType.RELEASE, block_ids=(i for i in range(3)))  # type: ignore[arg-type]
    assert gen.block_ids == (0, 1, 2)


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("sequence_id", "req\x00-1"),
        ("tenant", "t" * 257),
        ("requester_tenant", "r" * 300),
        ("model_revision", "m" * 257),
        ("policy_revision", "p" * 129),
        ("decision_id", "d" * 65),
        ("tokenizer", "tok\ud800"),
    ],
)
def test_text_the_store_would_refuse_is_refused_naming_the_field(field: str, value: str) -> None:
    """NUL, a lone surrogate or text longer than its column is refused when the event is made."""
    with pytest.raises(InvalidAuditEvent, match=field) as info:
        AuditEvent(EventType.ADMISSION, **{field: value})  # type: ignore[arg-type]
    assert info.value.field == field


def test_text_at_the_column_limit_is_accepted() -> None:
    """The longest storable values (and any printable Unicode) are accepted."""
    ev = AuditEvent(
        EventType.ADMISSION,
        tenant="t" * 256,
        policy_revision="p" * 128,
        decision_id="d" * 64,
        model="caf\u00e9 \U0001f600",
    )
    assert len(ev.tenant or "") == 256


@pytest.mark.parametrize(
    "details",
    [
        {"k\x00": 1},
        {"k": "v\ud800"},
        {"k\udfff": 1},
        {"n": 2**1100},
        {"n": [-(2**1100)]},
        {"n": 2**53},
        {"n": {"m": -(2**53)}},
    ],
)
def test_details_the_store_would_refuse_are_refused(details: dict[str, object]) -> None:
    """NUL or surrogates in details keys and strings, and integers beyond 2**53 - 1, are refused."""
    with pytest.raises(InvalidAuditEvent, match="details"):
        AuditEvent(EventType.ADMISSION, details=details)


def test_counts_and_block_ids_beyond_2_53_are_refused() -> None:
    """Counts and block ids must be at most 2**53 - 1, the largest integer RFC 8785 writes."""
    AuditEvent(EventType.ADMISSION, token_count=2**53 - 1, block_ids=(0, 2**53 - 1))
    with pytest.raises(InvalidAuditEvent, match="token_count"):
        AuditEvent(EventType.ADMISSION, token_count=2**53)
    with pytest.raises(InvalidAuditEvent, match="reused_tokens"):
        AuditEvent(EventType.ADMISSION, reused_tokens=2**64)
    for bad in (2**53, 2**56, 2**63, 2**64 - 1):  # bits 53, 56, 63 and all: each byte checked
        with pytest.raises(InvalidAuditEvent, match="block_ids") as info:
            AuditEvent(EventType.RELEASE, block_ids=(1, bad, 2))
        assert str(bad) in str(info.value)


def test_details_depth_limit_counts_scalars_and_errors_name_the_path() -> None:
    """A scalar one level below the deepest allowed mapping is refused, as any deeper value;
    an error in a flat value names its path."""
    deepest: dict[str, object] = {}
    inner = deepest
    for _ in range(15):  # details itself is depth 0: this mapping sits at depth 15
        inner["d"] = inner = {}
    inner["ok"] = 1  # depth 16: allowed
    AuditEvent(EventType.ADMISSION, details=deepest)
    inner["ok"] = {"n": 1}  # a scalar at depth 17
    with pytest.raises(InvalidAuditEvent, match="nested deeper"):
        AuditEvent(EventType.ADMISSION, details=deepest)
    with pytest.raises(InvalidAuditEvent, match=r"details\.state"):
        AuditEvent(EventType.ZEROIZATION, details={"bytes": 1, "state": "a\x00b"})


_TEMPLATE_FIELDS: dict[str, object] = {
    "tenant": "acme",
    "requester_tenant": "acme",
    "classification": "internal",
    "model": "m",
    "model_revision": "r1",
    "tokenizer": "m",
    "tokenizer_revision": "r1",
    "template_version": "v1",
    "token_count": 1024,
    "reused_tokens": 0,
    "decision_id": "d-1",
    "policy_revision": "rev",
    "details": {"cache": True, "ttl_seconds": 3600},
}


def test_a_derived_event_equals_the_event_built_whole() -> None:
    """derive() replaces the request, blocks and counts; every other field is the source's."""
    source = AuditEvent(EventType.REUSE, **_TEMPLATE_FIELDS)  # type: ignore[arg-type]
    got = source.derive(sequence_id="req-7", block_ids=[3, 4, 5], reused_tokens=48)
    given = {"sequence_id": "req-7", "block_ids": (3, 4, 5), "reused_tokens": 48}
    whole = AuditEvent(EventType.REUSE, **{**_TEMPLATE_FIELDS, **given})  # type: ignore[arg-type]
    assert got == whole and type(got) is AuditEvent
    assert got.block_ids == (3, 4, 5) and type(got.block_ids) is tuple
    assert source.sequence_id is None and source.block_ids == ()  # the source is unchanged
    assert source.derive(token_count=None).token_count is None  # None is a value, not "keep"
    assert source.derive(sequence_id="x").reused_tokens == 0  # not given: kept
    with pytest.raises(AttributeError):  # as frozen as any event
        got.tenant = "other"  # type: ignore[misc]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"sequence_id": "req\x00-1"}, "sequence_id"),
        ({"sequence_id": "s" * 257}, "sequence_id"),
        ({"sequence_id": "s\ud800"}, "sequence_id"),
        ({"sequence_id": 7}, "sequence_id"),
        ({"block_ids": (1, -1)}, "block_ids"),
        ({"block_ids": (1.5,)}, "block_ids"),
        ({"block_ids": (2**53,)}, "block_ids"),
        ({"token_count": -1}, "token_count"),
        ({"token_count": True}, "token_count"),
        ({"reused_tokens": 2**53}, "reused_tokens"),
        ({"reused_tokens": "12"}, "reused_tokens"),
    ],
)
def test_a_derived_field_is_checked_as_at_construction(
    change: dict[str, object], field: str
) -> None:
    """What derive() is given is refused by the rules of construction, naming the field."""
    source = AuditEvent(EventType.ADMISSION, **_TEMPLATE_FIELDS)  # type: ignore[arg-type]
    with pytest.raises(InvalidAuditEvent, match=field) as info:
        source.derive(**change)  # type: ignore[arg-type]
    assert info.value.field == field
    with pytest.raises(InvalidAuditEvent, match=field):  # the same rule as a whole event
        AuditEvent(EventType.ADMISSION, **{**_TEMPLATE_FIELDS, **change})  # type: ignore[arg-type]


def test_a_derived_event_at_the_column_limit_is_accepted() -> None:
    """The longest storable request id and Unicode ids pass derive() as they pass construction."""
    source = AuditEvent(EventType.ADMISSION, tenant="acme")
    assert source.derive(sequence_id="s" * 256).sequence_id == "s" * 256
    assert source.derive(sequence_id="caf\u00e9").sequence_id == "caf\u00e9"


def test_derived_events_seal_to_the_bytes_of_events_built_whole() -> None:
    """The sealer reuses the details JSON of derived events (they share their source's);
    the rows, hashes included, are those of the same events built whole, in any order
    with events of other details or none."""
    from kvgov.audit.chain import GENESIS_HASH
    from kvgov.audit.sealer import Sealer
    from kvgov.audit.signing import SigningKey

    key = SigningKey.ephemeral()
    source = AuditEvent(EventType.ADMISSION, **_TEMPLATE_FIELDS)  # type: ignore[arg-type]
    other = AuditEvent(EventType.ADMISSION, tenant="acme", details={"cache": False})
    plain = AuditEvent(EventType.REUSE, tenant="acme", block_ids=(1, 2))
    derived = [source.derive(sequence_id="r1"), other, plain, source.derive(sequence_id="r2")]
    derived.append(source.derive(sequence_id="r3"))
    whole = [
        AuditEvent(EventType.ADMISSION, **{**_TEMPLATE_FIELDS, "sequence_id": s})  # type: ignore[arg-type]
        for s in ("r1", "r2", "r3")
    ]
    whole = [whole[0], other, plain, whole[1], whole[2]]
    rows = []
    for events in (derived, whole):
        sealer = Sealer("w1", key, lambda: 1_700_000_000.0, 0, GENESIS_HASH, -1, 100, 60.0)
        out: list[object] = []
        sealer.seal([(1 + i, 7, e) for i, e in enumerate(events[:2])], out, [])  # type: ignore[arg-type]
        sealer.seal([(3 + i, 7, e) for i, e in enumerate(events[2:])], out, [])  # type: ignore[arg-type]
        rows.append(out)
    assert rows[0] == rows[1]
