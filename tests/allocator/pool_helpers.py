"""Shared helpers of the block pool tests: a tiny layout and ways to look at a pool."""

from __future__ import annotations

import torch

from kvgov.allocator import BlockPool, KVSpec

SPEC = KVSpec(num_layers=2, num_kv_heads=2, head_dim=4, block_size=4)


def make_pool(num_blocks: int = 8, **kwargs: object) -> BlockPool:
    return BlockPool(SPEC, num_blocks, **kwargs)  # type: ignore[arg-type]


def fill(pool: BlockPool, block_ids: list[int], value: float = 3.0) -> None:
    for b in block_ids:
        pool.block(b).fill_(value)


def is_zero(pool: BlockPool, block_id: int) -> bool:
    return not bool(pool.block(block_id).view(torch.uint8).any())


def snapshot(pool: BlockPool) -> tuple[object, ...]:
    n = pool.num_blocks
    return (
        pool.counts(),
        [pool.state(i) for i in range(n)],
        [pool.ref_count(i) for i in range(n)],
        [pool.key(i) for i in range(n)],
        list(pool._queue),
        pool._free[:],
    )


def cached_pool(keys: list[bytes], **kwargs: object) -> tuple[BlockPool, list[int]]:
    """A pool whose first len(keys) blocks are keyed and CACHED."""
    pool = make_pool(**kwargs)
    ids = pool.allocate(len(keys))
    pool.set_keys(ids, keys)
    pool.free(ids)
    pool.take_events()
    return pool, ids
