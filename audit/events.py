"""What callers hand to the audit trail: :class:`AuditEvent` and its :class:`EventType`.

An event carries who (tenant, requester tenant), what scope (classification, model,
adapter, tokenizer, template version), which blocks and how many tokens, and under
which policy decision. It never carries token ids or text: there is no field for
them, and ``details`` refuses keys that would hold them (:data:`FORBIDDEN_DETAIL_KEYS`).

The writer (:class:`kvgov.audit.AuditLog`) adds the event id, the time, the stream id and
sequence number, and the hash chain.
"""

from __future__ import annotations

import math
import sys
from array import array
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from enum import StrEnum
from itertools import repeat
from operator import attrgetter, call
from typing import Any, Final, NamedTuple

from kvgov.canonical import JCS_INT_MAX
from kvgov.exceptions import InvalidAuditEvent
from kvgov.schema import SCOPE_FIELDS, TEXT_LIMITS, text_problem

__all__ = [
    "CRITICAL_EVENT_TYPES",
    "FIELDS",
    "FORBIDDEN_DETAIL_KEYS",
    "OWN_REUSE_KEY",
    "RECORD_FIELDS",
    "AuditEvent",
    "CompactEvent",
    "EventType",
    "checked_text",
    "event_from_record",
    "event_record",
    "packed_record",
    "trusted_details",
    "trusted_event",
]

#: The scalar fields a caller gives after ``type``, in the order the chain hashes them
#: (:mod:`kvgov.audit.chain`) and the ``audit_events`` columns hold them; ``block_ids`` and
#: ``details`` follow.
FIELDS: Final = (
    SCOPE_FIELDS[0],  # the tenant who owns the blocks
    "requester_tenant",
    *SCOPE_FIELDS[1:],
    "sequence_id",
    "token_count",
    "reused_tokens",
    "decision_id",
    "policy_revision",
)
_COUNT_FIELDS: Final = ("token_count", "reused_tokens")
_TEXT_FIELDS: Final = tuple(f for f in FIELDS if f not in _COUNT_FIELDS)
_TEXT_GETTER: Final = attrgetter(*_TEXT_FIELDS)
_TEXT_LIMITS: Final = tuple(TEXT_LIMITS[f] for f in _TEXT_FIELDS)
#: Every text value at most this long fits every column (the fast path's test).
_SHORTEST_LIMIT: Final = min(_TEXT_LIMITS)
_STR_OR_NONE: Final = frozenset({str, type(None)})
#: Largest count, block id and ``details`` integer magnitude: 2**53 - 1, the largest
#: integer RFC 8785 writes (chain format 2 hashes RFC 8785 text; a ``bigint`` holds it).
MAX_COUNT: Final = JCS_INT_MAX
#: Bytes 7 and 6 of a little-endian uint64 (0 and 1 big-endian): bits 48..63.
_TOP, _NEXT = (7, 6) if sys.byteorder == "little" else (0, 1)
#: Byte values with no bit of 53..55 set, when the byte holds bits 48..55.
_LOW_BYTES: Final = bytes(range(0x20))


class EventType(StrEnum):
    """The kinds of audit event; the value is what is stored in ``audit_events.type``."""

    ADMISSION = "admission"
    POLICY_DENIED = "policy_denied"
    POLICY_ERROR = "policy_error"
    REUSE = "reuse"
    CROSS_TENANT_REUSE = "cross_tenant_reuse"
    SHARE_DENIED = "share_denied"
    EVICTION = "eviction"
    ZEROIZATION = "zeroization"
    ZEROIZATION_FAILURE = "zeroization_failure"
    RELEASE = "release"
    ERASURE = "erasure"
    INVALIDATION = "invalidation"
    SECRET_ROTATION = "secret_rotation"
    RETENTION_SWEEP = "retention_sweep"
    LIFECYCLE = "lifecycle"
    #: Written by the audit writer itself: events of this stream are missing from the
    #: store (``details.cause``: ``unclean_stop`` after a writer died with events only in
    #: memory, naming ``last_stored_seq``; ``quarantined`` when the database refused
    #: records, naming their ``seqs`` and the quarantine file).
    AUDIT_GAP = "audit_gap"
    #: Evicted blocks sealed under their tenant's data key and stored in an offload tier.
    OFFLOAD = "offload"
    #: Blocks restored from an offload tier into the device cache (owner, requester, tier).
    OFFLOAD_RESTORE = "offload_restore"
    #: An offloaded object refused on restore (tampered, truncated, misbound, replayed,
    #: shredded key); the restore treated it as a miss.
    OFFLOAD_REFUSED = "offload_refused"
    #: A schema migration of the audit database itself (``kvgov db``): a downgrade
    #: that keeps the trail, recorded before it runs (``details``: ``operation``,
    #: ``from``, ``to``, ``dropped`` tables and their rows), or an upgrade of a trail
    #: holding events, recorded once at the head.
    SCHEMA_MIGRATION = "schema_migration"
    #: An engine's handling of a fleet order (``kvgov fleet``, docs/fleet.md) other than
    #: the erasure events that carry the order id themselves: ``details.order_id``,
    #: ``kind``, ``outcome`` (``refused``: not signed by a trusted operator key, with the
    #: ``reason``; ``rolled_out``: the new ``policy_revision``; ``failed``: the ``error``).
    FLEET_ORDER = "fleet_order"


