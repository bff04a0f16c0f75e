"""The safe layer: the governor and its bindings to block pools.

``Governor`` holds the governance (scope -> keys, Rego decisions from
:mod:`kvgov.policy`, owners, retention, the audit trail of :mod:`kvgov.audit`)
and drives any pool that speaks ``GovernedPool``. ``GovernedKVCache`` is the
governor on kvgov's own block pool (:mod:`kvgov.allocator`), the object a
serving stack embeds; ``CacheScope`` says what must match before KV state is
reused.
"""

from .cache import GovernedKVCache
from .governor import Governor, LiveSequence
from .keys import CacheKey, KeyDeriver, NamespaceRoot, ScopeDigest, namespace_root, scope_digest
from .protocol import GovernedPool
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
    "GovernedPool",
    "Governor",
    "InvalidationReport",
    "KeyDeriver",
    "LiveSequence",
    "NamespaceRoot",
    "ReconcileReport",
    "ScopeDigest",
    "TenantStats",
    "namespace_root",
    "scope_digest",
]
