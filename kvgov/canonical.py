"""Canonical JSON: RFC 8785, the JSON Canonicalization Scheme (JCS), one encoder for kvgov.

The audit chain (format 2, :mod:`kvgov.audit.chain`), the policy bundle revision and the
decision cache's keys (:mod:`kvgov.policy.bundle`) all hash or compare this text. The
rules (RFC 8785 section 3.2): no whitespace; object members sorted by the UTF-16 code
units of their names; strings as they are (UTF-8), escaping only ``"``, ``\\`` and the
controls below U+0020 (``\\b \\t \\n \\f \\r``, else ``\\u00xx``); numbers as IEEE 754
doubles in ECMAScript's shortest form (``1e+30``, ``0.002``, ``1e-27``; ``-0`` is ``0``);
integers beyond +-(2**53 - 1), NaN and infinities have no form and are refused.

The reference is the ``rfc8785`` package (Trail of Bits); the RFC's own examples are
known-answer vectors in ``tests/vectors/rfc8785.json``. Why a fast path beside it:
``rfc8785`` is pure Python, 4 to 6 times slower than CPython's C JSON encoder (31 us
against 5 us for an audit event's fields), and the audit writer encodes every event on
its hot path. So :func:`canonical_json` runs the C encoder (sorted keys, no ASCII
escaping), whose output *is* RFC 8785 text for every value but these, and hands those
to ``rfc8785``: a character above U+FFFF (code-point order and UTF-16 order of keys can
differ) or a lone surrogate; a float Python writes with an exponent or a ``.0``
(``1e-05``, ``3.0``); an integer of 16 digits or more (it may be beyond 2**53).

How the text is searched for them (:func:`_suspect`), in C-level passes only: the UTF-8
bytes go through one ``bytes.translate`` that maps every digit to ``0``, ``+`` and ``-``
to ``x``, ``e`` to itself, the lead byte of a 4-byte UTF-8 sequence (a character above
U+FFFF) to NUL (the encoder escapes a real NUL) and all else to a space; then substring
tests find ``0ex`` (an exponent), sixteen ``0`` (a long digit run) and NUL; and on the
text itself ``.0`` before ``,``, ``]``, ``}`` or the end (an integral float). A lone
surrogate fails the UTF-8 encoding. A false alarm (a string holding ``2e-3`` or
``v1.0``) only costs the slow path. This replaced a regular expression that cost more
than the encoding itself: ``benchmarks/bench_canonical.py``, CPU time per call, 6.2 to
3.0 us for the policy admission input, 6.8 to 3.8 us for the decision cache's lookup by
canonical key (a plain sorted ``json.JSONEncoder.encode`` is 2.6 us). The encoder is
built once (``json.JSONEncoder.encode`` builds one per call) without the circular check,
so a circular value ends in ``RecursionError``, reported as :class:`ValueError`.
``tests/kvgov/test_canonical.py`` checks the fast path against the reference on
generated values.
"""

from __future__ import annotations

import json
from typing import Any, Final

import rfc8785

__all__ = ["JCS_INT_MAX", "CanonicalizationError", "canonical_json", "reference_json"]

#: The largest integer RFC 8785 writes (2**53 - 1: every integer up to it is a double).
JCS_INT_MAX: Final = 2**53 - 1
#: Raised for a value RFC 8785 has no form for (a ValueError).
CanonicalizationError: Final = rfc8785.CanonicalizationError


def _not_json(o: Any) -> Any:
    raise TypeError(f"Object of type {type(o).__name__} is not JSON serializable")


#: json's C encoder: sorted keys, compact, no ASCII escaping, no NaN; no circular check.
_c_encode: Final = json.encoder.c_make_encoder(  # type: ignore[attr-defined]
    None, _not_json, json.encoder.encode_basestring, None, ":", ",", True, False, False
)


def _suspect_table() -> bytes:
    table = bytearray(b" " * 256)
    for c in b"0123456789":
        table[c] = ord("0")
    table[ord("e")] = ord("e")
    table[ord("+")] = table[ord("-")] = ord("x")
    for c in range(0xF0, 0xF5):  # lead byte of a character above U+FFFF
        table[c] = 0
    return bytes(table)


_TABLE: Final = _suspect_table()
_LONG_RUN: Final = b"0" * 16


def _suspect(text: str) -> bool:
    """Whether the C encoder's ``text`` may differ from RFC 8785's (see the module doc).

    Raises:
        UnicodeEncodeError: ``text`` holds a lone surrogate.
    """
    if ".0" in text and (".0," in text or ".0]" in text or ".0}" in text or text.endswith(".0")):
        return True
    shape = text.encode("utf-8").translate(_TABLE)
    return b"0ex" in shape or _LONG_RUN in shape or b"\0" in shape


def reference_json(value: Any) -> str:
    """RFC 8785 text of ``value`` by the ``rfc8785`` package alone (slow: tests, rare values).

    Raises:
        CanonicalizationError: a value RFC 8785 has no form for.
    """
    return rfc8785.dumps(value).decode("utf-8")


def canonical_json(value: Any) -> str:
    """RFC 8785 (JCS) text of a JSON value.

    Args:
        value: ``None``, ``bool``, ``int``, ``float``, ``str``, lists or tuples, and
            dicts with ``str`` keys (the fast path, like ``json.dumps``, would write an
            int key as a string where ``rfc8785`` refuses it: callers pass ``str`` keys).

    Returns:
        The canonical text (encode it as UTF-8 to hash it).

    Raises:
        ValueError: a value RFC 8785 has no form for: an integer beyond +-(2**53 - 1), a
            NaN or infinity (:data:`CanonicalizationError`), a lone surrogate; a circular
            or too deeply nested value.
        TypeError: a value that is not JSON.
    """
    try:
        text = "".join(_c_encode(value, 0))
    except ValueError:  # NaN or infinity: the reference says which
        return reference_json(value)
    except RecursionError:
        raise ValueError("a circular or too deeply nested value has no JSON form") from None
    try:
        if not _suspect(text):
            return text
    except UnicodeEncodeError:  # a lone surrogate: the reference refuses it
        pass
    return reference_json(value)
