"""The safe layer: the governor and its bindings to block pools.

``Governor`` holds the governance (scope -> keys, Rego decisions from
:mod:`kvgov.policy`, retention, the audit trail of :mod:`kvgov.audit`), keeps
its state in one ``Ledger`` (owners, deadlines, views, counters) and governs
any pool that speaks ``ObservedPool``; a binding that runs its pool itself
drives a ``DrivenPool``. ``GovernedKVCache`` is the governor on kvgov's own
block pool (:mod:`kvgov.allocator`), the object a serving stack embeds;
see docs/architecture.md; ``CacheScope`` says what must match before KV state is
reused. ``OffloadConfig`` adds encrypted offload tiers (host memory, disk,
Redis) under the governor: see docs/offload.md.

The names are resolved on first use (PEP 562), so ``kvgov.govern.cli`` (the audit
and policy commands) does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from kvgov.lazy import lazy_exports

if TYPE_CHECKING:
    from kvgov.govern.cache import GovernedKVCache
    from kvgov.govern.governor import Governor
    from kvgov.govern.keys import (
        CacheKey,
        KeyDeriver,
        NamespaceRoot,
        ScopeDigest,
        namespace_root,
        scope_digest,
    )
    from kvgov.govern.ledger import Ledger
    from kvgov.govern.offload_config import OffloadConfig, parse_tier_url
    from kvgov.govern.offloading import Offloading
    from kvgov.govern.protocol import DrivenPool, ObservedPool, OffloadablePool, RunningSequence
    from kvgov.govern.results import Admission, ErasureReport, InvalidationReport, ReconcileReport
    from kvgov.govern.scope import CacheScope
    from kvgov.govern.stats import CacheStats, OffloadSnapshot, TenantStats

_EXPORTS = {
    "Admission": "kvgov.govern.results",
    "CacheKey": "kvgov.govern.keys",
    "CacheScope": "kvgov.govern.scope",
    "CacheStats": "kvgov.govern.stats",
    "ErasureReport": "kvgov.govern.results",
    "GovernedKVCache": "kvgov.govern.cache",
    "DrivenPool": "kvgov.govern.protocol",
    "Governor": "kvgov.govern.governor",
    "InvalidationReport": "kvgov.govern.results",
    "KeyDeriver": "kvgov.govern.keys",
    "Ledger": "kvgov.govern.ledger",
    "RunningSequence": "kvgov.govern.protocol",
    "NamespaceRoot": "kvgov.govern.keys",
    "OffloadConfig": "kvgov.govern.offload_config",
    "ObservedPool": "kvgov.govern.protocol",
    "OffloadSnapshot": "kvgov.govern.stats",
    "OffloadablePool": "kvgov.govern.protocol",
    "Offloading": "kvgov.govern.offloading",
    "ReconcileReport": "kvgov.govern.results",
    "ScopeDigest": "kvgov.govern.keys",
    "TenantStats": "kvgov.govern.stats",
    "namespace_root": "kvgov.govern.keys",
    "parse_tier_url": "kvgov.govern.offload_config",
    "scope_digest": "kvgov.govern.keys",
}

__all__ = [
    "Admission",
    "CacheKey",
    "CacheScope",
    "CacheStats",
    "DrivenPool",
    "ErasureReport",
    "GovernedKVCache",
    "Governor",
    "InvalidationReport",
    "KeyDeriver",
    "Ledger",
    "NamespaceRoot",
    "ObservedPool",
    "OffloadConfig",
    "OffloadSnapshot",
    "OffloadablePool",
    "Offloading",
    "ReconcileReport",
    "RunningSequence",
    "ScopeDigest",
    "TenantStats",
    "namespace_root",
    "parse_tier_url",
    "scope_digest",
]


__getattr__, __dir__ = lazy_exports("kvgov.govern", _EXPORTS, globals())
