"""The safe layer: the governed KV cache a serving stack embeds.

``GovernedKVCache`` composes the block pool (:mod:`kvgov.allocator`), the Rego
policies (:mod:`kvgov.policy`) and the audit trail (:mod:`kvgov.audit`); ``CacheScope``
says what must match before KV state is reused.
"""

from .cache import GovernedKVCache
from .keys import CacheKey, KeyDeriver, NamespaceRoot, ScopeDigest, namespace_root, scope_digest
from .results import Admission, ErasureReport, InvalidationReport, ReconcileReport
from .scope import CacheScope
from .stats import CacheStats, TenantStats

__all__ = [
    "Admission",
    "CacheKey",
    "CacheScope",
    "CacheStats",
    "ErasureReport",
    "GovernedKVCache",
    "InvalidationReport",
    "KeyDeriver",
    "NamespaceRoot",
    "ReconcileReport",
    "ScopeDigest",
    "TenantStats",
    "namespace_root",
    "scope_digest",
]
