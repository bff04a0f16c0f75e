"""The hash chain: canonical event bytes and ``hash = SHA-256(prev_hash || canonical)``.

Each stream (one writer) keeps its own chain, so many workers can append to one
database without coordinating. An event's hash covers every stored field except
the two hashes themselves and ``chain_format``, which the version tag stands for;
the previous hash links it to the event before it in the same stream.

Byte layout (``canonical_event_bytes``)::

    canonical = the JSON array, compact, encoded as below per chain format
        [tag, stream, seq, time_us, type,
         tenant, requester_tenant, classification,
         model, model_revision, adapter, adapter_revision,
         tokenizer, tokenizer_revision, template_version,
         sequence_id, token_count, reused_tokens,
         decision_id, policy_revision, block_ids, details]

    hash(event_1) = SHA-256(32 zero bytes || canonical(event_1))     # GENESIS_HASH
    hash(event_n) = SHA-256(hash(event_n-1) || canonical(event_n))

Two chain formats; each row's ``chain_format`` column says which one its hash uses, and
the tag (hashed) says it again, so the column cannot be flipped without breaking the
hash. A stream may hold both (a writer upgraded mid-stream): ``prev_hash`` links across.

**Format 2** (``tag = "kvgov-audit-2"``, every row written since the ``0004_chain_format``
revision): the UTF-8 bytes of the RFC 8785 (JCS) text of the array
(:func:`kvgov.canonical.canonical_json`): strings as they are (non-ASCII and DEL raw;
``"``, ``\\`` and controls escaped), ``details`` members sorted by UTF-16 code units,
numbers in ECMAScript's shortest form (``0.00001``, ``1e+21``, ``3.0`` is ``3``). Every
integer is within +-(2**53 - 1): :class:`kvgov.audit.AuditEvent` refuses larger counts,
block ids and ``details`` integers, and keeps an integral ``details`` float beyond that
range a float (``1e20`` is written ``100000000000000000000``). ``seq`` and ``time_us``
are far below it (``time_us`` reaches it in the year 2255).

**Format 1** (``tag = "kvgov-audit-1"``, rows stored before that revision, and the
server default of the column): ASCII bytes of Python's ``json`` with sorted keys, ``,``
and ``:`` separators, every non-ASCII character (and DEL) escaped as ``\\uXXXX``
(UTF-16 surrogate pairs above U+FFFF), keys sorted by code point, floats as Python's
``repr`` (``1e-05``, integral ones already ints), integers of any size in decimal.

In both formats ``seq``, ``time_us`` (integer microseconds since 1970-01-01 UTC; SQLite
drops time zones, integers do not), counts and block ids are JSON integers; absent
values are ``null``; ``block_ids`` is an array, ``details`` an object; NaN and
infinities are refused. Both forms survive a PostgreSQL JSONB or SQLite round trip: the
verifier re-encodes what JSONB returns (:data:`FORMATS` ``load``, strict about numbers in
format 2: a number must be exactly the double the text names).

The known-answer vectors in ``tests/vectors/chain_*.json`` pin both layouts, and
``tests/vectors/trail_format1.json`` is a trail written before format 2 existed.
"""

from __future__ import annotations

import hashlib
import json
import math
from array import array
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from functools import partial
from operator import index, itemgetter
from types import MappingProxyType
from typing import Any, Final, NamedTuple, NewType

from kvgov.canonical import JCS_INT_MAX
from kvgov.canonical import canonical_json as jcs

__all__ = [
    "CANONICAL_VERSION",
    "CHAIN_FORMAT",
    "FORMATS",
    "GENESIS_HASH",
    "BlockIdsJson",
    "ChainFormat",
    "ChainHash",
    "canonical_event_bytes",
    "canonical_json",
    "canonical_prefix",
    "chain_hash",
]

#: A 32-byte SHA-256 chain hash (distinct from cache keys and other bytes).
ChainHash = NewType("ChainHash", bytes)

#: The tag of format 1, the first element of its canonical arrays.
CANONICAL_VERSION: Final = "kvgov-audit-1"
#: The chain format writers use now (the ``chain_format`` of every row they write).
CHAIN_FORMAT: Final = 2
#: The ``prev_hash`` of the first event of every stream.
GENESIS_HASH: Final = ChainHash(bytes(32))

