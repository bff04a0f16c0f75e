"""The paged KV block pool: layout, refcounts, prefix index, eviction, batched zeroization.

Knows nothing of tenants, policy or audit: it emits typed events that the
govern layer drains (:meth:`BlockPool.take_events`).
"""

from kvgov.allocator.device import resolve_device
from kvgov.allocator.events import (
    BlocksAllocated,
    BlocksCached,
    BlocksEvicted,
    BlocksHit,
    BlocksKeyed,
    BlocksZeroized,
    PoolEvent,
)
from kvgov.allocator.eviction import EvictionQueue
from kvgov.allocator.metadata import BlockState
from kvgov.allocator.observer import EvictedBlocks, EvictionObserver
from kvgov.allocator.pool import BlockPool, PoolCounts, Revoked
from kvgov.allocator.quota import PRESSURE_REASONS, Quota
from kvgov.allocator.sizing import (
    Capacity,
    blocks_in_bytes,
    capacity,
    concurrent_sequences,
    tokens_in_bytes,
)
from kvgov.allocator.spec import KVSpec

__all__ = [
    "PRESSURE_REASONS",
    "BlockPool",
    "BlockState",
    "BlocksAllocated",
    "BlocksCached",
    "BlocksEvicted",
    "BlocksHit",
    "BlocksKeyed",
    "BlocksZeroized",
    "Capacity",
    "EvictedBlocks",
    "EvictionObserver",
    "EvictionQueue",
    "KVSpec",
    "PoolCounts",
    "PoolEvent",
    "Quota",
    "Revoked",
    "blocks_in_bytes",
    "capacity",
    "concurrent_sequences",
    "resolve_device",
    "tokens_in_bytes",
]
