"""SGLang's radix caches, stock against governed, per 16-token page (run in the SGLang venv).

Workload (adapted from the SGLang CPU study's bench_radix.py): 2,000 requests of 1,024
tokens, request r one of 50 shared 512-token system prompts (seeded) then 512 tokens of
its own; a 65,536-token pool (so most requests evict). Per request, as SGLang's
scheduler does: match (all but the last token), lock, evict if short, allocate, insert,
free the duplicates (``RadixCache`` only), unlock. Sides: ``radix`` (``RadixCache``),
``unified`` (stock ``UnifiedRadixCache``, Rust core), ``governed``
(:class:`kvgov.govern.sglang.cache.GovernedUnifiedRadixCache`: admission, namespaces,
zeroing, SQLite audit, its writer a thread of the engine's process) and
``governed-writer-process`` (the same with ``KVGOV_AUDIT_WRITER=process``: the audit
trail sealed and stored by a writer process of its own, whose CPU is printed beside the
engine's). One side per process (a side run after another in one process
measured up to 1.8x slower). Prints microseconds a page per side, wall clock and the
process's CPU time (all its threads: the audit writer's work counts; less swayed than
the wall clock by other load on a shared machine) with the scheduler's thread's part of
it (the loop's own thread), and the ratios of governed to stock
``UnifiedRadixCache`` (target: at most 1.5), the engine's process alone and, for the
writer-process side, with its writer's CPU added.

    python benchmarks/bench_vs_sglang.py [--requests N] [--side S]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from array import array
from types import SimpleNamespace
from typing import Any

PAGE = 16
BLOCK = 512
TARGET = 1.5


SIDES = ("radix", "unified", "governed", "governed-writer-process")


def _build(side: str, pool_tokens: int, tmp: str) -> tuple[Any, Any]:
    import torch
    from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool

    r2t = ReqToTokenPool(size=8, max_context_len=2048, device="cpu", enable_memory_saver=False)
    kv = MHATokenToKVPool(
        size=pool_tokens,
        page_size=PAGE,
        dtype=torch.bfloat16,
        head_num=1,
        head_dim=8,
        layer_num=1,
        device="cpu",
        enable_memory_saver=False,
    )
    alloc = PagedTokenToKVPoolAllocator(
        size=pool_tokens,
        page_size=PAGE,
        dtype=torch.bfloat16,
        device="cpu",
        kvcache=kv,
        need_sort=False,
    )
    if side == "radix":
        from sglang.srt.mem_cache.radix_cache import RadixCache

        return RadixCache(
            CacheInitParams(
                disable=False,
                req_to_token_pool=r2t,
                token_to_kv_pool_allocator=alloc,
                page_size=PAGE,
            )
        ), alloc
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    params = CacheInitParams(
        disable=False,
        req_to_token_pool=r2t,
        token_to_kv_pool_allocator=alloc,
        page_size=PAGE,
        tree_components=(ComponentType.FULL,),
    )
    if side == "unified":
        return UnifiedRadixCache(params), alloc
    from kvgov.govern.sglang.cache import GovernedUnifiedRadixCache

    GovernedUnifiedRadixCache.kvgov_environ = {
        "KVGOV_AUDIT_URL": f"sqlite:///{tmp}/audit.db",
        "KVGOV_EPHEMERAL_SECRET": "1",
        "KVGOV_DEFAULT_TENANT": "t0",
        "KVGOV_DEFAULT_CLASSIFICATION": "internal",
        "KVGOV_DEFAULT_TEMPLATE": "v1",
        "KVGOV_AUDIT_WRITER": "process" if side == "governed-writer-process" else "thread",
    }
    return GovernedUnifiedRadixCache(params), alloc


def run_side(side: str, n_req: int) -> dict[str, Any]:
    import torch
    from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InsertParams, MatchPrefixParams
    from sglang.srt.mem_cache.radix_cache import RadixKey

    rng = random.Random(0)
    prompts = []
    for r in range(n_req):
        s = rng.randrange(50)
        toks = array("q", range(s * BLOCK, s * BLOCK + BLOCK))
        toks.extend(range((1000 + r) * BLOCK, (1001 + r) * BLOCK))
        prompts.append(toks)
    with tempfile.TemporaryDirectory(prefix="bench-vs-sglang-") as tmp:
        cache, alloc = _build(side, 65_536, tmp)
        reqs = [
            SimpleNamespace(
                rid=f"r{i}",
                origin_input_ids=p,
                lora_id=None,
                extra_key=None,
                cache_salt=None,
                session=None,
                sampling_params=SimpleNamespace(custom_params=None),
            )
            for i, p in enumerate(prompts)
        ]
        governed = side.startswith("governed")
        audit = cache.kvgov.gov.audit if governed else None
        writer_pid = getattr(audit, "writer_pid", None)
        if writer_pid is not None:
            audit.flush()  # type: ignore[union-attr]  # a fresh report of the writer's CPU
        writer_cpu = getattr(audit, "writer_cpu_seconds", 0.0)
        start, cpu, thread = time.perf_counter(), time.process_time(), time.thread_time()
        for req, toks in zip(reqs, prompts, strict=True):
            n = len(toks)
            m = cache.match_prefix(
                MatchPrefixParams(
                    key=RadixKey(toks, req.extra_key, limit=n - 1), req=req if governed else None
                )
            )
            lock = cache.lock(m.last_device_node)
            prefix_len = m.device_prefix_len
            prefix = cache.path_device_indices(m.last_device_node)[:prefix_len]
            short = (n - prefix_len) - alloc.available_size()
            if short > 0:
                cache.evict(EvictParams(num_tokens=short))
            value = torch.cat((prefix, alloc.alloc(n - prefix_len)))
            res = cache.insert(
                InsertParams(
                    key=RadixKey(toks, req.extra_key), value=value, prev_prefix_len=prefix_len
                )
            )
            if side == "radix" and res.prefix_len > prefix_len:
                alloc.free(value[prefix_len : res.prefix_len])
            cache.unlock(lock)
        thread = time.thread_time() - thread  # the scheduler's (this) thread: the loop
        if writer_pid is not None:
            audit.flush()  # type: ignore[union-attr]  # everything stored, its CPU reported
            writer_cpu = audit.writer_cpu_seconds - writer_cpu  # type: ignore[union-attr]
        else:
            writer_cpu = 0.0
        if governed:
            cache.kvgov_close()
        seconds = time.perf_counter() - start
        cpu = time.process_time() - cpu
    pages = n_req * (2 * BLOCK // PAGE)
    return {
        "side": side,
        "us_per_page": round(seconds * 1e6 / pages, 3),
        "cpu_us_per_page": round(cpu * 1e6 / pages, 3),
        "thread_cpu_us_per_page": round(thread * 1e6 / pages, 3),
        "writer_cpu_us_per_page": round(writer_cpu * 1e6 / pages, 3),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--side", choices=SIDES)
    args = ap.parse_args()
    if args.side:
        print(json.dumps(run_side(args.side, args.requests)), flush=True)
        return 0
    figures: dict[str, float] = {}
    cpu: dict[str, float] = {}
    writer: dict[str, float] = {}
    for side in SIDES:
        proc = subprocess.run(
            [
                sys.executable,
                "-W",
                "ignore",
                __file__,
                "--side",
                side,
                "--requests",
                str(args.requests),
            ],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
        if proc.returncode != 0:
            print(f"bench_vs_sglang: side {side} failed:\n{proc.stderr[-3000:]}")
            return 1
        got = json.loads(proc.stdout.strip().splitlines()[-1])
        figures[side], cpu[side] = got["us_per_page"], got["cpu_us_per_page"]
        writer[side] = got["writer_cpu_us_per_page"]
        beside = f", writer process {writer[side]:.3f}" if writer[side] else ""
        print(
            f"{side:23s} {figures[side]:8.3f} us/page wall, {cpu[side]:8.3f} us/page CPU "
            f"(scheduler thread {got['thread_cpu_us_per_page']:.3f}{beside})",
            flush=True,
        )
    ratio = figures["governed"] / figures["unified"]
    verdict = "met" if ratio <= TARGET else "MISSED"
    print(
        f"RESULT governed/unified = {ratio:.2f}x wall, "
        f"{cpu['governed'] / cpu['unified']:.2f}x CPU (target <= {TARGET}x wall: {verdict}); "
        f"governed/radix = {figures['governed'] / figures['radix']:.2f}x wall"
    )
    side = "governed-writer-process"
    print(
        f"RESULT {side}/unified = {figures[side] / figures['unified']:.2f}x wall, "
        f"{cpu[side] / cpu['unified']:.2f}x CPU in the engine's process, "
        f"{(cpu[side] + writer[side]) / cpu['unified']:.2f}x CPU with its writer process"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