#: Format 1's encoder: also the one encoder of signed expected-stream lists.
_ENCODER: Final = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
)


def _make_fast_encoder(ascii_only: bool) -> Callable[[Any], str]:
    """json's C encoder without ``JSONEncoder.encode``'s per-call setup.

    ``ascii_only``: the output of ``_ENCODER.encode`` (format 1); else the same with
    non-ASCII characters raw, which is RFC 8785 text for what an event's scalar fields
    hold: strings without lone surrogates, None, integers within +-(2**53 - 1) (format 2).
    No circular check is needed: cleaned details are trees. Falls back to the Python
    encoder where the C accelerator is missing.
    """
    encode_str = (
        json.encoder.encode_basestring_ascii if ascii_only else json.encoder.encode_basestring
    )
    c_make = getattr(json.encoder, "c_make_encoder", None)
    if c_make is None:  # pragma: no cover - CPython always has it
        return json.JSONEncoder(
            sort_keys=True, separators=(",", ":"), ensure_ascii=ascii_only, allow_nan=False
        ).encode

    def _default(o: Any) -> Any:
        raise TypeError(f"{type(o).__name__} is not JSON")

    c_encode = c_make(None, _default, encode_str, None, ":", ",", True, False, False)
    join = "".join

    def encode(value: Any) -> str:
        if isinstance(value, str):
            return encode_str(value)
        return join(c_encode(value, 0))

    return encode


_encode = _make_fast_encoder(ascii_only=True)
_encode_utf8 = _make_fast_encoder(ascii_only=False)


class BlockIdsJson:
    """Canonical JSON of a block-id list, with the decimal text of ids kept for reuse.

    Why: a request's events carry hundreds of block ids each, and turning ints into
    text is most of the writer's work (42 us for 750 ids with the JSON encoder here,
    about 20 us from the kept text, fetched by one ``itemgetter`` call). Ids come from
    a pool of bounded size, so the text of ids below ``limit`` is built once per
    writer; larger ids fall back to the JSON encoder. The output is exactly
    ``FORMATS[n].json([int(i) for i in ids])`` in both formats (ids are integers up to
    2**53 - 1, written in decimal by both).

    Args:
        limit: the largest id whose text is kept, plus one (bounds the memory).
    """

    __slots__ = ("_limit", "_text")

    def __init__(self, limit: int = 1 << 18) -> None:
        self._limit = limit
        self._text: list[str] = []

    def __call__(self, ids: Sequence[int]) -> str:
        """Encode ``ids``: non-negative integers, as :class:`AuditEvent` validated them.

        An id may be any integer-like value (``operator.index``); its text is that of
        its integer value.
        """
        if len(ids) < 2:
            return f"[{int(ids[0])}]" if ids else "[]"
        try:
            # a negative id would index from the end: AuditEvent refuses them
            return "[" + ",".join(itemgetter(*ids)(self._text)) + "]"
        except IndexError:
            top = max(map(index, ids))
            if top >= self._limit:
                return _encode(array("Q", map(index, ids)).tolist())
            text = self._text
            text.extend(map(str, range(len(text), top + 1)))
            return "[" + ",".join(itemgetter(*ids)(text)) + "]"


def canonical_json(value: Any) -> str:
    """Encode a JSON value as format 1 hashes it (and signed expected-stream lists do).

    Args:
        value: a JSON-able value (as cleaned by :class:`kvgov.audit.AuditEvent`).

    Returns:
        Compact, key-sorted, ASCII-only JSON text.
    """
    return _ENCODER.encode(value)


def _exact_number(text: str) -> float:
    """A JSON number as the double it names exactly, in RFC 8785's sense, or ValueError.

    JSONB keeps a number's decimal value (``1e+21`` comes back as
    ``1000000000000000000000``): that value must be exactly the one the RFC 8785 text of
    its double names, so no other decimal can stand in for a stored number.
    """
    value = float(text)
    if not math.isfinite(value) or Decimal(text) != Decimal(jcs(value)):
        raise ValueError(f"{text[:40]} is not a number format 2 writes")
    return value


def _int_or_double(text: str) -> int | float:
    n = int(text)
    return n if -JCS_INT_MAX <= n <= JCS_INT_MAX else _exact_number(text)


