"""The host-memory tier: sealed blocks in this process's RAM, LRU within a byte capacity.

Where CUDA is present the ciphertext is kept in page-locked (pinned) host memory,
the memory a GPU copies from by DMA and which the OS never swaps to disk; elsewhere
the sealed bytes are kept as they are. The choice is made once, at construction.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable

from .objects import ObjectInfo, SealedBlock
from .tier import LruIndex, TierUsage, check_capacity, check_tier_name

__all__ = ["HostMemoryTier"]


def _as_is(obj: SealedBlock) -> SealedBlock:
    return obj


def _pinned_copy(obj: SealedBlock) -> SealedBlock:
    import torch

    buf = torch.empty(len(obj.ciphertext), dtype=torch.uint8, pin_memory=True)
    view = memoryview(buf.numpy()).cast("B")  # type: ignore[arg-type]
    view[:] = obj.ciphertext
    return dataclasses.replace(obj, ciphertext=view)


def _cuda_available() -> bool:
    import torch

    return bool(torch.cuda.is_available())


class HostMemoryTier:
    """Sealed blocks in host memory; least recently used evicted first. Thread-safe.

    Args:
        capacity_bytes: most bytes held (headers and ciphertext).
        name: the tier's name, bound into every object's AAD.
        pin_memory: keep ciphertext in pinned memory; None (default) pins where CUDA is
            available.

    Raises:
        InvalidOffloadArgument: a non-positive capacity or a bad name.
    """

    def __init__(
        self, capacity_bytes: int, *, name: str = "host", pin_memory: bool | None = None
    ) -> None:
        self._name = check_tier_name(name)
        self._index: LruIndex[SealedBlock] = LruIndex(name, check_capacity(capacity_bytes))
        self._lock = threading.Lock()
        self._pinned = _cuda_available() if pin_memory is None else bool(pin_memory)
        self._adopt: Callable[[SealedBlock], SealedBlock] = _pinned_copy if self._pinned else _as_is

    def __repr__(self) -> str:
        return f"HostMemoryTier(name={self._name!r}, capacity_bytes={self.capacity_bytes})"

    @property
    def name(self) -> str:
        """The tier's name."""
        return self._name

    @property
    def capacity_bytes(self) -> int:
        """Most bytes held."""
        return self._index.capacity_bytes

    @property
    def pinned(self) -> bool:
        """Whether ciphertext is kept in pinned memory."""
        return self._pinned

    def put(self, obj: SealedBlock, now_us: int) -> list[ObjectInfo]:
        """Store ``obj``, evicting LRU objects to fit; returns the evicted ones."""
        info = obj.info()
        kept = self._adopt(obj)
        with self._lock:
            removed = self._index.make_room(obj.block_key, info.nbytes)
            self._index.add(info, kept)
        return [i for i, _o in removed if i.block_key != obj.block_key]

    def get(self, block_key: bytes) -> SealedBlock | None:
        """The object under ``block_key`` (now most recently used), or None."""
        with self._lock:
            return self._index.get(block_key)

    def delete(self, block_key: bytes) -> ObjectInfo | None:
        """Drop the object under ``block_key``; returns its info, or None."""
        with self._lock:
            entry = self._index.pop(block_key)
        return None if entry is None else entry[0]

    def delete_by_tenant(self, tenant: str) -> list[ObjectInfo]:
        """Drop every object of ``tenant``."""
        return self.delete_where(lambda info: info.tenant == tenant)

    def delete_where(self, predicate: Callable[[ObjectInfo], bool]) -> list[ObjectInfo]:
        """Drop every object whose info satisfies ``predicate``."""
        with self._lock:
            return [info for info, _o in self._index.pop_where(predicate)]

    def list_expired(self, now_us: int) -> list[ObjectInfo]:
        """Objects whose deadline is at or before ``now_us``."""
        with self._lock:
            return self._index.expired(now_us)

    def usage(self) -> TierUsage:
        """Bytes and objects held."""
        with self._lock:
            return TierUsage(self._index.used_bytes, len(self._index))

    def close(self) -> None:
        """Drop every object."""
        with self._lock:
            self._index.clear()

    def _check_invariants(self) -> None:
        """Raise InternalError if the byte accounting drifted (tests call it)."""
        with self._lock:
            self._index._check_invariants()
