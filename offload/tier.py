"""The one small protocol every offload tier implements, and the LRU index two of them share.

A tier stores :class:`~kvgov.offload.objects.SealedBlock` objects by block key. It
never sees plaintext and never decides anything: the store seals before ``put``,
verifies after ``get``, and decides which tiers to use. A tier that cannot reach its
backing service raises :class:`~kvgov.exceptions.TierUnavailable`; one that returns
bytes it cannot parse raises :class:`~kvgov.exceptions.ObjectCorrupt`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol, TypeVar

from kvgov.exceptions import InternalError, InvalidOffloadArgument

from .objects import ObjectInfo, SealedBlock

__all__ = ["LruIndex", "Tier", "TierUsage", "check_capacity", "check_tier_name", "put_copies"]

V = TypeVar("V")

#: Longest tier name, in UTF-8 bytes (it is length-prefixed by one byte in the AAD).
MAX_TIER_NAME_BYTES = 64


@dataclass(frozen=True, slots=True)
class TierUsage:
    """How full a tier is."""

    #: Bytes of the objects it holds (headers and ciphertext).
    stored_bytes: int
    #: Objects it holds.
    stored_blocks: int


class Tier(Protocol):
    """An LRU store of sealed blocks with a byte capacity (host memory, disk, Redis).

    Implementations: :class:`~kvgov.offload.HostMemoryTier`,
    :class:`~kvgov.offload.DiskTier`, :class:`~kvgov.offload.RedisTier`. Every method may
    raise :class:`~kvgov.exceptions.TierUnavailable`.

    Optionally, a class attribute ``put_copies = True`` says that ``put`` copies the
    object's bytes out (to a file, to a server) and keeps no reference to the object or
    its buffers once it returns; the store then seals into buffers it reuses (see
    :func:`put_copies`). A tier that does not say so is assumed to keep the object.
    """

    @property
    def name(self) -> str:
        """The tier's name; it is bound into every object's AAD, so objects cannot move."""
        ...

    @property
    def capacity_bytes(self) -> int:
        """Most bytes the tier holds; ``put`` evicts least recently used objects to fit."""
        ...

    def put(self, obj: SealedBlock, now_us: int) -> list[ObjectInfo]:
        """Store ``obj`` under its block key, replacing any object there.

        Args:
            obj: the sealed block (at most ``capacity_bytes`` large).
            now_us: the current time, microseconds (a tier with native expiry uses it).

        Returns:
            The objects evicted to make room, least recently used first.
        """
        ...

    def get(self, block_key: bytes) -> SealedBlock | None:
        """The object stored under ``block_key`` (now most recently used), or None."""
        ...

    def delete(self, block_key: bytes) -> ObjectInfo | None:
        """Delete the object under ``block_key``; returns what it was, or None."""
        ...

    def delete_by_tenant(self, tenant: str) -> list[ObjectInfo]:
        """Delete every object sealed for ``tenant``; returns what was deleted."""
        ...

    def delete_where(self, predicate: Callable[[ObjectInfo], bool]) -> list[ObjectInfo]:
        """Delete every object whose info satisfies ``predicate``; returns them."""
        ...

    def list_expired(self, now_us: int) -> list[ObjectInfo]:
        """The objects whose retention deadline is at or before ``now_us``."""
        ...

    def usage(self) -> TierUsage:
        """Bytes and objects held now."""
        ...

    def close(self) -> None:
        """Release the tier's resources (a local tier drops its objects)."""
        ...


def put_copies(tier: Tier) -> bool:
    """Whether ``tier.put`` copies an object's bytes out and keeps nothing of it once it
    returns (its class says ``put_copies = True``): the buffer the object was sealed into
    may then be reused for the next one. False for a tier that does not say so."""
    return getattr(type(tier), "put_copies", False) is True


def check_tier_name(name: object) -> str:
    """Validate a tier name.

    Args:
        name: the name given.

    Returns:
        The name.

    Raises:
        InvalidOffloadArgument: not a non-empty string of at most 64 UTF-8 bytes.
    """
    if not isinstance(name, str) or not 0 < len(name.encode("utf-8")) <= MAX_TIER_NAME_BYTES:
        raise InvalidOffloadArgument(
            "name",
            name,
            f"a tier name is a non-empty string of at most {MAX_TIER_NAME_BYTES} bytes",
        )
    return name


