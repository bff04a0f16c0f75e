"""The fence's batch accessors agree with its per-block one (``block_hash``) on vLLM's own blocks.

The governed pool's post-passes (what vLLM hands out, caches and frees) read every
block's hash through them; a block they missed would leave its owner without a
zeroing order, so each is checked against the per-block accessor on the same blocks.
"""

from __future__ import annotations

from typing import Any

import pytest

pytestmark = pytest.mark.vllm


def _blocks(n: int) -> list[Any]:
    from vllm.v1.core.kv_cache_utils import KVCacheBlock, make_block_hash_with_group_id

    blocks = [KVCacheBlock(i) for i in range(n)]
    for b in blocks[1::3]:  # every third block cached
        b.set_block_hash(make_block_hash_with_group_id(b"h%d" % b.block_id, 0))
    return blocks


@pytest.mark.parametrize("with_extra", [False, True])
def test_hashed_ahead_is_the_hashed_among_the_next_blocks_of_the_free_queue(
    with_extra: bool,
) -> None:
    from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue

    from kvgov.govern.vllm import fence

    blocks = _blocks(40)
    queue = FreeKVCacheBlockQueue(list(blocks))
    # a block cached under a second hash only (vLLM's cached_block_hashes_by_block)
    extra = {3: object()} if with_extra else {}
    ahead = blocks[:25]
    expected = [b for b in ahead if fence.block_hash(b) is not None or b.block_id in extra]
    assert fence.hashed_ahead(queue, 25, extra) == expected
    assert (blocks[3] in expected) == with_extra
    assert blocks[37] not in fence.hashed_ahead(queue, 25, extra)  # beyond n: not looked at


def test_hashed_block_ids_leaves_out_the_unhashed_and_the_null_block() -> None:
    from kvgov.govern.vllm import fence

    blocks = _blocks(12)
    blocks[4].is_null = True  # hashed, but vLLM's placeholder
    assert fence.hashed_block_ids(blocks) == [1, 7, 10]


def test_split_freed_keeps_the_unreferenced_of_this_pool() -> None:
    from kvgov.govern.vllm import fence

    pool, other = object(), object()
    blocks = _blocks(12)
    blocks[2].ref_cnt = 1  # still held
    blocks[7].ref_cnt = 1
    blocks[10].pool = other  # another pool's: it reports its own
    blocks[5].pool = pool  # this pool's, named
    blocks[0].is_null = True
    cached, unhashed = fence.split_freed(blocks, pool)
    assert cached == [1, 4]
    assert unhashed == [3, 5, 6, 8, 9, 11]
    for i in cached:
        assert fence.block_hash(blocks[i]) is not None
    for i in unhashed:
        assert fence.block_hash(blocks[i]) is None
