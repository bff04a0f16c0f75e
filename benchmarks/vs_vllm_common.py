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
