"""What both sides of bench_vs_vllm.py share: the pool geometry, paths, token helpers.

Imports nothing of kvgov or vLLM: the vLLM worker (in its own venv) imports it too. The
trace (:data:`TRACE`, in the repository's ``data/mooncake/``) is also the one
``bench_governed.py`` and ``bench_offload_replay.py`` replay.
"""

from __future__ import annotations

import hashlib
import sys
from array import array
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_VENV = REPO / ".bench" / "vllm-venv"
#: vLLM 0.33.0's CPU-side requirement pins (its CUDA ones left out), beside this file
REQUIREMENTS = REPO / "benchmarks" / "vllm-cpu-requirements.txt"
#: the Mooncake conversation trace (Apache-2.0; data/mooncake/README.md)
TRACE = REPO / "data" / "mooncake" / "mooncake_conversation_trace.jsonl"
VLLM_VERSION = "0.33.0"
TORCH_PIN = "torch==2.13.0"

NUM_BLOCKS = 65_536  # usable blocks in every pool
BLOCK = 16  # tokens per block
PROMPT = 4_096  # tokens per prompt of the prefix and governed workloads
PROMPT_BLOCKS = PROMPT // BLOCK
ALLOC_N = 16  # blocks per allocate of alloc_free and evict
REPLAY_REQUESTS = 2_000


def fresh_tokens(serial: int) -> list[int]:
    """A prompt of PROMPT distinct tokens, different for every serial (same on both sides)."""
    base = (serial * PROMPT) % (2**32 - PROMPT)
    return list(range(base, base + PROMPT))


def unique_keys(start: int, count: int) -> list[bytes]:
    """Distinct 32-byte keys (untimed setup of the evict workload)."""
    return [hashlib.sha256(i.to_bytes(8, "little")).digest() for i in range(start, start + count)]


def read_tokens(path: str) -> tuple[array[int], list[int]]:
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


# ---------------------------------------------------------------- eviction as policy
# The policy rows of bench_vs_vllm.py: the evict and alloc_free workloads again, on
# each pool under three policies, side by side in one call of each side.

#: lru: every block at the default priority, no quota (what the default policy gives);
#: priority: a flood at the lowest of POLICY_PRIORITIES churning under durable blocks
#: at the others (one allocation in DURABLE_EVERY while the pool fills: system
#: prompts), the case priorities are for, and a steady state (what leaves the lowest
#: level comes back to it); quotas: the same, and per-tenant floors and caps
#: (POLICY_FLOOR, POLICY_CAP) for the POLICY_TENANTS tenants the allocations take
#: turns at
POLICY_MODES = ("lru", "priority", "quotas")
POLICY_TENANTS = 8
POLICY_PRIORITIES = (10, 50, 90)
DURABLE_EVERY = 17
DEFAULT_PRIORITY = 50
#: per tenant: a floor of 1/64 of the pool and a cap of 1/4, so with 8 tenants sharing
#: it (1/8 each) neither binds and every allocation takes the general path (victims
#: beyond floors, lowest priority first, merged across tenants)
POLICY_FLOOR = NUM_BLOCKS // 64
POLICY_CAP = NUM_BLOCKS // 4
#: a call's iterations of each mode are run in this many chunks, the modes taking
#: turns (alternating which goes first), so a slow spell slows every mode alike
POLICY_CHUNKS = 6


def policy_request(serial: int, mode: str) -> tuple[str, int]:
    """The tenant and eviction priority of a mode's ``serial``-th allocation: the lowest
    priority, but for one allocation in DURABLE_EVERY while the pool fills (its first
    NUM_BLOCKS // ALLOC_N), which take the higher ones in turn (every tenant has some)."""
    priority = DEFAULT_PRIORITY
    if mode not in ("stock", "lru"):
        durable = serial < NUM_BLOCKS // ALLOC_N and serial % DURABLE_EVERY == 0
        priority = POLICY_PRIORITIES[1 + serial // DURABLE_EVERY % 2 if durable else 0]
    return f"t{serial % POLICY_TENANTS}", priority


def policy_chunks(modes: tuple[str, ...], iters: int) -> list[tuple[str, int]]:
    """(mode, iterations) in the order a call runs them: POLICY_CHUNKS rounds, each mode
    once a round, the order reversed every other round."""
    out: list[tuple[str, int]] = []
    for c in range(POLICY_CHUNKS):
        n = iters // POLICY_CHUNKS + (1 if c < iters % POLICY_CHUNKS else 0)
        out.extend((m, n) for m in (modes if c % 2 == 0 else modes[::-1]))
    return out


#: a step that took more than this many times its chunk's median was preempted (another
#: process's time slice, milliseconds against microseconds): it counts at the median
PREEMPTED = 5.0


def steady_sum(seconds: list[float]) -> float:
    """The sum of a chunk's step times, each preempted step counted at the median.

    The policy workloads time each step (tens of microseconds); on a shared machine a
    step now and then also holds another process's time slice, which would swamp the
    few microseconds a policy adds or saves.
    """
    if not seconds:
        return 0.0
    ordered = sorted(seconds)
    median = ordered[len(ordered) // 2]
    limit = median * PREEMPTED
    return sum(s if s <= limit else median for s in seconds)
