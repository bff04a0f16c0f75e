"""Offload tiers on a real trace: prefill avoided with an encrypted host tier, against none.

Replays ``data/mooncake/mooncake_conversation_trace.jsonl`` (12,031 requests, one
hour of production chat; each 512-token hash id expanded into deterministic tokens,
see ``govern/replay.py``) through ``GovernedKVCache`` with one tenant, twice in one
run, same requests in the same order:

* **device only**: a pool of one eighth of the trace's working set (its distinct
  full blocks), zeroizing what it evicts;
* **device + host tier**: the same pool, and an encrypted ``HostMemoryTier`` that
  holds 8x the device capacity in blocks (AES-256-GCM under the tenant's data key,
  the offload policy asked per eviction, every restore verified and audited).

Both are compared with the **ideal**: the hit rate of an unbounded cache at the
same geometry (every block ever seen is kept; one prompt token is always left to
compute), computed from the trace. ``data/mooncake/README.md`` gives 37.4% for it.

Blocks are 512 tokens, one Mooncake hash id each: equal prefixes are equal at
hash-id granularity, so hits are the same as with 16-token blocks and there are 32x
fewer blocks to replay. The KV layout is tiny (2 KiB a block): this measures hits,
not bandwidth (``bench_offload.py`` measures the tiers' throughput). Prompts are
expanded a chunk at a time, so the whole trace fits in memory.

Prints a table and ``RESULT name=value`` lines.

    .venv/bin/python benchmarks/bench_offload_replay.py [--requests N] [--quick]
"""

from __future__ import annotations

import argparse
import secrets
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from vs_vllm_common import TRACE  # benchmarks/vs_vllm_common.py, beside this script

from kvgov.allocator import KVSpec
from kvgov.govern import GovernedKVCache, OffloadConfig
from kvgov.govern.replay import TraceRequest, load_trace, replay_governed, trace_scope
from kvgov.offload import HostMemoryTier, LocalKEK
from kvgov.offload.objects import encoded_nbytes

BLOCK_TOKENS = 512
SPEC = KVSpec(num_layers=1, num_kv_heads=1, head_dim=1, block_size=BLOCK_TOKENS,
              dtype=torch.float16)  # fmt: skip
SCOPE = trace_scope("tenant-0")
#: The unbounded single-tenant hit rate of the whole trace, from data/mooncake/README.md.
README_IDEAL = 0.374
DEVICE_FRACTION = 8
HOST_MULTIPLE = 8
#: Requests expanded into tokens at a time (the whole trace would take gigabytes).
CHUNK = 256


