"""The safe layer: the governor and its bindings to block pools.

``Governor`` holds the governance (scope -> keys, Rego decisions from
:mod:`kvgov.policy`, owners, retention, the audit trail of :mod:`kvgov.audit`)
and drives any pool that speaks ``GovernedPool``. ``GovernedKVCache`` is the
governor on kvgov's own block pool (:mod:`kvgov.allocator`), the object a
serving stack embeds; ``CacheScope`` says what must match before KV state is
reused. ``OffloadConfig`` adds encrypted offload tiers (host memory, disk,
Redis) under the governor: see docs/offload.md.
"""

from .cache import GovernedKVCache
from .governor import Governor, LiveSequence
from .keys import CacheKey, KeyDeriver, NamespaceRoot, ScopeDigest, namespace_root, scope_digest
from .offload_config import OffloadConfig, parse_tier_url
from .offloading import Offloading
from .protocol import GovernedPool, OffloadablePool
from .results import Admission, ErasureReport, InvalidationReport, ReconcileReport
from .scope import CacheScope
from .stats import CacheStats, OffloadSnapshot, TenantStats

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
    "OffloadConfig",
    "OffloadSnapshot",
    "OffloadablePool",
    "Offloading",
    "ReconcileReport",
    "ScopeDigest",
    "TenantStats",
    "namespace_root",
    "parse_tier_url",
    "scope_digest",
]