def _cleaned_json_2(value: Any) -> str:
    """Format 2's JSON of ``details`` as :class:`kvgov.audit.AuditEvent` cleaned them.

    Cleaning bounds every integer to +-(2**53 - 1), so only a float (whose Python text
    holds ``.``, ``e-`` or ``e+``) or a character above U+FFFF (non-ASCII) can make the C
    encoder's text differ from RFC 8785's; text with neither is returned as it is (the
    writer's hot path), anything else goes through :func:`kvgov.canonical.canonical_json`.
    """
    text = _encode_utf8(value)
    if text.isascii() and "." not in text and "e-" not in text and "e+" not in text:
        return text
    return jcs(value)


def _no_constant(text: str) -> Any:
    raise ValueError(f"{text} is not JSON")


class ChainFormat(NamedTuple):
    """How one chain format turns an event into bytes (see the module docstring).

    Attributes:
        number: the ``chain_format`` column value.
        tag: the version tag, the canonical array's first element.
        head_json: the encoder of the scalar fields, a tuple of ``str``, ``None`` and
            ``int`` (fast, no validation: :class:`kvgov.audit.AuditEvent` validated them).
        json: the encoder of ``block_ids`` and ``details`` (validating).
        details_json: the same for ``details`` as :class:`kvgov.audit.AuditEvent` cleaned
            them (the sealer's: checks that cleaning makes needless are skipped).
        load: parses stored JSON text (SQLite's, JSONB's, a spool line's) back to a value
            ``json`` encodes to the bytes the writer hashed; ValueError when no such
            value exists (format 2: a number that is not exactly a double).
        charset: how the canonical text becomes bytes.
    """

    number: int
    tag: str
    head_json: Callable[[Any], str]
    json: Callable[[Any], str]
    details_json: Callable[[Any], str]
    load: Callable[[str], Any]
    charset: str


#: Every chain format by its ``chain_format`` number.
FORMATS: Final[Mapping[int, ChainFormat]] = MappingProxyType(
    {
        1: ChainFormat(1, CANONICAL_VERSION, _encode, canonical_json, _encode, json.loads, "ascii"),
        2: ChainFormat(
            2,
            "kvgov-audit-2",
            _encode_utf8,
            jcs,
            _cleaned_json_2,
            partial(
                json.loads,
                parse_float=_exact_number,
                parse_int=_int_or_double,
                parse_constant=_no_constant,
            ),
            "utf-8",
        ),
    }
)


def canonical_prefix(stream: str, chain_format: int = CHAIN_FORMAT) -> str:
    """The text every canonical event of ``stream`` starts with: ``[tag,stream,``.

    The writer and the verifier append the JSON of ``seq`` .. ``policy_revision``
    without its brackets, then ``,block_ids,details]``.

    Args:
        stream: the stream id.
        chain_format: the chain format.

    Returns:
        The prefix text.
    """
    head_json = FORMATS[chain_format].head_json
    return f"[{head_json(FORMATS[chain_format].tag)},{head_json(stream)},"


def canonical_event_bytes(
    head: tuple[Any, ...] | list[Any],
    block_ids_json: str,
    details_json: str,
    chain_format: int = CHAIN_FORMAT,
) -> bytes:
    """Assemble the canonical bytes of one event.

    Args:
        head: the 19 scalar fields in layout order, from ``stream`` to
            ``policy_revision`` (without the version tag).
        block_ids_json: the block id list's JSON in this format (``FORMATS[n].json``).
        details_json: the details object's JSON in this format.
        chain_format: the chain format (1 for rows stored before format 2).

    Returns:
        The bytes described in the module docstring.

    Raises:
        KeyError: an unknown chain format.
    """
    fmt = FORMATS[chain_format]
    text = fmt.head_json([fmt.tag, *head])
    return f"{text[:-1]},{block_ids_json},{details_json}]".encode(fmt.charset)


def chain_hash(prev: ChainHash, canonical: bytes) -> ChainHash:
    """Link one event to its predecessor.

    Args:
        prev: the previous event's hash (``GENESIS_HASH`` for the first event).
        canonical: the event's canonical bytes.

    Returns:
        ``SHA-256(prev || canonical)``.
    """
    return ChainHash(hashlib.sha256(prev + canonical).digest())
