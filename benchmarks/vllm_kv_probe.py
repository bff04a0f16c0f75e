"""Read a vLLM worker's KV tensors: which blocks hold a non-zero byte (tests and the demo).

A worker extension (``--worker-extension-cls vllm_kv_probe.KvProbe``, with ``benchmarks/``
on ``PYTHONPATH``) adds the worker method ``kvgov_kv_state``, which
``LLM.collective_rpc("kvgov_kv_state")`` calls, or, over HTTP, vLLM's development endpoint
``POST /collective_rpc {"method": "kvgov_kv_state"}`` (``VLLM_SERVER_DEV_MODE=1``).
A debugging aid: never start a production server this way (its development endpoints
reset caches and run worker methods for anyone who can reach it).

The CPU build runs its worker in a process of its own (vLLM forces the multiprocess
executor there), so the probe sees the KV tensors only, not the scheduler's block pool:
a caller learns which blocks are owned or cached elsewhere (the governed engine's
``kvgov_call("state")``), or empties the prefix cache first (``reset_prefix_cache``),
after which no block has an owner and every non-zero block is KV left behind.
"""

from __future__ import annotations

from typing import Any


def kv_state(worker: Any) -> dict[str, Any]:
    """In the worker: ``nonzero``, the block ids with a non-zero KV byte in any layer
    (block 0, vLLM's null block, never holds KV); ``num_blocks``; ``shape`` of layer 0."""
    import torch

    kv_caches = worker.model_runner.kv_caches
    num_blocks = int(kv_caches[0].shape[0])  # the CPU runner: blocks on dim 0
    nonzero: set[int] = set()
    for kv in kv_caches:
        assert int(kv.shape[0]) == num_blocks, [tuple(k.shape) for k in kv_caches]
        flat = kv.reshape(num_blocks, -1)
        nonzero.update(torch.nonzero((flat != 0).any(dim=1)).flatten().tolist())
    return {
        "nonzero": sorted(nonzero),
        "num_blocks": num_blocks,
        "shape": list(kv_caches[0].shape),
    }


class KvProbe:
    """vLLM worker extension: ``collective_rpc("kvgov_kv_state")`` runs :func:`kv_state`."""

    def kvgov_kv_state(self) -> dict[str, Any]:
        return kv_state(self)
