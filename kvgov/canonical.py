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
its hot path. So :func:`canonical_json` runs the C encoder (``sort_keys``, no ASCII
escaping), whose output *is* RFC 8785 text for every value but these, and hands those
to ``rfc8785``: a character above U+FFFF (code-point order and UTF-16 order of keys can
differ) or a lone surrogate; a float Python writes with an exponent or a ``.0``
(``1e-05``, ``3.0``); an integer of 16 digits or more (it may be beyond 2**53). The text
is searched for them in two C-level scans; a false alarm (a string holding ``2e-3``)
only costs the slow path. ``tests/kvgov/test_canonical.py`` checks the fast path against
the reference on generated values.
"""

from __future__ import annotations

import json
import re
from typing import Any, Final

import rfc8785

__all__ = ["JCS_INT_MAX", "CanonicalizationError", "canonical_json", "reference_json"]

#: The largest integer RFC 8785 writes (2**53 - 1: every integer up to it is a double).
JCS_INT_MAX: Final = 2**53 - 1
#: Raised for a value RFC 8785 has no form for (a ValueError).
CanonicalizationError: Final = rfc8785.CanonicalizationError

#: A character above U+FFFF or a lone surrogate (which has no UTF-8 form).
_NOT_BMP: Final = re.compile("[\ud800-\udfff\U00010000-\U0010ffff]")
_encode: Final = json.JSONEncoder(
    sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
).encode
#: A float Python writes otherwise than RFC 8785: with an exponent (``1e-05``) or a
#: ``.0`` (``3.0``, ``-0.0``); or a run of 16+ digits (an integer near 2**53).
_SUSPECT: Final = re.compile(r"[0-9](?:e[-+]|\.0(?![0-9]))|[0-9]{16}")


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
            NaN or infinity (:data:`CanonicalizationError`), a lone surrogate.
        TypeError: a value that is not JSON.
    """
    try:
        text = _encode(value)
    except ValueError:  # NaN or infinity: the reference says which
        return reference_json(value)
    if (not text.isascii() and _NOT_BMP.search(text)) or _SUSPECT.search(text):
        return reference_json(value)
    return text
