"""vLLM's free queue under the policy chooses what kvgov's own pool would.

A bare governed vLLM ``BlockPool`` is driven with random allocations, caches, hits
and frees by tenants at random priorities, with and without floors and caps; beside
it, kvgov's own :class:`~kvgov.allocator.quota.QuotaQueue` (the native pool's
eviction order) sees the same operations. Every allocation must evict the same
blocks, in the same order, for the same reasons, and the queue's invariants hold
after every step.
"""

from __future__ import annotations

import itertools
import random
from types import SimpleNamespace
from typing import Any

import pytest

from kvgov.allocator import BlocksEvicted, Quota
from kvgov.allocator.quota import CAP, QuotaQueue, check_quotas

pytestmark = pytest.mark.vllm

N = 64
TENANTS = ("a", "b", "c", "d")
QUOTAS = {
    "none": {},
    "caps": {"a": Quota(cap=10), "b": Quota(cap=4)},
    "floors": {"c": Quota(floor=12), "d": Quota(floor=6)},
    "both": {"a": Quota(cap=12), "b": Quota(floor=8, cap=16), "c": Quota(floor=10)},
}
_ids = itertools.count()


class Mirror:
    """The native order over the same blocks: QuotaQueue plus the set of free unhashed."""

    def __init__(self, quotas: dict[str, Quota]) -> None:
        names = sorted(quotas)
        self.gid = {t: i + 1 for i, t in enumerate(names)}
        self.group = [0] * N
        self.prio = bytearray(N)
        self.queue = QuotaQueue(self.group, N, {self.gid[t]: quotas[t] for t in names})

    def cached(self, ids: list[int], tenant: str, priority: int) -> list[tuple[str, list[int]]]:
        for b in ids:
            self.group[b] = self.gid.get(tenant, 0)
            self.prio[b] = priority
        self.queue.extend(ids, self.prio)
        g = self.gid.get(tenant, 0)
        excess = self.queue.excess(g) if g else 0
        return [(CAP, self.queue.take_own(g, excess))] if excess else []

    def allocate(self, n: int, free_unhashed: int, tenant: str) -> list[tuple[str, list[int]]]:
        short = n - min(n, free_unhashed)
        return self.queue.choose(short, self.gid.get(tenant, 0)) if short else []


def evicted(pool: Any) -> list[tuple[str, list[int]]]:
    out: list[tuple[str, list[int]]] = []
    for e in pool.kvgov_events:
        if isinstance(e, BlocksEvicted):
            if out and out[-1][0] == e.reason:
                out[-1][1].extend(e.block_ids)
            else:
                out.append((e.reason, list(e.block_ids)))
    pool.kvgov_events.clear()
    pool.kvgov_zero.clear()
    pool.kvgov_zero_owners.clear()
    pool.kvgov_open_free = None
    return out


