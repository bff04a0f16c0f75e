"""Field names every layer shares, defined once.

The scope's nine fields name the policy input (:mod:`kvgov.policy`), the columns of
audit events (:mod:`kvgov.audit`) and the fields of :class:`kvgov.govern.CacheScope`; their
order is the cache-key order of the decision cache and the order the scope
digest encodes them (:mod:`kvgov.govern.keys`), so it must never change.
"""

from __future__ import annotations

from typing import Final

__all__ = ["SCOPE_FIELDS"]

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
