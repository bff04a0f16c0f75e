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
    PROMPT,
    PROMPT_BLOCKS,
    fresh_tokens,
    unique_keys,
)


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
