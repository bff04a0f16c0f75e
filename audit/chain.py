"""The hash chain: canonical event bytes and ``hash = SHA-256(prev_hash || canonical)``.

Each stream (one writer) keeps its own chain, so many workers can append to one
database without coordinating. An event's hash covers every stored field except
the two hashes themselves; the previous hash links it to
the event before it in the same stream.

Byte layout (``canonical_event_bytes``)::

    canonical = ASCII bytes of the compact JSON array
        ["kvgov-audit-1", stream, seq, time_us, type,
         tenant, requester_tenant, classification,
         model, model_revision, adapter, adapter_revision,
         tokenizer, tokenizer_revision, template_version,
         sequence_id, token_count, reused_tokens,
         decision_id, policy_revision, block_ids, details]

    hash(event_1) = SHA-256(32 zero bytes || canonical(event_1))     # GENESIS_HASH
    hash(event_n) = SHA-256(hash(event_n-1) || canonical(event_n))

JSON rules (what makes the form survive a PostgreSQL JSONB or SQLite round trip):

* separators ``,`` and ``:`` with no spaces; object keys sorted by code point
  (JSONB reorders keys); every non-ASCII character escaped as ``\\uXXXX``
  (so the bytes are pure ASCII);
* ``seq``, ``time_us`` (integer microseconds since 1970-01-01 UTC; SQLite drops
  time zones, integers do not), counts and block ids are JSON integers; absent
  values are ``null``; ``block_ids`` is an array, ``details`` an object;
* a float in ``details`` with an integral value is written as the integer
  (:class:`kvgov.audit.AuditEvent` converts it on construction); other floats as
  Python's shortest round-trip ``repr``; NaN and infinities are refused.

The known-answer vectors in ``tests/vectors/chain_*.json`` pin this layout.
"""

from __future__ import annotations

import hashlib
import json
from array import array
from collections.abc import Callable
from operator import itemgetter
from typing import Any, Final, NewType

__all__ = [
    "CANONICAL_VERSION",
    "GENESIS_HASH",
    "BlockIdsJson",
    "ChainHash",
    "canonical_event_bytes",
    "canonical_json",
    "canonical_prefix",
    "chain_hash",
    "fast_json",
]

#: A 32-byte SHA-256 chain hash (distinct from cache keys and other bytes).
ChainHash = NewType("ChainHash", bytes)

#: First element of every canonical array; bump it if the layout ever changes.
CANONICAL_VERSION: Final = "kvgov-audit-1"
#: The ``prev_hash`` of the first event of every stream.
GENESIS_HASH: Final = ChainHash(bytes(32))

# Not kvgov.canonical (RFC 8785) yet. The chain hashes these bytes, and RFC 8785 writes
# some of them differently: non-ASCII and DEL as UTF-8 (here \uXXXX escapes), floats
# outside 1e-4..1e16 in ECMAScript form (here Python's repr), keys with characters
# above U+FFFF in UTF-16 order. Switching needs a chain format version so that events
# written before keep verifying: a ``chain_format`` column (1 by server default for
# rows already stored and for older writers, 2 for RFC 8785) added by an Alembic
# revision, the tag "kvgov-audit-2" in place of CANONICAL_VERSION for those rows (so
# the version is hashed and cannot be flipped), the sealer, spool and verifier picking
# the encoding per row, and integers limited to +-(2**53 - 1) in format 2. Until then
# this stays the one encoder of the chain's bytes (and of signed expected-stream lists).
_ENCODER: Final = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False
)


def _make_fast_encoder() -> Callable[[Any], str]:
    """The C encoder behind ``_ENCODER``, without ``JSONEncoder.encode``'s per-call setup.

    Same output as ``_ENCODER.encode`` for the values events hold (no circular check is
    needed: cleaned details are trees). Falls back to ``_ENCODER.encode`` where the C
    accelerator is missing.
    """
    c_make = getattr(json.encoder, "c_make_encoder", None)
    if c_make is None:  # pragma: no cover - CPython always has it
        return _ENCODER.encode

    def _default(o: Any) -> Any:
        raise TypeError(f"{type(o).__name__} is not JSON")

    c_encode = c_make(
        None, _default, json.encoder.encode_basestring_ascii, None, ":", ",", True, False, False
    )
    join = "".join

    def encode(value: Any) -> str:
        if isinstance(value, str):
            return json.encoder.encode_basestring_ascii(value)
        return join(c_encode(value, 0))

    return encode


_encode = _make_fast_encoder()


def fast_json(value: Any) -> str:
    """``canonical_json`` without validation, for the writer and verifier hot paths.

    Args:
        value: a list, tuple or dict of JSON scalars (as events hold them).

    Returns:
        The canonical JSON text.
    """
    return _encode(value)


class BlockIdsJson:
    """Canonical JSON of a block-id list, with the decimal text of ids kept for reuse.

    Why: a request's events carry hundreds of block ids each, and turning ints into
    text is most of the writer's work (42 us for 750 ids with the JSON encoder here,
    about 20 us from the kept text, fetched by one ``itemgetter`` call). Ids come from
    a pool of bounded size, so the text of ids below ``limit`` is built once per
    writer; larger ids fall back to :func:`fast_json`. The output is exactly
    ``canonical_json([int(i) for i in ids])``.

    Args:
        limit: the largest id whose text is kept, plus one (bounds the memory).
    """

    __slots__ = ("_limit", "_text")

    def __init__(self, limit: int = 1 << 18) -> None:
        self._limit = limit
        self._text: list[str] = []

    def __call__(self, ids: tuple[int, ...]) -> str:
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
            top = max(ids)
            if top >= self._limit:
                return _encode(array("Q", ids).tolist())
            text = self._text
            text.extend(map(str, range(len(text), top + 1)))
            return "[" + ",".join(itemgetter(*ids)(text)) + "]"


def canonical_prefix(stream: str) -> str:
    """The text every canonical event of ``stream`` starts with: ``["kvgov-audit-1",stream,``.

    The writer and the verifier append the JSON of ``seq`` .. ``policy_revision``
    without its brackets, then ``,block_ids,details]``.

    Args:
        stream: the stream id.

    Returns:
        The prefix text.
    """
    return f"[{_encode(CANONICAL_VERSION)},{_encode(stream)},"


def canonical_json(value: Any) -> str:
    """Encode a JSON value in the canonical form the chain hashes (and SQLite stores).

    Args:
        value: a JSON-able value (as cleaned by :class:`kvgov.audit.AuditEvent`).

    Returns:
        Compact, key-sorted, ASCII-only JSON text.
    """
    return _ENCODER.encode(value)


def canonical_event_bytes(
    head: tuple[Any, ...] | list[Any], block_ids_json: str, details_json: str
) -> bytes:
    """Assemble the canonical bytes of one event.

    Args:
        head: the 19 scalar fields in layout order, from ``stream`` to
            ``policy_revision`` (without the version tag).
        block_ids_json: ``canonical_json`` of the block id list.
        details_json: ``canonical_json`` of the details object.

    Returns:
        The bytes described in the module docstring.
    """
    text = _encode([CANONICAL_VERSION, *head])
    return f"{text[:-1]},{block_ids_json},{details_json}]".encode("ascii")


def chain_hash(prev: ChainHash, canonical: bytes) -> ChainHash:
    """Link one event to its predecessor.

    Args:
        prev: the previous event's hash (``GENESIS_HASH`` for the first event).
        canonical: the event's canonical bytes.

    Returns:
        ``SHA-256(prev || canonical)``.
    """
    return ChainHash(hashlib.sha256(prev + canonical).digest())
