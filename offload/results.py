"""What the offload store returns: small frozen objects read by name."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Literal

__all__ = [
    "DeleteReport",
    "MissReason",
    "OffloadResult",
    "OffloadStats",
    "PutOutcome",
    "Refusal",
    "RestoreMiss",
    "Restored",
    "ShredReport",
    "TierPut",
    "TierStats",
]


class MissReason(StrEnum):
    """Why a tier (or a whole restore) gave no block.

    The last five are security refusals (:class:`~kvgov.exceptions.ObjectRefused`
    subclasses): the caller audits them.
    """

    #: No object under the key.
    ABSENT = "absent"
    #: The object's retention deadline has passed; it was deleted.
    EXPIRED = "expired"
    #: The tier (or the key store) could not be reached.
    UNAVAILABLE = "unavailable"
    #: Unparseable: truncated, padded, unknown format version.
    CORRUPT = "corrupt"
    #: AES-GCM authentication failed.
    TAMPERED = "tampered"
    #: It names another block, scope, tenant or tenant's key.
    MISBOUND = "misbound"
    #: Older than an object this store has since written, read or deleted for the key.
    REPLAYED = "replayed"
    #: Its data key was destroyed: the tenant was crypto-shredded.
    KEY_DESTROYED = "key_destroyed"


#: Miss reasons that are security refusals, in the order a summary prefers them.
REFUSAL_REASONS = (
    MissReason.KEY_DESTROYED,
    MissReason.MISBOUND,
    MissReason.TAMPERED,
    MissReason.REPLAYED,
    MissReason.CORRUPT,
)


class PutOutcome(StrEnum):
    """What happened to one tier's copy when a block was offloaded."""

    #: Sealed and stored.
    STORED = "stored"
    #: The caller (the offload policy) did not allow this tier.
    NOT_ALLOWED = "not_allowed"
    #: The object is larger than the tier's whole capacity.
    TOO_LARGE = "too_large"
    #: The deadline had already passed: nothing to keep.
    EXPIRED = "expired"
    #: The tier (or the key store) could not be reached; nothing was written in its place.
    UNAVAILABLE = "unavailable"


@dataclass(frozen=True, slots=True)
class TierPut:
    """One tier's part of an offload."""

    tier: str
    outcome: PutOutcome
    #: Bytes stored (header and ciphertext); 0 unless stored.
    nbytes: int
    #: Objects the tier evicted (LRU) to make room.
    evicted: int


@dataclass(frozen=True, slots=True)
class OffloadResult:
    """The outcome of :meth:`~kvgov.offload.OffloadStore.offload`, one entry per tier in order."""

    puts: tuple[TierPut, ...]
    #: The data key that sealed the block (hex), or None if nothing was sealed.
    key_id: str | None

    @property
    def stored_in(self) -> tuple[str, ...]:
        """The tiers that now hold the block."""
        return tuple(p.tier for p in self.puts if p.outcome is PutOutcome.STORED)


@dataclass(frozen=True, slots=True)
class Refusal:
    """An object a tier returned that failed a security check (the caller audits it)."""

    tier: str
    reason: MissReason
    #: What exactly did not hold (no key material, no payload).
    detail: str


@dataclass(frozen=True, slots=True)
class Restored:
    """A hit: the block's payload, decrypted and verified."""

    #: The tier that served it.
    tier: str
    #: The plaintext: new bytes, or a view of the caller's ``into`` buffer (for a GPU
    #: tensor: of the pinned host buffer that was copied to it).
    payload: bytes | memoryview
    #: The data key that had sealed it (hex).
    key_id: str
    #: Objects refused in earlier tiers on the way (audit them too).
    refusals: tuple[Refusal, ...]
    hit: Literal[True] = True


@dataclass(frozen=True, slots=True)
class RestoreMiss:
    """A miss: no tier gave a valid, live object for the block."""

    #: The summary: the first security refusal, else expired, else unavailable, else absent.
    reason: MissReason
    #: Every object refused on the way (audit them).
    refusals: tuple[Refusal, ...]
    hit: Literal[False] = False


@dataclass(frozen=True, slots=True)
class DeleteReport:
    """Objects deleted per tier by ``delete``, ``delete_by_tenant``, ``delete_where``, ``sweep``."""

    #: Objects deleted, per tier name.
    deleted: Mapping[str, int]
    #: Tiers that could not be reached: their objects were not deleted (yet).
    unreachable: tuple[str, ...]

    @property
    def total(self) -> int:
        """Objects deleted in all tiers."""
        return sum(self.deleted.values())


@dataclass(frozen=True, slots=True)
class ShredReport:
    """Evidence of a crypto-shred: the destroyed keys, then the objects deleted."""

    tenant: str
    #: The data keys destroyed (hex ids): every object they sealed is now unreadable.
    destroyed_key_ids: tuple[str, ...]
    #: Objects deleted afterwards, per tier.
    deleted: Mapping[str, int]
    #: Tiers that could not be reached; their copies remain, unreadable.
    unreachable: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TierStats:
    """Counters of one tier, as seen by one store (since it was created)."""

    name: str
    capacity_bytes: int
    #: Bytes held now (for a shared tier: by every worker); None if it could not be asked.
    stored_bytes: int | None
    #: Objects held now; None if it could not be asked.
    stored_blocks: int | None
    #: False while the store skips the tier after a failure.
    available: bool
    #: Objects stored, and their bytes.
    puts: int
    put_bytes: int
    #: Restores it served, and lookups it could not serve.
    hits: int
    misses: int
    #: Objects it evicted (LRU) to make room for this store's puts.
    evictions: int
    #: Objects deleted because their deadline passed (sweep or restore).
    expired: int
    #: Objects deleted on request (delete, delete_by_tenant, delete_where, shred).
    deleted: int
    #: Operations it could not serve because it was unreachable (or skipped as down).
    unavailable: int
    #: Objects that failed AES-GCM authentication.
    decrypt_failures: int
    #: Security refusals by reason (``MissReason`` values).
    refusals: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class OffloadStats:
    """Counters of every tier of a store, by tier name, in tier order."""

    tiers: Mapping[str, TierStats]
