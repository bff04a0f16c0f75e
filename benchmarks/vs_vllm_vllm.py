"""The vLLM side of bench_vs_vllm.py: vLLM 0.33.0's block pool and prefix hashing.

Runs only inside the vLLM venv, as a worker subprocess (``bench_vs_vllm.py
--vllm-worker``) answering JSON-line commands; imports nothing of kvgov.
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
    NUM_BLOCKS,
    PROMPT_BLOCKS,
    fresh_tokens,
    read_tokens,
    unique_keys,
)


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