#: Security-critical event types: ``AuditLog.record`` writes them (database or spool)
#: before it returns, after everything queued before them, or raises ``AuditUnavailable``.
CRITICAL_EVENT_TYPES: Final[frozenset[str]] = frozenset(
    {
        EventType.POLICY_DENIED,
        EventType.POLICY_ERROR,
        EventType.CROSS_TENANT_REUSE,
        EventType.SHARE_DENIED,
        EventType.ERASURE,
        EventType.ZEROIZATION_FAILURE,
        EventType.OFFLOAD_REFUSED,
    }
)

#: Keys refused anywhere inside ``details`` (compared case-insensitively): they would
#: hold prompt content, which the audit trail never stores.
FORBIDDEN_DETAIL_KEYS: Final[frozenset[str]] = frozenset(
    {
        "tokens",
        "token_ids",
        "input_ids",
        "output_ids",
        "text",
        "prompt",
        "prompts",
        "completion",
        "messages",
    }
)

#: The ``details`` key of an ``admission`` event that also records the request's reuse of
#: its own scope's cached blocks (``{"blocks": n, "reused_tokens": t}``: the first ``n`` of
#: its ``block_ids``), where a ``reuse`` event would otherwise follow it. The compliance
#: queries (:class:`kvgov.audit.AuditQueries`) list that reuse as its own ``reuse`` record
#: and the admission without the key: the same answers as with two events.
OWN_REUSE_KEY: Final = "own_reuse"

_EVENT_TYPES: Final = frozenset(t.value for t in EventType)
#: ``AuditEvent.derive``'s "not given" (None is a value a field may take).
_KEEP: Final[Any] = object()
_OBJECT_NEW: Final = object.__new__
_MAX_DEPTH: Final = 16


