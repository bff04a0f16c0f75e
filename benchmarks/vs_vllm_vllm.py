"""The vLLM side of bench_vs_vllm.py: vLLM 0.33.0's block pool and prefix hashing.

Runs only inside the vLLM venv, as a worker subprocess (``bench_vs_vllm.py
--vllm-worker``) answering JSON-line commands. It imports nothing of kvgov, but for
the policy workloads (``evict_policy``, ``alloc_policy``), whose governed modes are
vLLM's pool under kvgov's binding (:class:`kvgov.govern.vllm.pool.GovernedBlockPool`
and its free queue): those import this checkout's kvgov when first run.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
import traceback
from typing import Any

from vs_vllm_common import (
    ALLOC_N,
    BLOCK,
    DEFAULT_PRIORITY,
    NUM_BLOCKS,
    POLICY_CAP,
    POLICY_FLOOR,
    POLICY_MODES,
    POLICY_TENANTS,
    PROMPT_BLOCKS,
    REPO,
    fresh_tokens,
    policy_chunks,
    policy_request,
    read_tokens,
    steady_sum,
    unique_keys,
)

#: the policy workloads' modes on vLLM's pool: vLLM's own, then governed under each policy
VLLM_POLICY_MODES = ("stock", *POLICY_MODES)


class _Cached:
    """What cache_full_blocks reads of a request (hashes), and what the binding's keyed
    hook reads of it here (tenant, priority); untimed setup of the policy workloads."""

    __slots__ = ("block_hashes", "priority", "tenant")

    def __init__(self, hashes: list[bytes], tenant: str, priority: int) -> None:
        self.block_hashes = hashes
        self.tenant = tenant
        self.priority = priority


class _PolicyPool:
    """One pool of the policy workloads: vLLM's or governed, its next allocation and key."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.governed = mode != "stock"
        self.serial = 0
        self.key = 0
        self.owners: list[Any] = [None] * (NUM_BLOCKS + 1)
        self.scopes = {f"t{t}": _Scope(f"t{t}") for t in range(POLICY_TENANTS)}
        if mode == "stock":
            from vllm.v1.core.block_pool import BlockPool

            self.pool: Any = BlockPool(NUM_BLOCKS + 1, True, BLOCK)
            return
        if str(REPO) not in sys.path:
            sys.path.insert(0, str(REPO))  # this checkout's kvgov
        from kvgov.allocator import Quota
        from kvgov.allocator.quota import check_quotas
        from kvgov.govern.vllm.pool import GovernedBlockPool

        pool = self.pool = GovernedBlockPool(NUM_BLOCKS + 1, True, BLOCK)
        pool.kvgov_owner_table = self.owners
        pool.kvgov_keyed = self._keyed
        if mode == "quotas":
            quota = Quota(floor=POLICY_FLOOR, cap=POLICY_CAP)
            quotas = {f"t{t}": quota for t in range(POLICY_TENANTS)}
            pool.kvgov_set_quotas(check_quotas(quotas, NUM_BLOCKS + 1))

    def _keyed(self, request: Any, ids: list[int], first: int = 0) -> None:
        """The binding's keyed hook (VllmGovernance._keyed, without retention)."""
        pool = self.pool
        queue = pool.kvgov_governed
        if queue is None:
            if request.priority == DEFAULT_PRIORITY:
                return  # the default policy: vLLM's queue, vLLM's order
            queue = pool.kvgov_queue()
        queue.kvgov_keyed(ids, request.priority, queue.kvgov_group(request.tenant), None)

    def allocating(self, tenant: str) -> Any:
        """The binding's allocating(): the tenant's quota group, where quotas are in force;
        returns the queue to reset afterwards (None: nothing to reset)."""
        queue = self.pool.kvgov_governed
        if queue is None or not queue.kvgov_quotas:
            return None
        queue.kvgov_allocating = queue.kvgov_group(tenant)
        return queue

    def owned(self, blocks: list[Any], tenant: str) -> None:
        """The binding's bookkeeping after an allocation and a step (untimed): the owner
        table, and the pool's reports, which the governor drains every step."""
        if not self.governed:
            return
        scope = self.scopes[tenant]
        owners = self.owners
        for b in blocks:
            owners[b.block_id] = scope
        self.drain()

    def drain(self) -> None:
        if not self.governed:
            return
        pool = self.pool
        pool.kvgov_events.clear()
        pool.kvgov_zero.clear()
        pool.kvgov_zero_owners.clear()
        pool.kvgov_open_free = None


class _Scope:
    """What the binding's owner table holds per block, as far as the pool reads it."""

    __slots__ = ("tenant",)

    def __init__(self, tenant: str) -> None:
        self.tenant = tenant