@pytest.mark.parametrize("quotas", list(QUOTAS), ids=list(QUOTAS))
@pytest.mark.parametrize("seed", range(6))
def test_the_governed_queue_evicts_what_kvgovs_own_pool_would(quotas: str, seed: int) -> None:
    from vllm.v1.core.kv_cache_utils import BlockHash

    from kvgov.govern.vllm.pool import GovernedBlockPool

    rng = random.Random(seed)
    pool = GovernedBlockPool(N, True, 16)
    owners: list[Any] = [None] * N
    pool.kvgov_owner_table = owners
    queue = pool.kvgov_queue()
    pool.kvgov_set_quotas(check_quotas(QUOTAS[quotas], N))
    mirror = Mirror(QUOTAS[quotas])
    pending: dict[int, tuple[str, int]] = {}  # request -> tenant, priority (read by the hook)

    def keyed(request: Any, ids: list[int], first: int) -> None:
        tenant, priority = pending[request.kvgov_id]
        queue.kvgov_keyed(ids, priority, queue.kvgov_group(tenant), None)

    pool.kvgov_keyed = keyed
    running: list[tuple[list[Any], str, int, bool]] = []  # blocks, tenant, priority, cached
    for _ in range(400):
        if running and (rng.random() < 0.45 or pool.get_num_free_blocks() < 8):
            blocks, tenant, priority, keep = running.pop(rng.randrange(len(running)))
            pool.free_blocks(list(reversed(blocks)))
            freed = [b.block_id for b in reversed(blocks) if b.ref_cnt == 0]
            want = mirror.cached(freed, tenant, priority) if keep else []
            assert evicted(pool) == want
        elif rng.random() < 0.3:  # a hit on cached blocks of some tenant
            free = [b for b in mirror.queue if pool.blocks[b].ref_cnt == 0]
            if free:
                b = rng.choice(free)
                block = pool.blocks[b]
                pool.touch([block])
                mirror.queue.remove(b, mirror.prio[b])
                running.append(([block], _tenant_of(owners, b), mirror.prio[b], True))
        else:
            tenant = rng.choice(TENANTS)
            priority = rng.choice((10, 50, 50, 90))
            n = rng.randint(1, min(6, pool.get_num_free_blocks()))
            unhashed = pool.get_num_free_blocks() - len(mirror.queue)
            want = mirror.allocate(n, unhashed, tenant)
            queue.kvgov_allocating = queue.kvgov_group(tenant)
            blocks = pool.get_new_blocks(n)
            queue.kvgov_allocating = 0
            assert evicted(pool) == want
            for b in blocks:
                owners[b.block_id] = SimpleNamespace(tenant=tenant)
            keep = rng.random() < 0.8
            if keep:
                rid = next(_ids)
                pending[rid] = (tenant, priority)
                req = SimpleNamespace(
                    kvgov_id=rid,
                    block_hashes=[BlockHash(rng.randbytes(16)) for _ in blocks],
                    all_token_ids=[0] * 16 * len(blocks),
                    lora_request=None,
                )
                pool.cache_full_blocks(req, blocks, 0, len(blocks), 16, 0)
            running.append((blocks, tenant, priority, keep))
        queue.kvgov_check()
        assert sorted(mirror.queue) == sorted(
            b.block_id for b in pool.blocks if b.ref_cnt == 0 and b.block_hash is not None
        )


def _tenant_of(owners: list[Any], b: int) -> str:
    tenant: str = owners[b].tenant
    return tenant


def test_a_list_that_empties_and_refills_again_and_again_keeps_one_current_heap_entry() -> None:
    """A tenant's list that hits empty and frees refill, over and over (no allocation
    in between to clean the heap), leaves stale heap entries; the heap is rebuilt from
    the lists' heads (its blocks there) before they outnumber them."""
    from vllm.v1.core.kv_cache_utils import BlockHash

    from kvgov.govern.vllm.pool import GovernedBlockPool

    pool = GovernedBlockPool(N, True, 16)
    owners: list[Any] = [None] * N
    pool.kvgov_owner_table = owners
    queue = pool.kvgov_queue()
    pool.kvgov_set_quotas(check_quotas({"a": Quota(cap=40), "b": Quota(floor=2)}, N))
    pending: dict[int, str] = {}
    pool.kvgov_keyed = lambda request, ids, first: queue.kvgov_keyed(
        ids, 10, queue.kvgov_group(pending[request.kvgov_id]), None
    )

    def cache(tenant: str, n: int) -> list[Any]:
        blocks = pool.get_new_blocks(n)
        for b in blocks:
            owners[b.block_id] = SimpleNamespace(tenant=tenant)
        rid = next(_ids)
        pending[rid] = tenant
        req = SimpleNamespace(
            kvgov_id=rid,
            block_hashes=[BlockHash(f"{rid}-{j}".encode()) for j in range(n)],
            all_token_ids=[0] * 16 * n,
            lora_request=None,
        )
        pool.cache_full_blocks(req, blocks, 0, n, 16, 0)
        pool.free_blocks(list(reversed(blocks)))
        return blocks

    cache("a", 8)  # tenant a holds blocks at the same priority throughout
    (block,) = cache("b", 1)
    for _ in range(200):
        pool.touch([block])  # a hit: b's list is empty
        pool.free_blocks([block])  # and holds its block again
        queue.kvgov_check()
    evicted(pool)
    pool.get_new_blocks(pool.get_num_free_blocks())
    queue.kvgov_check()