def _clean(value: Any, path: str, depth: int) -> Any:
    """Return a private, JSON-canonical copy of one ``details`` value, or raise.

    Integral floats become ints so that the canonical form survives PostgreSQL's
    JSONB (which prints ``1e20`` back as ``100000000000000000000``).
    """
    if depth > _MAX_DEPTH:
        raise InvalidAuditEvent("details", f"nested deeper than {_MAX_DEPTH} levels at {path}")
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        _check_detail_text(value, path)
        return value
    if isinstance(value, int):
        if not -MAX_COUNT <= value <= MAX_COUNT:
            raise InvalidAuditEvent(
                "details",
                f"integer at {path} is beyond +-(2**53 - 1), which RFC 8785 cannot write "
                "exactly; record it as a string",
            )
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidAuditEvent("details", f"non-finite number {value!r} at {path}")
        # an integral float beyond 2**53 stays a float: an int there has no RFC 8785 form
        return int(value) if value.is_integer() and -MAX_COUNT <= value <= MAX_COUNT else value
    if isinstance(value, Mapping):
        return _clean_mapping(value, path, depth)
    if isinstance(value, (list, tuple)):
        return [_clean(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]
    raise InvalidAuditEvent("details", f"{type(value).__name__} at {path} is not JSON")


def _clean_mapping(value: Mapping[Any, Any], path: str, depth: int) -> dict[str, Any]:
    """:func:`_clean` of a mapping: exact ``str``, ``int``, ``bool`` and None values inline.

    Events on the hot path carry a handful of such values; checking them here
    saves a call and a path string per value (built only for an error).
    """
    out: dict[str, Any] = {}
    inline = depth < _MAX_DEPTH  # a value at depth + 1 is still within the limit
    for k, v in value.items():
        if (
            type(k) is not str
            or not k.isascii()
            or "\x00" in k
            or k.lower() in FORBIDDEN_DETAIL_KEYS
        ):
            _check_key(k, path)
        t = type(v)
        if inline and (
            (t is str and v.isascii() and "\x00" not in v)
            or (t is int and -MAX_COUNT <= v <= MAX_COUNT)
            or t is bool
            or v is None
        ):
            out[k] = v
        elif inline and t is float and math.isfinite(v):
            # as _clean: integral floats within 2**53 become ints
            out[k] = int(v) if v.is_integer() and -MAX_COUNT <= v <= MAX_COUNT else v
        else:
            out[k] = _clean(v, f"{path}.{k}", depth + 1)
    return out


def _check_key(key: object, path: str) -> None:
    """Raise for a ``details`` key that is not a string, holds bad text, or is forbidden."""
    if not isinstance(key, str):
        raise InvalidAuditEvent("details", f"non-string key {key!r} at {path}")
    _check_detail_text(key, f"a key of {path}")
    if key.lower() in FORBIDDEN_DETAIL_KEYS:
        raise InvalidAuditEvent(
            "details",
            f"key {path}.{key} would hold tokens or text, which are never audited; "
            "record counts (token_count, reused_tokens) instead",
        )


def _check_detail_text(text: str, path: str) -> None:
    if "\x00" in text:
        raise InvalidAuditEvent("details", f"NUL character in string at {path}")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidAuditEvent("details", f"lone surrogate in string at {path}") from None


def _check_texts(texts: tuple[str | None, ...]) -> None:
    """Refuse text the store would refuse (:func:`kvgov.schema.text_problem`), naming the field.

    One C-level pass over the joined values for the common case (short ASCII
    identifiers); the loop runs only when that pass finds something to look at.
    """
    present = [t for t in texts if t]
    joined = "".join(present)
    if (
        joined.isascii()
        and "\x00" not in joined
        and (len(joined) <= _SHORTEST_LIMIT or max(map(len, present)) <= _SHORTEST_LIMIT)
    ):
        return
    for name, value, limit in zip(_TEXT_FIELDS, texts, _TEXT_LIMITS, strict=True):
        if value is not None:
            problem = text_problem(value, limit)
            if problem is not None:
                raise InvalidAuditEvent(name, problem)


def _is_block_id(value: Any) -> bool:
    try:
        array("Q", (value,))
    except (TypeError, OverflowError):
        return False
    return True


def _check_str(name: str, value: object) -> None:
    if value is not None and not isinstance(value, str):
        raise InvalidAuditEvent(name, f"must be a str or None, got {type(value).__name__}")


def _check_count(name: str, value: object) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise InvalidAuditEvent(name, f"must be a non-negative int or None, got {value!r}")
    if value is not None and value > MAX_COUNT:
        raise InvalidAuditEvent(
            name,
            f"must be at most {MAX_COUNT} (2**53 - 1, RFC 8785's largest integer), got {value}",
        )


@dataclass(frozen=True, slots=True)
class AuditEvent:
    """One auditable act, as a caller describes it.

    Validated at construction (on the caller's thread), so that ``record`` stays a
    queue append and the store never refuses the event: an unknown ``type``, a
    wrong-typed field, text the store cannot hold (longer than its column in
    :data:`kvgov.schema.TEXT_LIMITS`, a NUL character, a lone surrogate), a count or
    block id beyond 2**53 - 1 (the largest integer RFC 8785, which the chain hashes, writes
    exactly), or ``details`` that are not JSON, hold such text or an integer beyond
    +-(2**53 - 1), or hold a forbidden key raise
    :class:`~kvgov.exceptions.InvalidAuditEvent` naming the field.
    ``details`` is deep-copied, so later changes to the caller's dict do not leak in.

    Args:
        type: an :class:`EventType` value.
        tenant: owner tenant of the blocks or the request.
        requester_tenant: the tenant asking (differs from ``tenant`` on cross-tenant reuse).
        classification: data classification label of the scope.
        model: model name.
        model_revision: model revision.
        adapter: adapter (LoRA) name, if any.
        adapter_revision: adapter revision, if any.
        tokenizer: tokenizer name.
        tokenizer_revision: tokenizer revision.
        template_version: prompt-template version.
        sequence_id: the request / sequence id.
        block_ids: KV block ids involved: integers in 0 .. 2**53 - 1 (a tuple of ints is
            kept as given; any other iterable is copied into a tuple). Checked in
            C-level passes, so integer-like values (``operator.index``) pass and are
            recorded as their integer value.
        token_count: tokens in the request or involved.
        reused_tokens: tokens served from cache.
        decision_id: id of the policy decision that allowed or denied this.
        policy_revision: policy bundle revision of that decision.
        details: JSON-able extra facts (never tokens or text).
    """

    type: str
    tenant: str | None = None
    requester_tenant: str | None = None
    classification: str | None = None
    model: str | None = None
    model_revision: str | None = None
    adapter: str | None = None
    adapter_revision: str | None = None
    tokenizer: str | None = None
    tokenizer_revision: str | None = None
    template_version: str | None = None
    sequence_id: str | None = None
    block_ids: tuple[int, ...] = ()
    token_count: int | None = None
    reused_tokens: int | None = None
    decision_id: str | None = None
    policy_revision: str | None = None
    details: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.type not in _EVENT_TYPES:
            raise InvalidAuditEvent(
                "type", f"unknown event type {self.type!r}; use an audit.EventType value"
            )
        # a plain str: drivers and the JSON encoder take their fast path for exact str
        object.__setattr__(self, "type", str.__str__(self.type))
        texts = _TEXT_GETTER(self)
        # one C-level pass for the common case; the loop names the field and allows
        # str subclasses
        if not set(map(type, texts)) <= _STR_OR_NONE:
            for name, value in zip(_TEXT_FIELDS, texts, strict=True):
                _check_str(name, value)
        _check_texts(texts)
        for name, count in (
            ("token_count", self.token_count),
            ("reused_tokens", self.reused_tokens),
        ):
            if count is not None and (type(count) is not int or not 0 <= count <= MAX_COUNT):
                _check_count(name, count)  # raises, naming the field (an int subclass passes)
        block_ids = self.block_ids
        if type(block_ids) is not tuple or block_ids:
            object.__setattr__(self, "block_ids", _checked_block_ids(block_ids))
        details = self.details
        if type(details) is dict:  # the rule: no ABC check, no dispatch through _clean
            cleaned: Any = _clean_mapping(details, "details", 0) if details else {}
        elif isinstance(details, Mapping):
            cleaned = _clean(details, "details", 0)
        else:
            raise InvalidAuditEvent("details", "must be a mapping")
        object.__setattr__(self, "details", cleaned)

    def derive(
        self,
        *,
        sequence_id: Any = _KEEP,
        block_ids: Any = _KEEP,
        token_count: Any = _KEEP,
        reused_tokens: Any = _KEEP,
        details: Any = _KEEP,
    ) -> AuditEvent:
        """This event with another ``sequence_id``, ``block_ids``, counts or ``details``;
        only those are checked.

        For a binding that writes many events alike but for the request and its blocks
        (the admission of one scope under one decision, the reuse of one owner's
        blocks): it builds and validates one event, then derives each request's from
        it. The fields given are checked by the rules of construction (and raise the
        same; ``details`` is copied as construction copies it); every other field is
        this event's, validated when it was built. The result equals the event built
        from all its fields.

        Raises:
            InvalidAuditEvent: a given field is invalid.
        """
        values = list(event_record(self))
        if sequence_id is not _KEEP:
            values[_SEQUENCE_AT] = checked_text("sequence_id", sequence_id)
        if block_ids is not _KEEP:
            values[_BLOCKS_AT] = _checked_block_ids(block_ids)
        if token_count is not _KEEP:
            values[_TOKENS_AT] = _checked_count("token_count", token_count)
        if reused_tokens is not _KEEP:
            values[_REUSED_AT] = _checked_count("reused_tokens", reused_tokens)
        if details is not _KEEP:
            values[_DETAILS_AT] = _checked_details(details)
        event = _OBJECT_NEW(AuditEvent)
        # each field's slot set directly (the frozen class refuses setattr), in C calls
        deque(map(call, _SLOT_SETTERS, repeat(event), values), 0)
        return event


def _checked_count(name: str, count: Any) -> Any:
    """``count`` if it is None or an int in 0 .. 2**53 - 1, else raise (naming the field)."""
    if count is not None and (type(count) is not int or not 0 <= count <= MAX_COUNT):
        _check_count(name, count)  # raises, naming the field (an int subclass passes)
    return count


def _checked_details(details: Any) -> Any:
    """``details`` as construction keeps them (a private, checked copy), or raise
    (the rules of ``AuditEvent.__post_init__``)."""
    if type(details) is dict:  # no ABC check, no dispatch through _clean
        return _clean_mapping(details, "details", 0) if details else {}
    if isinstance(details, Mapping):
        return _clean(details, "details", 0)
    raise InvalidAuditEvent("details", "must be a mapping")


def _checked_block_ids(block_ids: Any) -> tuple[int, ...]:
    """``block_ids`` as a tuple, each an integer in 0 .. 2**53 - 1, or raise."""
    ids: tuple[int, ...] = block_ids if type(block_ids) is tuple else tuple(block_ids)
    if ids:
        # C-level passes (hundreds of ids per event on the hot path): every id an
        # integer in 0 .. 2**64-1 (a float, a str or a negative id raises here), and
        # bits 53..63 clear in all of them (max() would box every id)
        try:
            raw = array("Q", ids).tobytes()
        except (TypeError, OverflowError):
            bad = next(b for b in ids if not _is_block_id(b))
            raise InvalidAuditEvent(
                "block_ids", f"must be non-negative ints, got {bad!r}"
            ) from None
        if raw[_TOP::8].strip(b"\0") or raw[_NEXT::8].translate(None, _LOW_BYTES):
            bad = next(b for b in ids if b > MAX_COUNT)
            raise InvalidAuditEvent(
                "block_ids", f"must be at most {MAX_COUNT} (2**53 - 1), got {bad!r}"
            )
    return ids


#: Every field of :class:`AuditEvent`, in declaration order: the layout of a compact record.
RECORD_FIELDS: Final = tuple(f.name for f in fields(AuditEvent))
#: ``event -> tuple`` of :data:`RECORD_FIELDS` in one C call (the hand-off to a writer process).
event_record: Final = attrgetter(*RECORD_FIELDS)
_SEQUENCE_AT: Final = RECORD_FIELDS.index("sequence_id")
_BLOCKS_AT: Final = RECORD_FIELDS.index("block_ids")
_TOKENS_AT: Final = RECORD_FIELDS.index("token_count")
_REUSED_AT: Final = RECORD_FIELDS.index("reused_tokens")
_DETAILS_AT: Final = RECORD_FIELDS.index("details")
#: Each field's slot setter, in :data:`RECORD_FIELDS` order (``AuditEvent.derive``).
_SLOT_SETTERS: Final = tuple(AuditEvent.__dict__[name].__set__ for name in RECORD_FIELDS)


class CompactEvent(NamedTuple):
    """An :class:`AuditEvent` already validated, as a tuple: what a writer process seals.

    The same fields, read the same way (the sealer reads attributes), built from
    :data:`event_record`'s tuple in one C call by :func:`event_from_record`.
    """

    type: str
    tenant: str | None
    requester_tenant: str | None
    classification: str | None
    model: str | None
    model_revision: str | None
    adapter: str | None
    adapter_revision: str | None
    tokenizer: str | None
    tokenizer_revision: str | None
    template_version: str | None
    sequence_id: str | None
    block_ids: Sequence[int]  # a tuple, or an array("Q") where packed_record packed it
    token_count: int | None
    reused_tokens: int | None
    decision_id: str | None
    policy_revision: str | None
    details: Mapping[str, Any]


_NEW: Final = tuple.__new__


#: Fewer block ids than this are handed over as the tuple (packing them gains nothing).
_PACK_MIN: Final = 16


def packed_record(event: AuditEvent) -> tuple[Any, ...]:
    """:data:`event_record`'s tuple with many block ids packed into one ``bytes``.

    The hand-off to a writer process pickles every record: a tuple of 256 ids is 256
    ints to pickle and unpickle (about 3 us each way), their ``array("Q")`` bytes one
    string. Both processes run on one machine, so the native byte order is theirs;
    :func:`event_from_record` turns the bytes back into an ``array("Q")`` of the same
    ids. Ids that do not fit (never an event's: AuditEvent checks them) stay a tuple.
    """
    record = event_record(event)
    ids = record[_BLOCKS_AT]
    if len(ids) < _PACK_MIN:
        return record
    try:
        packed = array("Q", ids).tobytes()
    except (TypeError, OverflowError):
        return record
    return (*record[:_BLOCKS_AT], packed, *record[_BLOCKS_AT + 1 :])


def event_from_record(record: tuple[Any, ...]) -> CompactEvent:
    """The event of :data:`event_record`'s tuple of an :class:`AuditEvent` (validated then).

    For the audit writer process (:mod:`kvgov.audit.writer_process`), whose records come
    from its engine over a pipe only the two hold: the engine built (and so validated)
    each event, so the fields are not checked again. Anything else builds events with
    :class:`AuditEvent`.

    Raises:
        InvalidAuditEvent: the tuple is not a record (wrong length or event type).
    """
    if len(record) != len(RECORD_FIELDS) or record[0] not in _EVENT_TYPES:
        raise InvalidAuditEvent("event", "not a compact audit record")
    if type(record[_BLOCKS_AT]) is bytes:  # packed by packed_record
        ids = array("Q")
        ids.frombytes(record[_BLOCKS_AT])
        record = (*record[:_BLOCKS_AT], ids, *record[_BLOCKS_AT + 1 :])
    return _NEW(CompactEvent, record)


assert tuple(CompactEvent.__annotations__) == RECORD_FIELDS  # the two layouts are one


# ---------------------------------------------------------------------- trusted construction
#
# The governor writes a few events per request on the engine's scheduling thread, and
# most of what AuditEvent checks there is kvgov's own data, typed and checked where it
# came in: a CacheScope's fields (checked when the scope was built), a sequence id the
# binding checked at admission, the pool's block ids, counts it computed, literal
# detail keys. trusted_event builds the same AuditEvent from such values without the
# checks (about 1 us against 8 to 11); what comes from outside kvgov's code at those
# call sites (the policy engine's decision id, bundle revision, reason and TTL) still
# goes through checked_text and trusted_details, which apply AuditEvent's own rules.
# tests/audit/test_trusted_events.py holds the two paths to identical events.

#: Each field's slot setter by name (the frozen dataclass's ``__setattr__`` refuses,
#: the slot's descriptor does not: what ``object.__setattr__`` in ``__init__`` does).
(
    _SET_TYPE,
    _SET_TENANT,
    _SET_REQUESTER_TENANT,
    _SET_CLASSIFICATION,
    _SET_MODEL,
    _SET_MODEL_REVISION,
    _SET_ADAPTER,
    _SET_ADAPTER_REVISION,
    _SET_TOKENIZER,
    _SET_TOKENIZER_REVISION,
    _SET_TEMPLATE_VERSION,
    _SET_SEQUENCE_ID,
    _SET_BLOCK_IDS,
    _SET_TOKEN_COUNT,
    _SET_REUSED_TOKENS,
    _SET_DECISION_ID,
    _SET_POLICY_REVISION,
    _SET_DETAILS,
) = _SLOT_SETTERS
#: Each event type as the plain str AuditEvent stores (``str.__str__`` of the member).
_PLAIN_TYPE: Final[dict[str, str]] = {t: str.__str__(t) for t in EventType}
_NO_SCOPE: Final[tuple[None, ...]] = (None,) * len(SCOPE_FIELDS)


def trusted_event(
    type: EventType,
    scope: tuple[str | None, ...] | None = None,
    *,
    tenant: str | None = None,
    requester_tenant: str | None = None,
    sequence_id: str | None = None,
    block_ids: tuple[int, ...] = (),
    token_count: int | None = None,
    reused_tokens: int | None = None,
    decision_id: str | None = None,
    policy_revision: str | None = None,
    details: dict[str, Any] | None = None,
) -> AuditEvent:
    """The :class:`AuditEvent` of values kvgov's own code made or already checked, unchecked.

    For the governor's call sites on the serving path only. Every argument must be
    what :class:`AuditEvent` would accept and keep as it is:

    * ``scope``: the nine values of a :class:`kvgov.govern.CacheScope`, in
      :data:`kvgov.schema.SCOPE_FIELDS` order (the scope checked them); or None, and
      ``tenant`` alone (a tenant taken from such a scope);
    * ``requester_tenant``, ``sequence_id``: a scope's tenant; a sequence id the
      binding checked with :func:`kvgov.schema.text_problem` when it came in;
    * ``block_ids``: a tuple of the pool's own block ids (plain ints from 0 up);
    * ``token_count``, ``reused_tokens``: counts kvgov computed (ints from 0 up);
    * ``decision_id``, ``policy_revision``: values :func:`checked_text` returned;
    * ``details``: a new dict the caller will not touch again, that
      :func:`trusted_details` returned (its keys literal in kvgov's code).

    Anything else (a client's text, a policy's output) is checked first, or the
    event is built with :class:`AuditEvent`.
    """
    ev: AuditEvent = _OBJECT_NEW(AuditEvent)
    _SET_TYPE(ev, _PLAIN_TYPE[type])
    (
        scope_tenant,
        classification,
        model,
        model_revision,
        adapter,
        adapter_revision,
        tokenizer,
        tokenizer_revision,
        template_version,
    ) = _NO_SCOPE if scope is None else scope
    _SET_TENANT(ev, tenant if scope is None else scope_tenant)
    _SET_REQUESTER_TENANT(ev, requester_tenant)
    _SET_CLASSIFICATION(ev, classification)
    _SET_MODEL(ev, model)
    _SET_MODEL_REVISION(ev, model_revision)
    _SET_ADAPTER(ev, adapter)
    _SET_ADAPTER_REVISION(ev, adapter_revision)
    _SET_TOKENIZER(ev, tokenizer)
    _SET_TOKENIZER_REVISION(ev, tokenizer_revision)
    _SET_TEMPLATE_VERSION(ev, template_version)
    _SET_SEQUENCE_ID(ev, sequence_id)
    _SET_BLOCK_IDS(ev, block_ids)
    _SET_TOKEN_COUNT(ev, token_count)
    _SET_REUSED_TOKENS(ev, reused_tokens)
    _SET_DECISION_ID(ev, decision_id)
    _SET_POLICY_REVISION(ev, policy_revision)
    _SET_DETAILS(ev, {} if details is None else details)
    return ev


_FIELD_LIMIT: Final = dict(zip(_TEXT_FIELDS, _TEXT_LIMITS, strict=True))


def checked_text(name: str, value: Any) -> Any:
    """``value`` for the text field ``name`` of an event, checked as :class:`AuditEvent` checks it.

    For a value from outside kvgov's code (a policy decision's id or bundle revision)
    bound for :func:`trusted_event`.

    Raises:
        InvalidAuditEvent: the value is not a str or None, or the store would refuse
            it (naming ``name``).
    """
    if value is None or (
        type(value) is str
        and len(value) <= _FIELD_LIMIT[name]
        and value.isascii()
        and "\x00" not in value
    ):
        return value
    _check_str(name, value)
    problem = text_problem(value, _FIELD_LIMIT[name])
    if problem is not None:
        raise InvalidAuditEvent(name, problem)
    return value


def trusted_details(details: dict[str, Any]) -> dict[str, Any]:
    """``details`` as :class:`AuditEvent` would keep them, for :func:`trusted_event`.

    ``details`` is a new dict whose keys are literals of kvgov's code; its values
    may come from anywhere. Flat values AuditEvent keeps as they are (ASCII text
    without NUL, integers within +-(2**53 - 1), booleans, None, finite floats) are
    kept, an integral float within that range becomes its int in place (as AuditEvent
    does); anything else takes AuditEvent's own path, which copies, checks and raises
    as it would.

    Raises:
        InvalidAuditEvent: a value AuditEvent refuses.
    """
    for k, v in details.items():
        t = type(v)
        if t is str:
            if v.isascii() and "\x00" not in v:
                continue
        elif t is int:
            if -MAX_COUNT <= v <= MAX_COUNT:
                continue
        elif t is bool or v is None:
            continue
        elif t is float and math.isfinite(v):
            if v.is_integer() and -MAX_COUNT <= v <= MAX_COUNT:
                details[k] = int(v)  # a value replaced, no key added: safe while iterating
            continue
        return _clean_mapping(details, "details", 0)
    return details