class VllmSide:
    """vLLM 0.33.0's block pool and prefix hashing; runs inside the vLLM venv only."""

    def __init__(self) -> None:
        import torch
        import vllm
        from vllm.sampling_params import SamplingParams
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.block_pool import BlockPool
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.core.single_type_kv_cache_manager import FullAttentionManager
        from vllm.v1.kv_cache_interface import FullAttentionSpec
        from vllm.v1.request import Request

        self.version = vllm.__version__
        hash_fn = get_hash_fn_by_name("sha256")  # vLLM's default prefix_caching_hash_algo
        init_none_hash(hash_fn)
        self.hasher = get_request_block_hasher(BLOCK, hash_fn)
        self.BlockPool = BlockPool
        self.Request = Request
        self.params = SamplingParams(max_tokens=1)
        self.spec = FullAttentionSpec(
            block_size=BLOCK, num_kv_heads=1, head_size=8, dtype=torch.float16
        )
        self.find = FullAttentionManager.find_longest_cache_hit
        self._serial = 0
        self._gpool: Any = None
        self._epool: Any = None
        self._ekeys = 0
        self._policy: dict[str, dict[str, _PolicyPool]] = {}

    def info(self) -> dict[str, Any]:
        return {"vllm": self.version}

    def _pool(self) -> Any:
        return self.BlockPool(NUM_BLOCKS + 1, True, BLOCK)  # + the null block

    def _request(self, tokens: list[int], hashed: bool = False) -> Any:
        self._serial += 1
        return self.Request(
            f"r{self._serial}",
            tokens,
            self.params,
            None,
            block_hasher=self.hasher if hashed else None,
        )

    def _find(self, pool: Any, request: Any) -> list[Any]:
        (hits,), _ = self.find(
            request.block_hashes,
            max(request.num_tokens - 1, 0),
            [0],
            pool,
            self.spec,
            False,
            BLOCK,
        )
        return hits  # type: ignore[no-any-return]

    def _serve(self, pool: Any, request: Any) -> int:
        """vLLM's ungoverned path for one request: hash, lookup, allocate, cache, free."""
        request.block_hashes.extend(self.hasher(request))  # Request.update_block_hashes
        n = request.num_tokens
        hits = self._find(pool, request)
        pool.touch(hits)
        table = hits + pool.get_new_blocks(-(-n // BLOCK) - len(hits))
        pool.cache_full_blocks(request, table, len(hits), n // BLOCK, BLOCK, 0)
        pool.free_blocks(reversed(table))
        return len(hits)

    # ------------------------------------------------------------------ workloads

    def alloc_free(self, iters: int) -> dict[str, float]:
        pool = self._pool()
        get, free = pool.get_new_blocks, pool.free_blocks
        for _ in range(100):
            free(reversed(get(ALLOC_N)))
        gc.collect()
        start = time.perf_counter()
        for _ in range(iters):
            blocks = get(ALLOC_N)
            free(reversed(blocks))
        seconds = time.perf_counter() - start
        return {"alloc_free": seconds / (iters * ALLOC_N) * 1e6}

    def prefix(self, iters: int) -> dict[str, float]:
        pool = self._pool()
        hasher = self.hasher
        t_hash = t_cache = t_find = t_touch = 0.0
        hit_blocks = 0
        for i in range(iters + 2):
            tokens = fresh_tokens(self._next())
            first = self._request(tokens)
            t0 = time.perf_counter()
            first.block_hashes.extend(hasher(first))
            t1 = time.perf_counter()
            blocks = pool.get_new_blocks(PROMPT_BLOCKS)
            t2 = time.perf_counter()
            pool.cache_full_blocks(first, blocks, 0, PROMPT_BLOCKS, BLOCK, 0)
            t3 = time.perf_counter()
            pool.free_blocks(reversed(blocks))
            second = self._request(tokens, hashed=True)
            t4 = time.perf_counter()
            hits = self._find(pool, second)
            t5 = time.perf_counter()
            pool.touch(hits)
            t6 = time.perf_counter()
            pool.free_blocks(reversed(hits))
            if i < 2:  # warm-up
                continue
            t_hash += t1 - t0
            t_cache += t3 - t2
            t_find += t5 - t4
            t_touch += t6 - t5
            hit_blocks += len(hits)
        if hit_blocks != iters * (PROMPT_BLOCKS - 1):
            raise RuntimeError(f"vLLM lookup found {hit_blocks} blocks")
        per = iters * PROMPT_BLOCKS
        return {
            "key_derivation": t_hash / per * 1e6,
            "cache_blocks": t_cache / per * 1e6,
            "lookup": (t_find + t_touch) / hit_blocks * 1e6,
            "find_only": t_find / hit_blocks * 1e6,
        }

    def _next(self) -> int:
        self._serial += 1
        return self._serial

    def evict(self, iters: int) -> dict[str, float]:
        class Hashed:  # what cache_full_blocks reads of a request (untimed setup only)
            __slots__ = ("block_hashes",)

            def __init__(self, hashes: list[bytes]) -> None:
                self.block_hashes = hashes

        if self._epool is None:
            pool = self._pool()
            blocks = pool.get_new_blocks(NUM_BLOCKS)
            pool.cache_full_blocks(
                Hashed(unique_keys(0, NUM_BLOCKS)), blocks, 0, NUM_BLOCKS, BLOCK, 0
            )
            pool.free_blocks(reversed(blocks))
            self._epool, self._ekeys = pool, NUM_BLOCKS
        pool = self._epool
        keys = unique_keys(self._ekeys, (iters + 10) * ALLOC_N)
        self._ekeys += len(keys)
        gc.collect()
        seconds = 0.0
        for i in range(iters + 10):
            t0 = time.perf_counter()
            blocks = pool.get_new_blocks(ALLOC_N)
            t1 = time.perf_counter()
            if i >= 10:
                seconds += t1 - t0
            if blocks[0].block_hash is not None:
                raise RuntimeError("vLLM evict: allocation returned a cached block")
            pool.cache_full_blocks(
                Hashed(keys[i * ALLOC_N : (i + 1) * ALLOC_N]), blocks, 0, ALLOC_N, BLOCK, 0
            )
            pool.free_blocks(reversed(blocks))
        return {"evict": seconds / (iters * ALLOC_N) * 1e6}

    # ------------------------------------------------------------------ eviction as policy

    def _policy_pools(self, kind: str) -> dict[str, _PolicyPool]:
        """The pools of a policy workload, one per mode, built on first use: full of
        cached blocks (``evict``) or half full (``alloc``), each allocation's blocks at
        its mode's priority and tenant (vs_vllm_common.policy_request)."""
        pools = self._policy.get(kind)
        if pools is None:
            pools = self._policy[kind] = {}
            for mode in VLLM_POLICY_MODES:
                st = pools[mode] = _PolicyPool(mode)
                n = NUM_BLOCKS if kind == "evict" else NUM_BLOCKS // 2
                # fill it, then (evict) turn it over once more: every mode in its steady state
                steps = n // ALLOC_N * (2 if kind == "evict" else 1)
                keys = unique_keys(0, steps * ALLOC_N)
                for s in range(steps):
                    self._policy_step(st, keys[s * ALLOC_N : (s + 1) * ALLOC_N])
                st.key = steps * ALLOC_N
        return pools

    def _policy_step(self, st: _PolicyPool, keys: list[bytes]) -> tuple[float, float]:
        """One allocation of 16 (evicting, on a full pool), then caching and freeing them;
        returns the seconds of each half."""
        tenant, priority = policy_request(st.serial, st.mode)
        st.serial += 1
        pool = st.pool
        t0 = time.perf_counter()
        queue = st.allocating(tenant) if st.governed else None
        blocks = pool.get_new_blocks(ALLOC_N)
        if queue is not None:
            queue.kvgov_allocating = 0
        t1 = time.perf_counter()
        st.owned(blocks, tenant)
        t2 = time.perf_counter()
        pool.cache_full_blocks(_Cached(keys, tenant, priority), blocks, 0, ALLOC_N, BLOCK, 0)
        pool.free_blocks(reversed(blocks))
        t3 = time.perf_counter()
        st.drain()
        return t1 - t0, t3 - t2

    def evict_policy(self, iters: int) -> dict[str, float]:
        """evict under each policy: get_new_blocks(16) on a full pool (each evicts 16) as
        ``evict_<mode>``, caching and freeing the 16 as ``refill_<mode>``; the modes
        take turns (policy_chunks)."""
        pools = self._policy_pools("evict")
        evict = dict.fromkeys(VLLM_POLICY_MODES, 0.0)
        refill = dict.fromkeys(VLLM_POLICY_MODES, 0.0)
        gc.collect()
        for mode, n in policy_chunks(VLLM_POLICY_MODES, iters):
            st = pools[mode]
            keys = unique_keys(st.key, n * ALLOC_N)
            st.key += n * ALLOC_N
            steps = [self._policy_step(st, keys[j * ALLOC_N : (j + 1) * ALLOC_N]) for j in range(n)]
            evict[mode] += steady_sum([te for te, _ in steps])
            refill[mode] += steady_sum([tr for _, tr in steps])
        for st in pools.values():
            if st.pool.get_num_free_blocks() != NUM_BLOCKS:
                raise RuntimeError("vLLM evict_policy: a pool holds blocks")
        per = iters * ALLOC_N / 1e6
        out = {f"evict_{m}": evict[m] / per for m in VLLM_POLICY_MODES}
        out.update({f"refill_{m}": refill[m] / per for m in VLLM_POLICY_MODES})
        return out

    def alloc_policy(self, iters: int) -> dict[str, float]:
        """alloc_free under each policy: get_new_blocks(16) + free_blocks on a pool half
        full of cached blocks (nothing evicted), as ``alloc_free_<mode>``."""
        pools = self._policy_pools("alloc")
        spent = dict.fromkeys(VLLM_POLICY_MODES, 0.0)
        gc.collect()
        for mode, n in policy_chunks(VLLM_POLICY_MODES, iters):
            st = pools[mode]
            pool = st.pool
            get, free = pool.get_new_blocks, pool.free_blocks
            spans: list[float] = []
            for _ in range(n):
                tenant, _priority = policy_request(st.serial, mode)
                st.serial += 1
                t0 = time.perf_counter()
                queue = st.allocating(tenant) if st.governed else None
                blocks = get(ALLOC_N)
                if queue is not None:
                    queue.kvgov_allocating = 0
                free(reversed(blocks))
                spans.append(time.perf_counter() - t0)
                st.drain()
            spent[mode] += steady_sum(spans)
        per = iters * ALLOC_N / 1e6
        return {f"alloc_free_{m}": spent[m] / per for m in VLLM_POLICY_MODES}

    def _governed_pool(self) -> Any:
        if self._gpool is None:
            pool = self._pool()
            for _ in range(NUM_BLOCKS // PROMPT_BLOCKS + 2):  # fill it with cached blocks
                self._serve(pool, self._request(fresh_tokens(self._next())))
            self._gpool = pool
        return self._gpool

    def _timed_serve(self, pool: Any, requests: list[Any]) -> tuple[float, int]:
        """Seconds to serve the requests one after another, and the blocks they hit."""
        serve = self._serve
        gc.collect()
        start = time.perf_counter()
        hits = 0
        for request in requests:
            hits += serve(pool, request)
        return time.perf_counter() - start, hits

    def governed_miss(self, iters: int) -> dict[str, float]:
        pool = self._governed_pool()
        requests = [self._request(fresh_tokens(self._next())) for _ in range(iters)]
        seconds, hits = self._timed_serve(pool, requests)
        if hits:
            raise RuntimeError("vLLM governed_miss: a fresh prompt hit")
        return {"governed_miss": seconds / (iters * PROMPT_BLOCKS) * 1e6}

    def governed_hit(self, iters: int) -> dict[str, float]:
        pool = self._governed_pool()
        tokens = fresh_tokens(self._next())
        self._serve(pool, self._request(tokens))
        requests = [self._request(tokens) for _ in range(iters)]
        seconds, hits = self._timed_serve(pool, requests)
        if hits != iters * (PROMPT_BLOCKS - 1):
            raise RuntimeError(f"vLLM governed_hit: {hits} hits")
        return {"governed_hit": seconds / (iters * PROMPT_BLOCKS) * 1e6}

    def replay(self, path: str) -> dict[str, float]:
        data, lengths = read_tokens(path)
        pool = self._pool()
        serve = self._serve
        limit = NUM_BLOCKS * BLOCK
        hit = prompt = blocks = skipped = done = 0
        seconds = 0.0
        pos = 1
        gc.collect()
        for n in lengths:
            tokens = data[pos + 1 : pos + 1 + n].tolist()
            pos += 1 + n
            if n > limit:
                skipped += 1
                continue
            request = self._request(tokens)
            t0 = time.perf_counter()
            hits = serve(pool, request)
            seconds += time.perf_counter() - t0
            hit += hits * BLOCK
            prompt += n
            blocks += -(-n // BLOCK)
            done += 1
        return {
            "replay": seconds / blocks * 1e6,
            "hit_tokens": hit,
            "prompt_tokens": prompt,
            "requests": done,
            "skipped": skipped,
            "blocks": blocks,
        }


def worker_main() -> None:
    """The vLLM side: answer JSON-line commands on stdin; nothing of kvgov is imported."""
    channel = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # whatever vLLM prints goes to stderr, not into the protocol
    try:
        side = VllmSide()
    except Exception:
        channel.write(json.dumps({"ok": False, "error": traceback.format_exc()}) + "\n")
        return
    channel.write(json.dumps({"ok": True, "result": side.info()}) + "\n")
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        try:
            result = getattr(side, cmd["op"])(*cmd["args"])
            reply = {"ok": True, "result": result}
        except Exception:
            reply = {"ok": False, "error": traceback.format_exc()}
        channel.write(json.dumps(reply) + "\n")
