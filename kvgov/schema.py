"""Field names and text limits every layer shares, defined once.

The scope's nine fields name the policy input (:mod:`kvgov.policy`), the columns of
audit events (:mod:`kvgov.audit`) and the fields of :class:`kvgov.govern.CacheScope`; their
order is the cache-key order of the decision cache and the order the scope
digest encodes them (:mod:`kvgov.govern.keys`), so it must never change.

:data:`TEXT_LIMITS` is the one source of the audit store's text column widths: the
SQLAlchemy models (:mod:`kvgov.audit.models`) declare their ``String(n)`` from it, and
:class:`kvgov.audit.AuditEvent` and :class:`kvgov.govern.CacheScope` refuse a value the
store would refuse (:func:`text_problem`), so a bad string is stopped where it comes
in, with a typed error, and never reaches the database.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

__all__ = ["SCOPE_FIELDS", "SCOPE_FILTERS", "TEXT_LIMITS", "text_problem"]

#: The fields of a scope, in cache-key and digest order.
SCOPE_FIELDS: Final = (
    "tenant",
    "classification",
    "model",
    "model_revision",
    "adapter",
    "adapter_revision",
    "tokenizer",
    "tokenizer_revision",
    "template_version",
)

#: The scope fields an invalidation may filter on (every field but tenant and
#: classification: a tenant is erased by a purge).
SCOPE_FILTERS: Final = tuple(f for f in SCOPE_FIELDS if f not in ("tenant", "classification"))

#: Longest value, in characters (code points, as PostgreSQL's ``varchar(n)`` counts
#: them), of each text column of the audit store. Migration 0001 created the columns
#: with these widths; ``tests/audit/test_store.py`` checks a migrated database
#: against this table.
TEXT_LIMITS: Final[Mapping[str, int]] = MappingProxyType(
    {
        "stream": 128,
        "type": 32,
        "tenant": 256,
        "requester_tenant": 256,
        **dict.fromkeys(SCOPE_FIELDS[1:], 256),
        "sequence_id": 256,
        "decision_id": 64,
        "policy_revision": 128,
    }
)


def text_problem(value: str, limit: int) -> str | None:
    """Say why the audit store would refuse a text value, or None when it is storable.

    PostgreSQL refuses a NUL character in any text and a string longer than its
    column; no database takes a lone UTF-16 surrogate (it has no UTF-8 encoding).

    Args:
        value: the text.
        limit: the column's width in characters (from :data:`TEXT_LIMITS`).

    Returns:
        None, or why the value is refused, phrased to follow the field's name.
    """
    if len(value) > limit:
        return f"is {len(value)} characters long; the store holds at most {limit}"
    if "\x00" in value:
        return "contains a NUL character, which the store cannot hold"
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return "contains a lone surrogate, which is not valid Unicode text"
    return None
