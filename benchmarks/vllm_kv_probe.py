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

A model with several KV cache groups (hybrid full + sliding-window attention) has one
pool of block ids for all of them; vLLM allocates each KV tensor once and lets one
layer of every group view it (a block id belongs to one group's request at a time).
The probe reads every layer, and reports per group too (``groups``: the group's
attention type, its layers, and the blocks non-zero in the tensors its layers view),
so a test can say that no group's tensors keep KV a block's last owner left. A Mamba
layer's ``kv_cache`` is a tuple of state tensors (conv and ssm state, blocks on dim 0):
each is read, and reported per state tensor (``states``).
"""

from __future__ import annotations

from typing import Any


def _nonzero(kv: Any, num_blocks: int) -> set[int]:
    import torch

    flat = kv.reshape(num_blocks, -1)
    return set(torch.nonzero((flat != 0).any(dim=1)).flatten().tolist())


def kv_state(worker: Any) -> dict[str, Any]:
    """In the worker: ``nonzero``, the block ids with a non-zero KV byte in any layer
    (block 0, vLLM's null block, never holds KV); ``num_blocks``; ``shape`` of layer 0;
    ``groups``, per KV cache group: ``kind`` (its spec's class), ``layers``, ``nonzero``
    (the blocks non-zero in its layers' tensors, every state tensor of a Mamba layer
    included), ``tensors`` (their distinct storages) and ``states`` (a Mamba group: per
    state tensor, conv then ssm, the blocks non-zero in it over the group's layers; an
    attention group: empty)."""
    runner = worker.model_runner
    kv_caches = runner.kv_caches
    num_blocks = int(kv_caches[0].shape[0])  # the CPU runner: blocks on dim 0
    nonzero: set[int] = set()
    for kv in kv_caches:
        assert int(kv.shape[0]) == num_blocks, [tuple(k.shape) for k in kv_caches]
        nonzero |= _nonzero(kv, num_blocks)
    context = runner.compilation_config.static_forward_context
    groups = []
    for group in runner.kv_cache_config.kv_cache_groups:
        seen: set[int] = set()
        group_nonzero: set[int] = set()
        states: list[set[int]] = []  # a Mamba layer's state tensors (conv, ssm), each
        for name in group.layer_names:
            kv = context[name].kv_cache
            parts = list(kv) if isinstance(kv, (list, tuple)) else [kv]
            seen.add(int(parts[0].data_ptr()))
            for i, part in enumerate(parts):
                ids = _nonzero(part, num_blocks)
                group_nonzero |= ids
                if len(parts) > 1:
                    states.extend(set() for _ in range(i + 1 - len(states)))
                    states[i] |= ids
        groups.append(
            {
                "kind": type(group.kv_cache_spec).__name__,
                "layers": list(group.layer_names),
                "nonzero": sorted(group_nonzero),
                "tensors": sorted(seen),
                "states": [sorted(ids) for ids in states],
            }
        )
    return {
        "nonzero": sorted(nonzero),
        "num_blocks": num_blocks,
        "shape": list(kv_caches[0].shape),
        "groups": groups,
    }


class KvProbe:
    """vLLM worker extension: ``collective_rpc("kvgov_kv_state")`` runs :func:`kv_state`."""

    def kvgov_kv_state(self) -> dict[str, Any]:
        return kv_state(self)
