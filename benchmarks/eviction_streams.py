"""The request streams of bench_eviction_policy.py, shared by kvgov's pool and vLLM's.

A request is a tenant, an eviction priority and a chain of block hashes (equal
hashes are equal prefix blocks); ``counted`` marks the system-prompt requests whose
hit rate is reported. Pure Python: the vLLM worker (``eviction_vllm.py``) builds the
same streams in its own venv.

* ``synthetic``: 8 tenants re-send 24-block system prompts (priority 90), and one
  tenant floods three distinct 32-block prompts (priority 10) per system prompt;
  512 blocks.
* ``mooncake``: the same 8 system prompts (16 blocks each), the flood being the
  Mooncake conversation trace (``data/mooncake``, one block per hash id, its
  prefix sharing kept) at priority 10, three trace requests per system prompt;
  512 blocks.

And the noisy neighbour (:func:`noisy_stream`): tenant B cycles a working set of 48
prompts of 4 blocks (192 blocks) while tenant A floods a distinct 24-block prompt
after each of B's; 512 blocks; the quotas :data:`NOISY_QUOTAS` cap A at 192 blocks
and give B a floor of 256.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "HIGH",
    "LOW",
    "NOISY_BLOCKS",
    "NOISY_QUOTAS",
    "Request",
    "durable_streams",
    "noisy_stream",
]

TRACE = (
    Path(__file__).resolve().parents[1] / "data" / "mooncake" / "mooncake_conversation_trace.jsonl"
)
HIGH, LOW = 90, 10


@dataclass(frozen=True)
class Request:
    tenant: str
    priority: int
    hashes: list[bytes]
    counted: bool


def _system(i: int, blocks: int) -> Request:
    t = i % 8
    return Request(f"t{t}", HIGH, [f"sys{t}-{j}".encode() for j in range(blocks)], i >= 8)


def synthetic(steps: int) -> list[Request]:
    out = []
    for i in range(steps):
        out.append(_system(i, 24))
        for k in range(3):
            out.append(
                Request("flood", LOW, [f"flood{i}-{k}-{j}".encode() for j in range(32)], False)
            )
    return out


def mooncake(requests: int) -> list[Request]:
    out: list[Request] = []
    with TRACE.open() as f:
        for i, line in enumerate(f):
            if i >= requests:
                break
            if i % 3 == 0:
                out.append(_system(i // 3, 16))
            ids = json.loads(line)["hash_ids"]
            out.append(Request("flood", LOW, [f"mc{h}".encode() for h in ids], False))
    return out


def durable_streams(quick: bool) -> dict[str, tuple[list[Request], int]]:
    """Stream name -> (requests, pool blocks)."""
    return {
        "synthetic": (synthetic(200 if quick else 1000), 512),
        "mooncake": (mooncake(600 if quick else 3000), 512),
    }


#: the noisy neighbour's pool, in blocks
NOISY_BLOCKS = 512
#: its quotas, tenant -> (floor, cap) in blocks (None: no cap)
NOISY_QUOTAS: dict[str, tuple[int, int | None]] = {"A": (0, 192), "B": (256, None)}
#: tokens a block holds (prefill avoided = blocks hit x this)
BLOCK_TOKENS = 16


def noisy_stream(steps: int, flood: bool) -> list[Request]:
    """B's ``steps`` requests (its working set: 48 prompts of 4 blocks, in turn), each
    followed by one of A's distinct 24-block prompts when ``flood``; B's requests after
    its first pass over the working set are counted."""
    out: list[Request] = []
    for i in range(steps):
        w = i % 48
        out.append(Request("B", 50, [f"B{w}-{j}".encode() for j in range(4)], i >= 48))
        if flood:
            out.append(Request("A", 50, [f"A{i}-{j}".encode() for j in range(24)], False))
    return out
