"""kvgov: governance for the KV cache of a multi-tenant LLM server.

The public API is re-exported here::

    from kvgov import CacheScope, GovernedKVCache, KVSpec

The layers are subpackages: :mod:`kvgov.govern` (the governor and its bindings
to block pools, the safe layer a serving stack embeds), :mod:`kvgov.allocator`
(kvgov's own paged block pool), :mod:`kvgov.policy` (the Rego bundle and its
engines), :mod:`kvgov.audit` (the hash-chained audit trail) and
:mod:`kvgov.offload` (encrypted host, disk and Redis tiers for evicted KV).
This module itself holds only what all of them share: the exception hierarchy
(:mod:`kvgov.exceptions`), the named defaults (:mod:`kvgov.defaults`) and the
shared field names (:mod:`kvgov.schema`).

The re-exports are resolved on first use (PEP 562), so ``import
kvgov.audit`` (the audit CLI, a compliance script) does not import torch.
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING

from kvgov.lazy import lazy_exports

try:
    __version__ = version("kvgov")
except PackageNotFoundError:  # pragma: no cover - running from a bare checkout
    __version__ = "0.0.0"

if TYPE_CHECKING:
    from kvgov.allocator import KVSpec
    from kvgov.audit import AuditLog, AuditQueries, verify
    from kvgov.exceptions import KVGovError
    from kvgov.govern import (
        Admission,
        CacheScope,
        CacheStats,
        ErasureReport,
        GovernedKVCache,
        Governor,
        InvalidationReport,
        OffloadConfig,
        ReconcileReport,
        TenantStats,
    )
    from kvgov.policy import PolicyClient

#: Where each public name lives.
_EXPORTS = {
    "Admission": "kvgov.govern",
    "AuditLog": "kvgov.audit",
    "AuditQueries": "kvgov.audit",
    "CacheScope": "kvgov.govern",
    "CacheStats": "kvgov.govern",
    "ErasureReport": "kvgov.govern",
    "GovernedKVCache": "kvgov.govern",
    "Governor": "kvgov.govern",
    "InvalidationReport": "kvgov.govern",
    "KVGovError": "kvgov.exceptions",
    "KVSpec": "kvgov.allocator",
    "OffloadConfig": "kvgov.govern",
    "PolicyClient": "kvgov.policy",
    "ReconcileReport": "kvgov.govern",
    "TenantStats": "kvgov.govern",
    "verify": "kvgov.audit",
}

__all__ = [
    "Admission",
    "AuditLog",
    "AuditQueries",
    "CacheScope",
    "CacheStats",
    "ErasureReport",
    "GovernedKVCache",
    "Governor",
    "InvalidationReport",
    "KVGovError",
    "KVSpec",
    "OffloadConfig",
    "PolicyClient",
    "ReconcileReport",
    "TenantStats",
    "__version__",
    "verify",
]


__getattr__, __dir__ = lazy_exports("kvgov", _EXPORTS, globals())