def check_capacity(capacity_bytes: object) -> int:
    """Validate a tier capacity.

    Args:
        capacity_bytes: the capacity given.

    Returns:
        The capacity.

    Raises:
        InvalidOffloadArgument: not a positive int.
    """
    if isinstance(capacity_bytes, bool) or not isinstance(capacity_bytes, int):
        raise InvalidOffloadArgument("capacity_bytes", capacity_bytes, "must be an int")
    if capacity_bytes <= 0:
        raise InvalidOffloadArgument("capacity_bytes", capacity_bytes, "must be positive")
    return capacity_bytes


class LruIndex(Generic[V]):
    """Objects of a local tier by block key, least recently used first, within a byte budget.

    Why an ``OrderedDict``: lookups, touches (``move_to_end``) and removals from the
    middle are O(1), and iteration order is eviction order. Not thread-safe: the
    tier holding it serializes calls.

    Invariant: ``used_bytes`` is the sum of ``info.nbytes`` over the entries and never
    exceeds ``capacity_bytes`` (checked by :meth:`_check_invariants`).

    Args:
        tier: the owning tier's name (for errors).
        capacity_bytes: the byte budget.
    """

    __slots__ = ("_entries", "_tier", "capacity_bytes", "used_bytes")

    def __init__(self, tier: str, capacity_bytes: int) -> None:
        self._tier = tier
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        self._entries: OrderedDict[bytes, tuple[ObjectInfo, V]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def make_room(self, block_key: bytes, nbytes: int) -> list[tuple[ObjectInfo, V]]:
        """Drop the entry under ``block_key`` and evict LRU entries until ``nbytes`` fit.

        Args:
            block_key: the key about to be stored (its old entry is replaced, not evicted).
            nbytes: the size of the object about to be stored.

        Returns:
            The entries removed: the replaced one first, if any, then the evicted ones.

        Raises:
            InvalidOffloadArgument: ``nbytes`` exceeds the whole capacity.
        """
        if nbytes > self.capacity_bytes:
            raise InvalidOffloadArgument(
                "obj",
                f"<{nbytes} bytes>",
                f"larger than tier {self._tier!r}'s capacity of {self.capacity_bytes} bytes",
            )
        removed = []
        old = self.pop(block_key)
        if old is not None:
            removed.append(old)
        while self.used_bytes + nbytes > self.capacity_bytes:
            _key, entry = self._entries.popitem(last=False)
            self.used_bytes -= entry[0].nbytes
            removed.append(entry)
        return removed

    def add(self, info: ObjectInfo, value: V) -> None:
        """Insert an entry as most recently used; call :meth:`make_room` first."""
        self._entries[info.block_key] = (info, value)
        self.used_bytes += info.nbytes

    def get(self, block_key: bytes) -> V | None:
        """The value under ``block_key``, marked most recently used, or None."""
        entry = self._entries.get(block_key)
        if entry is None:
            return None
        self._entries.move_to_end(block_key)
        return entry[1]

    def pop(self, block_key: bytes) -> tuple[ObjectInfo, V] | None:
        """Remove and return the entry under ``block_key``, or None."""
        entry = self._entries.pop(block_key, None)
        if entry is not None:
            self.used_bytes -= entry[0].nbytes
        return entry

    def pop_where(self, predicate: Callable[[ObjectInfo], bool]) -> list[tuple[ObjectInfo, V]]:
        """Remove and return every entry whose info satisfies ``predicate``."""
        keys = [k for k, (info, _v) in self._entries.items() if predicate(info)]
        return [entry for k in keys if (entry := self.pop(k)) is not None]

    def expired(self, now_us: int) -> list[ObjectInfo]:
        """The infos whose deadline is at or before ``now_us``, least recently used first."""
        return [info for info, _v in self._entries.values() if info.deadline_us <= now_us]

    def clear(self) -> list[tuple[ObjectInfo, V]]:
        """Remove and return every entry."""
        entries = list(self._entries.values())
        self._entries.clear()
        self.used_bytes = 0
        return entries

    def _check_invariants(self) -> None:
        """Raise :class:`~kvgov.exceptions.InternalError` if the byte count drifted (for tests)."""
        total = sum(info.nbytes for info, _v in self._entries.values())
        if total != self.used_bytes or total > self.capacity_bytes:
            raise InternalError(
                f"LRU index of tier {self._tier!r}: used_bytes={self.used_bytes}, "
                f"entries sum to {total}, capacity {self.capacity_bytes}"
            )