@dataclass(frozen=True, slots=True)
class Run:
    """One replay's outcome."""

    name: str
    prompt_tokens: int
    hit_tokens: int
    restored_tokens: int
    requests: int
    skipped: int
    seconds: float
    sealed: int
    refused: int

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def working_set(requests: Sequence[TraceRequest]) -> int:
    """Distinct full blocks of the trace: what an unbounded cache would end up holding."""
    return len({h for r in requests for h in r.hash_ids[: r.input_length // BLOCK_TOKENS]})


def ideal(requests: Sequence[TraceRequest]) -> float:
    """Hit rate of an unbounded cache: leading full blocks seen before, one token left over."""
    seen: set[int] = set()
    hit = total = 0
    for r in requests:
        n = r.input_length
        full = r.hash_ids[: n // BLOCK_TOKENS]
        k = 0
        while k < len(full) and full[k] in seen:
            k += 1
        hit += min(k, (n - 1) // BLOCK_TOKENS if n else 0) * BLOCK_TOKENS
        total += n
        seen.update(full)
    return hit / total if total else 0.0


def replay(
    name: str, requests: Sequence[TraceRequest], device_blocks: int, host_blocks: int, tmp: Path
) -> Run:
    """Replay the requests through a governed cache, with a host tier of ``host_blocks`` or none."""
    offload = None
    if host_blocks:
        per_object = encoded_nbytes(b"k" * 32, b"s" * 32, SCOPE.tenant, SPEC.bytes_per_block)
        tier = HostMemoryTier(host_blocks * per_object, pin_memory=False)
        offload = OffloadConfig(tiers=[tier], kek=LocalKEK(secrets.token_bytes(32)))
    cache = GovernedKVCache.create(
        spec=SPEC,
        num_blocks=device_blocks,
        audit_url=f"sqlite:///{tmp / f'audit-{name}.db'}",
        ephemeral_secret=True,
        offload=offload,
    )
    hit = prompt = done = skipped = 0
    seconds = 0.0
    try:
        for i in range(0, len(requests), CHUNK):
            part = replay_governed(cache, requests[i : i + CHUNK], lambda _r: SCOPE)
            hit, prompt = hit + part.hit_tokens, prompt + part.prompt_tokens
            done, skipped = done + part.requests, skipped + part.skipped
            seconds += part.seconds  # admit + release only: the token expansion is not timed
            print(f"  {name}: {min(i + CHUNK, len(requests))}/{len(requests)} requests, "
                  f"hit rate {hit / max(prompt, 1):.4f}", file=sys.stderr, end="\r")  # fmt: skip
        start = time.perf_counter()
        cache.audit.flush()
        seconds += time.perf_counter() - start
        stats = cache.stats()
    finally:
        cache.close()
    print(file=sys.stderr)
    snap = stats.offload
    host = None if snap is None else snap.tiers["host"]
    return Run(
        name=name,
        prompt_tokens=prompt,
        hit_tokens=hit,
        restored_tokens=stats.total.blocks_restored * BLOCK_TOKENS,
        requests=done,
        skipped=skipped,
        seconds=seconds,
        sealed=0 if host is None else host.puts,
        refused=0 if host is None else sum(host.refusals.values()),
    )


def main() -> int:
    """Run both replays and print the table and RESULT lines."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--requests", type=int, default=None, help="replay the first N (default all)")
    ap.add_argument("--quick", action="store_true", help="the first 1,000 requests")
    args = ap.parse_args()
    if args.quick:
        args.requests = 1_000
    if args.requests is not None and args.requests < 1:
        ap.error("--requests must be at least 1")
    if not TRACE.is_file():
        print(f"trace not found at {TRACE} (it ships in the repository)", file=sys.stderr)
        return 1
    requests = load_trace(TRACE, args.requests)
    ws = working_set(requests)
    device = -(-ws // DEVICE_FRACTION)
    host = HOST_MULTIPLE * device
    best = ideal(requests)
    with tempfile.TemporaryDirectory(prefix="kvgov-bench-") as tmp:
        runs = [
            replay("device_only", requests, device, 0, Path(tmp)),
            replay("host_tier", requests, device, host, Path(tmp)),
        ]
    bare, tiered = runs
    tokens = sum(r.input_length for r in requests)
    print(f"{len(requests):,} requests, {tokens:,} prompt tokens; working set {ws:,} blocks "
          f"of {BLOCK_TOKENS} tokens; device {device:,} blocks (1/{DEVICE_FRACTION}); host tier "
          f"{host:,} blocks ({HOST_MULTIPLE}x the device)")  # fmt: skip
    print(f"{'run':<14}{'hit rate':>10}{'prefill avoided':>17}{'of ideal':>10}{'from ideal':>12}"
          f"{'restored':>14}{'sealed':>10}{'s':>8}")  # fmt: skip
    for r in runs:
        print(f"{r.name:<14}{r.hit_rate:>10.4f}{r.hit_tokens:>17,}{r.hit_rate / best:>10.1%}"
              f"{best - r.hit_rate:>12.4f}{r.restored_tokens:>14,}{r.sealed:>10,}"
              f"{r.seconds:>8.1f}")  # fmt: skip
    print(f"{'ideal':<14}{best:>10.4f}   (unbounded, same geometry; the data README: "
          f"{README_IDEAL:.1%} for the whole trace)")  # fmt: skip
    gain = tiered.hit_tokens / bare.hit_tokens if bare.hit_tokens else float("inf")
    print(f"host tier: {tiered.hit_tokens - bare.hit_tokens:,} more prefill tokens avoided "
          f"({gain:.2f}x), {tiered.refused} objects refused")  # fmt: skip
    print(f"RESULT requests={len(requests)}")
    print(f"RESULT working_set_blocks={ws}")
    print(f"RESULT device_blocks={device}")
    print(f"RESULT host_tier_blocks={host}")
    print(f"RESULT ideal_hit_rate={best:.6f}")
    for r in runs:
        print(f"RESULT {r.name}_hit_rate={r.hit_rate:.6f}")
        print(f"RESULT {r.name}_prefill_tokens_avoided={r.hit_tokens}")
        print(f"RESULT {r.name}_gap_to_ideal={best - r.hit_rate:.6f}")
        print(f"RESULT {r.name}_seconds={r.seconds:.2f}")
    print(f"RESULT host_tier_restored_tokens={tiered.restored_tokens}")
    print(f"RESULT host_tier_prefill_gain={gain:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
