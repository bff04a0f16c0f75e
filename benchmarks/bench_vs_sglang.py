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
engine's). One process per side (a side run after another in one process measured up
to 1.8x slower), kept for every round: ``--rounds`` rounds (default 5), each running
every side once on a fresh cache, forward in even rounds and reversed in odd ones. The
host's speed drifts by a third within a minute (2026-12-07: three one-round runs read
governed/unified 1.37x, 2.20x and 2.39x), so each ratio is taken within a round (its
sides seconds apart) and the median over the rounds is reported. Prints each round's
wall figures, then each side's medians: microseconds a page, wall clock and the
process's CPU time (all its threads: the audit writer's work counts) with the
scheduler's thread's part of it (the loop's own thread); a governed side's timed work
ends once every page it freed is zeroed and every event it wrote is stored
(``kvgov_flush``), and its ``kvgov_close`` (once a server's life: a signed checkpoint,
the writer stopped) is timed apart and shown beside; and the median ratios of
governed to stock ``UnifiedRadixCache`` (target: at most 1.5), the engine's process
alone and, for the writer-process side, with its writer's CPU added.

    python benchmarks/bench_vs_sglang.py [--requests N] [--rounds R] [--side S]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
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
#: Rounds: every side once a round, each side's process kept from round to round
ROUNDS = 5


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
        if governed:  # the timed work ends with every page zeroed and every event stored
            cache.kvgov_flush()
        seconds = time.perf_counter() - start
        cpu = time.process_time() - cpu
        # the writer process's CPU over the round, as it reported it at the flush
        writer_cpu = (
            audit.writer_cpu_seconds - writer_cpu  # type: ignore[union-attr]
            if writer_pid is not None
            else 0.0
        )
        close = time.perf_counter()
        if governed:  # once a server's life, not per page: shown apart, untimed
            cache.kvgov_close()
        close = time.perf_counter() - close
    pages = n_req * (2 * BLOCK // PAGE)
    return {
        "side": side,
        "us_per_page": round(seconds * 1e6 / pages, 3),
        "cpu_us_per_page": round(cpu * 1e6 / pages, 3),
        "thread_cpu_us_per_page": round(thread * 1e6 / pages, 3),
        "writer_cpu_us_per_page": round(writer_cpu * 1e6 / pages, 3),
        "close_ms": round(close * 1e3, 1),
    }


def serve(side: str, n_req: int) -> int:
    """A side's process: ``ready`` once its imports are done, then one round per ``run``
    line on stdin (a fresh cache each), its figures one JSON line on stdout; ends at any
    other line or the end of input."""
    import torch  # noqa: F401  # the imports a round makes, before the first is timed
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache  # noqa: F401

    if side.startswith("governed"):
        from kvgov.govern.sglang.cache import GovernedUnifiedRadixCache  # noqa: F401
    print("ready", flush=True)
    for line in sys.stdin:
        if line.strip() != "run":
            break
        print(json.dumps(run_side(side, n_req)), flush=True)
    return 0


class Side:
    """One side's process (``--serve``), kept for every round: a round costs its loop only."""

    def __init__(self, side: str, n_req: int) -> None:
        self.side = side
        self.proc = subprocess.Popen(
            [sys.executable, "-W", "ignore", __file__, "--side", side, "--requests", str(n_req),
             "--serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )  # fmt: skip

    def ready(self) -> None:
        """Wait until the process has made its imports (so none run beside a round).

        Raises:
            RuntimeError: the side's process failed (its stderr's tail).
        """
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            self._failed()

    def _failed(self) -> None:
        self.proc.wait()
        err = self.proc.stderr.read() if self.proc.stderr is not None else ""
        raise RuntimeError(f"side {self.side} failed:\n{err[-3000:]}")

    def round(self) -> dict[str, Any]:
        """Run one round; its figures.

        Raises:
            RuntimeError: the side's process failed (its stderr's tail).
        """
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("run\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            self._failed()
        got: dict[str, Any] = json.loads(line)
        return got

    def close(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def round_order(rounds: int) -> list[list[str]]:
    """Each round's order of the sides: forward in even rounds, reversed in odd ones, so
    no side always runs right after another (the host's speed drifts within a round)."""
    return [list(SIDES) if r % 2 == 0 else list(reversed(SIDES)) for r in range(rounds)]


def paired(rounds: list[dict[str, dict[str, Any]]], side: str, ref: str, key: str) -> list[float]:
    """``side``'s figure over ``ref``'s, round by round (each pair seconds apart)."""
    return [r[side][key] / r[ref][key] for r in rounds]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=ROUNDS, help=f"rounds (default {ROUNDS})")
    ap.add_argument("--side", choices=SIDES)
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.requests < 1 or args.rounds < 1:
        ap.error("--requests and --rounds must be at least 1")
    if args.side and args.serve:
        return serve(args.side, args.requests)
    if args.side:
        print(json.dumps(run_side(args.side, args.requests)), flush=True)
        return 0
    sides = {side: Side(side, args.requests) for side in SIDES}
    rounds: list[dict[str, dict[str, Any]]] = []
    try:
        for one in sides.values():
            one.ready()
        for r, order in enumerate(round_order(args.rounds)):
            got = {side: sides[side].round() for side in order}
            rounds.append(got)
            print(
                f"round {r + 1}/{args.rounds}: "
                + ", ".join(f"{side} {got[side]['us_per_page']:.3f}" for side in SIDES)
                + " us/page wall",
                flush=True,
            )
    except RuntimeError as exc:
        print(f"bench_vs_sglang: {exc}")
        return 1
    finally:
        for one in sides.values():
            one.close()
    med = statistics.median
    for side in SIDES:
        beside = ""
        if side == "governed-writer-process":
            beside = (
                f", writer process {med(r[side]['writer_cpu_us_per_page'] for r in rounds):.3f}"
            )
        if side.startswith("governed"):
            beside += f"; close {med(r[side]['close_ms'] for r in rounds):.1f} ms, untimed"
        print(
            f"{side:23s} {med(r[side]['us_per_page'] for r in rounds):8.3f} us/page wall, "
            f"{med(r[side]['cpu_us_per_page'] for r in rounds):8.3f} us/page CPU (scheduler "
            f"thread {med(r[side]['thread_cpu_us_per_page'] for r in rounds):.3f}{beside}); "
            "medians",
            flush=True,
        )
    wall = paired(rounds, "governed", "unified", "us_per_page")
    cpu = paired(rounds, "governed", "unified", "cpu_us_per_page")
    ratio = med(wall)
    verdict = "met" if ratio <= TARGET else "MISSED"
    print(f"governed/unified per round, wall: {', '.join(f'{x:.2f}' for x in sorted(wall))}")
    print(
        f"RESULT governed/unified = {ratio:.2f}x wall, {med(cpu):.2f}x CPU, the medians of "
        f"{len(rounds)} rounds (target <= {TARGET}x wall: {verdict}); governed/radix = "
        f"{med(paired(rounds, 'governed', 'radix', 'us_per_page')):.2f}x wall"
    )
    side = "governed-writer-process"
    with_writer = [
        (r[side]["cpu_us_per_page"] + r[side]["writer_cpu_us_per_page"])
        / r["unified"]["cpu_us_per_page"]
        for r in rounds
    ]
    print(
        f"RESULT {side}/unified = {med(paired(rounds, side, 'unified', 'us_per_page')):.2f}x "
        f"wall, {med(paired(rounds, side, 'unified', 'cpu_us_per_page')):.2f}x CPU in the "
        f"engine's process, {med(with_writer):.2f}x CPU with its writer process"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
