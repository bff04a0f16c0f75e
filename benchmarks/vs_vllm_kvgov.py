"""The kvgov side of bench_vs_vllm.py: the same workloads on kvgov's pool and cache."""

from __future__ import annotations

import gc
import secrets
import time
from pathlib import Path
from typing import Any

from vs_vllm_common import (
    ALLOC_N,
    BLOCK,
    NUM_BLOCKS,
    POLICY_CAP,
    POLICY_FLOOR,
    POLICY_MODES,
    POLICY_TENANTS,
    PROMPT,
    PROMPT_BLOCKS,
    fresh_tokens,
    policy_chunks,
    policy_request,
    steady_sum,
    unique_keys,
)


class _PolicyPool:
    """One pool of the policy workloads: the pool, its next allocation and next key."""

    __slots__ = ("key", "pool", "serial")

    def __init__(self, pool: Any, serial: int, key: int) -> None:
        self.pool = pool
        self.serial = serial
        self.key = key


class KvgovSide:
    """kvgov's pool, key derivation and governed cache; runs in this process."""

    def __init__(self, workdir: Path) -> None:
        from kvgov.allocator import BlockPool
        from kvgov.govern import GovernedKVCache
        from kvgov.govern.keys import KeyDeriver, namespace_root, pack_tokens, scope_digest
        from kvgov.govern.replay import replay_spec, trace_scope

        self.BlockPool = BlockPool
        self.GovernedKVCache = GovernedKVCache
        self.pack_tokens = pack_tokens
        self.spec = replay_spec(BLOCK)
        self.scope = trace_scope("tenant-0")
        self.deriver = KeyDeriver(secrets.token_bytes(32))
        self.root = namespace_root("tenant", self.scope.tenant)
        self.digest = scope_digest(self.scope)
        self.workdir = workdir
        self._serial = 0
        self._gcache: Any = None
        self._epool: Any = None
        self._ekeys = 0
        self._policy: dict[str, dict[str, _PolicyPool]] = {}

    def _next(self) -> int:
        self._serial += 1
        return self._serial

    def _pool(self) -> Any:
        return self.BlockPool(self.spec, NUM_BLOCKS)

    def _create_cache(self, name: str) -> Any:
        return self.GovernedKVCache.create(
            spec=self.spec,
            num_blocks=NUM_BLOCKS,
            audit_url=f"sqlite:///{self.workdir / name}",
            ephemeral_secret=True,
        )

    # ------------------------------------------------------------------ workloads

    def alloc_free(self, iters: int) -> dict[str, float]:
        pool = self._pool()
        allocate, free, take = pool.allocate, pool.free, pool.take_events
        for _ in range(100):
            free(allocate(ALLOC_N)[::-1])
            take()
        gc.collect()
        start = time.perf_counter()
        for _ in range(iters):
            ids = allocate(ALLOC_N)
            free(ids[::-1])
            take()
        seconds = time.perf_counter() - start
        pool.close()
        return {"alloc_free": seconds / (iters * ALLOC_N) * 1e6}

    def prefix(self, iters: int) -> dict[str, float]:
        pool = self._pool()
        derive, pack = self.deriver.derive_chain, self.pack_tokens
        root, digest = self.root, self.digest
        max_hit = (PROMPT - 1) // BLOCK
        t_key = t_cache = t_lookup = 0.0
        hit_blocks = 0
        for i in range(iters + 2):
            tokens = fresh_tokens(self._next())
            t0 = time.perf_counter()
            keys = derive(root, pack(tokens), digest, BLOCK, PROMPT_BLOCKS)
            t1 = time.perf_counter()
            ids = pool.allocate(PROMPT_BLOCKS)
            t2 = time.perf_counter()
            pool.set_keys(ids, keys)
            t3 = time.perf_counter()
            pool.free(ids[::-1])
            pool.take_events()
            again = derive(root, pack(tokens), digest, BLOCK, PROMPT_BLOCKS)
            t4 = time.perf_counter()
            hits = pool.lookup(again[:max_hit])
            t5 = time.perf_counter()
            pool.free(hits[::-1])
            pool.take_events()
            if i < 2:  # warm-up
                continue
            t_key += t1 - t0
            t_cache += t3 - t2
            t_lookup += t5 - t4
            hit_blocks += len(hits)
        pool.close()
        if hit_blocks != iters * max_hit:
            raise RuntimeError(f"kvgov lookup found {hit_blocks} blocks")
        per = iters * PROMPT_BLOCKS
        return {
            "key_derivation": t_key / per * 1e6,
            "cache_blocks": t_cache / per * 1e6,
            "lookup": t_lookup / hit_blocks * 1e6,
        }

    def evict(self, iters: int) -> dict[str, float]:
        if self._epool is None:
            pool = self._pool()
            ids = pool.allocate(NUM_BLOCKS)
            pool.set_keys(ids, unique_keys(0, NUM_BLOCKS))
            pool.free(ids[::-1])
            pool.take_events()
            self._epool, self._ekeys = pool, NUM_BLOCKS
        pool = self._epool
        keys = unique_keys(self._ekeys, (iters + 10) * ALLOC_N)
        self._ekeys += len(keys)
        allocate, take = pool.allocate, pool.take_events
        gc.collect()
        seconds = 0.0
        for i in range(iters + 10):
            t0 = time.perf_counter()
            ids = allocate(ALLOC_N)
            take()
            t1 = time.perf_counter()
            if i >= 10:
                seconds += t1 - t0
            pool.set_keys(ids, keys[i * ALLOC_N : (i + 1) * ALLOC_N])
            pool.free(ids[::-1])
            take()
        if pool.counts().cached != NUM_BLOCKS:
            raise RuntimeError("kvgov evict: the pool is not full of cached blocks")
        return {"evict": seconds / (iters * ALLOC_N) * 1e6}

    # ------------------------------------------------------------------ eviction as policy

    def _policy_pools(self, kind: str) -> dict[str, _PolicyPool]:
        """The pools of a policy workload, one per mode, built on first use: full of
        cached blocks (``evict``) or half full (``alloc``), each allocation's blocks at
        its mode's priority and tenant (vs_vllm_common.policy_request)."""
        pools = self._policy.get(kind)
        if pools is None:
            pools = self._policy[kind] = {m: self._policy_pool(m, kind) for m in POLICY_MODES}
        return pools

    def _policy_pool(self, mode: str, kind: str) -> _PolicyPool:
        from kvgov.allocator import Quota

        pool = self._pool()
        if mode == "quotas":
            quota = Quota(floor=POLICY_FLOOR, cap=POLICY_CAP)
            pool.set_quotas({f"t{t}": quota for t in range(POLICY_TENANTS)})
        n = NUM_BLOCKS if kind == "evict" else NUM_BLOCKS // 2
        # fill it, then (evict) turn it over once more, so that every mode is measured in
        # its steady state (which blocks are cached, how scattered the evicted ones are)
        steps = n // ALLOC_N * (2 if kind == "evict" else 1)
        keys = unique_keys(0, steps * ALLOC_N)
        for s in range(steps):
            tenant, priority = policy_request(s, mode)
            ids = pool.allocate(ALLOC_N, group=tenant)
            pool.set_keys(
                ids, keys[s * ALLOC_N : (s + 1) * ALLOC_N], priority=priority, group=tenant
            )
            pool.free(ids[::-1])
            pool.take_events()
        return _PolicyPool(pool, steps, steps * ALLOC_N)

    def evict_policy(self, iters: int) -> dict[str, float]:
        """evict under each policy: allocate(16) on a full pool (each evicts 16) timed as
        ``evict_<mode>``, keying and freeing the 16 (where a block is filed by priority
        and tenant) as ``refill_<mode>``; the modes take turns (policy_chunks)."""
        pools = self._policy_pools("evict")
        evict = dict.fromkeys(POLICY_MODES, 0.0)
        refill = dict.fromkeys(POLICY_MODES, 0.0)
        gc.collect()
        for mode, n in policy_chunks(POLICY_MODES, iters):
            st = pools[mode]
            pool = st.pool
            keys = unique_keys(st.key, n * ALLOC_N)
            st.key += n * ALLOC_N
            allocate, take, set_keys, free = (
                pool.allocate,
                pool.take_events,
                pool.set_keys,
                pool.free,
            )
            te: list[float] = []
            tr: list[float] = []
            for j in range(n):
                tenant, priority = policy_request(st.serial, mode)
                st.serial += 1
                t0 = time.perf_counter()
                ids = allocate(ALLOC_N, group=tenant)
                take()
                t1 = time.perf_counter()
                set_keys(
                    ids, keys[j * ALLOC_N : (j + 1) * ALLOC_N], priority=priority, group=tenant
                )
                free(ids[::-1])
                take()
                t2 = time.perf_counter()
                te.append(t1 - t0)
                tr.append(t2 - t1)
            evict[mode] += steady_sum(te)
            refill[mode] += steady_sum(tr)
        for st in pools.values():
            if st.pool.counts().cached != NUM_BLOCKS:
                raise RuntimeError("kvgov evict_policy: a pool is not full of cached blocks")
        per = iters * ALLOC_N / 1e6
        out = {f"evict_{m}": evict[m] / per for m in POLICY_MODES}
        out.update({f"refill_{m}": refill[m] / per for m in POLICY_MODES})
        return out

    def alloc_policy(self, iters: int) -> dict[str, float]:
        """alloc_free under each policy: allocate(16) + free + take_events on a pool half
        full of cached blocks (nothing evicted), as ``alloc_free_<mode>``."""
        pools = self._policy_pools("alloc")
        spent = dict.fromkeys(POLICY_MODES, 0.0)
        gc.collect()
        for mode, n in policy_chunks(POLICY_MODES, iters):
            st = pools[mode]
            allocate, free, take = st.pool.allocate, st.pool.free, st.pool.take_events
            tenants = [policy_request(st.serial + j, mode)[0] for j in range(n)]
            st.serial += n
            steps: list[float] = []
            for tenant in tenants:
                t0 = time.perf_counter()
                ids = allocate(ALLOC_N, group=tenant)
                free(ids[::-1])
                take()
                steps.append(time.perf_counter() - t0)
            spent[mode] += steady_sum(steps)
        per = iters * ALLOC_N / 1e6
        return {f"alloc_free_{m}": spent[m] / per for m in POLICY_MODES}

    def _governed_cache(self) -> Any:
        if self._gcache is None:
            cache = self._create_cache("governed-audit.db")
            for _ in range(NUM_BLOCKS // PROMPT_BLOCKS + 2):  # fill it with cached blocks
                seq = f"s{self._next()}"
                cache.admit(seq, self.scope, fresh_tokens(self._serial))
                cache.release(seq)
            cache.audit.flush()
            self._gcache = cache
        return self._gcache

    def _serve_all(self, cache: Any, prompts: list[list[int]]) -> tuple[float, int]:
        admit, release, scope = cache.admit, cache.release, self.scope
        seqs = [f"s{self._next()}" for _ in prompts]
        gc.collect()
        hits = 0
        start = time.perf_counter()
        for seq, tokens in zip(seqs, prompts, strict=True):
            hits += admit(seq, scope, tokens).cached_tokens
            release(seq)
        cache.audit.flush()
        return time.perf_counter() - start, hits // BLOCK

    def governed_miss(self, iters: int) -> dict[str, float]:
        cache = self._governed_cache()
        prompts = [fresh_tokens(self._next()) for _ in range(iters)]
        seconds, hits = self._serve_all(cache, prompts)
        if hits:
            raise RuntimeError("kvgov governed_miss: a fresh prompt hit")
        return {"governed_miss": seconds / (iters * PROMPT_BLOCKS) * 1e6}

    def governed_hit(self, iters: int) -> dict[str, float]:
        cache = self._governed_cache()
        tokens = fresh_tokens(self._next())
        self._serve_all(cache, [tokens])
        seconds, hits = self._serve_all(cache, [tokens] * iters)
        if hits != iters * (PROMPT_BLOCKS - 1):
            raise RuntimeError(f"kvgov governed_hit: {hits} hits")
        return {"governed_hit": seconds / (iters * PROMPT_BLOCKS) * 1e6}

    def replay(self, requests: list[Any]) -> dict[str, float]:
        from kvgov.govern.replay import replay_governed

        name = f"replay-{self._next()}.db"
        with self._create_cache(name) as cache:
            gc.collect()
            result = replay_governed(cache, requests, lambda _r: self.scope)
            start = time.perf_counter()
            cache.audit.flush()
            flush = time.perf_counter() - start
        (self.workdir / name).unlink(missing_ok=True)
        return {
            "replay": (result.seconds + flush) / result.blocks * 1e6,
            "hit_tokens": result.hit_tokens,
            "prompt_tokens": result.prompt_tokens,
            "requests": result.requests,
            "skipped": result.skipped,
            "blocks": result.blocks,
        }

    def close(self) -> None:
        if self._gcache is not None:
            self._gcache.close()
        if self._epool is not None:
            self._epool.close()
        for pools in self._policy.values():
            for st in pools.values():
                st.pool.close()
