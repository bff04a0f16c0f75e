"""Encrypted KV offload tiers: host memory, local disk and a shared Redis, per-tenant keys.

An :class:`OffloadStore` holds ordered tiers (:class:`HostMemoryTier`,
:class:`DiskTier`, :class:`RedisTier`, or anything that fits the :class:`Tier`
protocol) and seals every block with AES-256-GCM under its tenant's data key before
any tier sees it; the associated data binds each object to its block key, scope
digest, tenant, tier, deadline and format version. Data keys are wrapped by a
key-encryption key (:class:`LocalKEK`, or a KMS behind :class:`KeyProvider`) and kept
in a :class:`WrappedKeyStore` (SQL: ``kvgov.audit.SqlWrappedKeyStore``);
:meth:`OffloadStore.shred` destroys a tenant's key, making every copy unreadable at
once. See docs/offload.md.

This package imports nothing from the other layers: only ``kvgov.exceptions``,
``kvgov.defaults`` and ``kvgov.schema``.
"""

from kvgov.offload.crypto import MAX_MESSAGES_PER_SESSION, DataKey
from kvgov.offload.disk_tier import DiskTier
from kvgov.offload.keys import DataKeyRing, KeyProvider, LocalKEK, WrappedKeyRecord, WrappedKeyStore
from kvgov.offload.memory_tier import HostMemoryTier
from kvgov.offload.objects import FORMAT_VERSION, ObjectInfo, SealedBlock
from kvgov.offload.redis_tier import RedisTier
from kvgov.offload.results import (
    DeleteReport,
    MissReason,
    OffloadResult,
    OffloadStats,
    PutOutcome,
    Refusal,
    Restored,
    RestoreMiss,
    ShredReport,
    TierPut,
    TierStats,
)
from kvgov.offload.store import OffloadStore
from kvgov.offload.tier import Tier, TierUsage

__all__ = [
    "FORMAT_VERSION",
    "MAX_MESSAGES_PER_SESSION",
    "DataKey",
    "DataKeyRing",
    "DeleteReport",
    "DiskTier",
    "HostMemoryTier",
    "KeyProvider",
    "LocalKEK",
    "MissReason",
    "ObjectInfo",
    "OffloadResult",
    "OffloadStats",
    "OffloadStore",
    "PutOutcome",
    "RedisTier",
    "Refusal",
    "RestoreMiss",
    "Restored",
    "SealedBlock",
    "ShredReport",
    "Tier",
    "TierPut",
    "TierStats",
    "TierUsage",
    "WrappedKeyRecord",
    "WrappedKeyStore",
]
