"""The two protocols through which the governor sees a block pool.

A pool is either *observed* or *driven*:

* :class:`ObservedPool` is all the governor needs of a pool whose engine runs it
  (vLLM's scheduler allocates, looks up, keys and frees blocks in its own
  ``BlockPool``): what it holds (``states``, ``counts``, ``read_back_zero``),
  what happened (``take_events``), and the two calls erasure and retention
  make on it (``evict``, ``revoke``). The
  :class:`~kvgov.govern.governor.Governor` is typed on it, so it runs on
  either kind. vLLM's pool satisfies it through
  :class:`~kvgov.govern.vllm.pool.VllmPoolAdapter`.
* :class:`DrivenPool` adds what a binding that runs its pool itself calls:
  ``allocate``, ``free``, ``lookup``, ``set_keys``. kvgov's own
  :class:`~kvgov.allocator.BlockPool` satisfies it as it is; its binding,
  :class:`~kvgov.govern.cache.GovernedKVCache`, looks prefixes up
  (:class:`~kvgov.govern.hits.HitFinder`) and keys blocks through it.

Neither reaches past the pool: no tensors, no free queues, no engine internals.

What a pool promises:

* block ids are ints in ``0..num_blocks-1``;
* every block that leaves an owner (evicted, freed unkeyed, revoked) is
  zeroized, or ordered zeroized where the bytes live elsewhere (another
  process), and reported in a :class:`~kvgov.allocator.BlocksZeroized` event;
* ``take_events`` returns what happened since the last call, in order, with
  the event types of :mod:`kvgov.allocator.events`; the governor drains them
  after every call that can emit;
* (driven) ``allocate`` hands out only zeroed blocks, ``lookup`` takes a
  reference on each block it returns and stops at the first miss, ``free``
  drops one reference per id and caches a keyed block on its last reference.

Offload (:mod:`kvgov.govern.offloading`) needs two things more of a driven
pool, so they are a protocol of their own, :class:`OffloadablePool`; a binding
whose pool lacks them runs without offload tiers:

* ``set_eviction_observer`` shows every batch of evicted blocks (ids, keys,
  reason, and their bytes) to an observer before the batch is zeroized, in
  the same call that evicts it (see :mod:`kvgov.allocator.observer`); the
  observer runs inside the pool call and must not call the pool;
* ``block`` gives a writable view of one block, which a restore decrypts into.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

from kvgov.allocator import (
    BlockState,
    EvictionObserver,
    PoolCounts,
    PoolEvent,
    Quota,
    Revoked,
)

from .scope import CacheScope

__all__ = ["DrivenPool", "ObservedPool", "OffloadablePool", "RunningSequence"]


class ObservedPool(Protocol):
    """A block pool the governor observes: its engine allocates, looks up and frees.

    See the module docstring for its promises.
    """

    @property
    def num_blocks(self) -> int:
        """Blocks in the pool."""
        ...

    @property
    def bytes_per_block(self) -> int:
        """Bytes of KV one block holds (what a zeroization clears)."""
        ...

    def evict(self, block_ids: Iterable[int], reason: str) -> list[int]:
        """Evict and zeroize the CACHED blocks among ``block_ids``; others are left alone."""
        ...

    def revoke(self, block_ids: Iterable[int], reason: str) -> Revoked:
        """Evict the CACHED blocks among ``block_ids``, unindex the OWNED keyed ones."""
        ...

    def states(self, block_ids: Sequence[int]) -> list[BlockState]:
        """Per block, its state now (stats, invariant checks)."""
        ...

    def counts(self) -> PoolCounts:
        """Blocks in each state."""
        ...

    def read_back_zero(self, block_ids: Sequence[int]) -> bool | None:
        """Whether the blocks read back all zero; None where this process cannot read them."""
        ...

    def take_events(self) -> list[PoolEvent]:
        """Events since the last call, oldest first."""
        ...


class DrivenPool(ObservedPool, Protocol):
    """A block pool its binding drives: allocate, free, lookup and key blocks itself."""

    def allocate(self, n: int, *, group: str | None = None) -> list[int]:
        """Hand out ``n`` zeroed blocks for ``group`` (the tenant), evicting cached ones
        if needed (in quota order where the pool has quotas); OutOfBlocks if not."""
        ...

    def free(self, block_ids: Iterable[int], *, cache: bool = True) -> None:
        """Drop one reference per id; a keyed block's last one caches it if ``cache``."""
        ...

    def lookup(self, keys: Iterable[bytes]) -> list[int]:
        """The blocks of the longest leading run of ``keys`` that hit, each with a reference."""
        ...

    def set_keys(
        self,
        block_ids: Sequence[int],
        keys: Sequence[bytes],
        *,
        priority: int,
        duration: float | None = None,
        group: str | None = None,
    ) -> list[bool]:
        """Key OWNED blocks at an eviction ``priority`` that decays to the default after
        ``duration`` seconds, counted against ``group``'s quota (the tenant); per block,
        whether its key was indexed (False: a duplicate)."""
        ...


@runtime_checkable
class QuotaPool(Protocol):
    """A pool whose eviction choice honours per-tenant floors and caps
    (:mod:`kvgov.allocator.quota`): the governor hands it the quotas of its ledger."""

    def set_quotas(self, quotas: Mapping[str, Quota] | None) -> None:
        """Replace every tenant's floor and cap (None or empty: none); InvalidQuota if
        they do not fit the pool (nothing changed)."""
        ...


@runtime_checkable
class OffloadablePool(DrivenPool, Protocol):
    """A driven pool whose evicted blocks can go to offload tiers (see the module docstring)."""

    def set_eviction_observer(self, observer: EvictionObserver | None) -> None:
        """Show each batch of evicted blocks to ``observer`` before zeroizing it (None: stop)."""
        ...

    def block(self, block_id: int) -> Any:
        """A writable, contiguous view of one block's bytes (a torch tensor)."""
        ...


class RunningSequence(Protocol):
    """What the governor needs of a binding's running sequence (purge, invalidation)."""

    @property
    def seq_id(self) -> str:
        """The caller's id."""
        ...

    @property
    def scope(self) -> CacheScope:
        """The scope it was admitted under."""
        ...

    #: Whether its full blocks may still be cached at release; erasure clears it.
    cacheable: bool
