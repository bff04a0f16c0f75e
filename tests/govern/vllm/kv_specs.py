"""Tiny KV cache specs for the binding's scheduler-level tests: one layer a group, one head
of size 1, float32 (vLLM is imported when they are built, as the harness is)."""

from __future__ import annotations

from typing import Any

#: Tokens a block of the tests' attention groups holds (the harness's block size).
BS = 16


def kv_specs(
    *kinds: str,
    window: int = 32,
    mamba_block_size: int = BS,
    mamba_cache_mode: str | None = None,
    mamba_shapes: tuple[tuple[int, ...], ...] = ((1, 1),),
) -> list[Any]:
    """One spec per kind, in order: ``full``, ``sliding`` and ``chunked`` (``window``
    tokens), ``cross`` (encoder-decoder), ``mamba`` (one float32 state of ``mamba_shapes``,
    ``mamba_block_size`` tokens a block, vLLM's ``mamba_cache_mode`` where given)."""
    import torch
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        CrossAttentionSpec,
        FullAttentionSpec,
        MambaSpec,
        SlidingWindowSpec,
    )

    common: dict[str, Any] = {
        "block_size": BS,
        "num_kv_heads": 1,
        "head_size": 1,
        "dtype": torch.float32,
    }
    out: list[Any] = []
    for kind in kinds:
        if kind == "full":
            out.append(FullAttentionSpec(**common))
        elif kind == "sliding":
            out.append(SlidingWindowSpec(**common, sliding_window=window))
        elif kind == "chunked":
            out.append(ChunkedLocalAttentionSpec(**common, attention_chunk_size=window))
        elif kind == "cross":
            out.append(CrossAttentionSpec(**common))
        elif kind == "mamba":
            mode = {} if mamba_cache_mode is None else {"mamba_cache_mode": mamba_cache_mode}
            out.append(
                MambaSpec(
                    block_size=mamba_block_size,
                    shapes=mamba_shapes,
                    dtypes=(torch.float32,),
                    **mode,
                )
            )
        else:
            raise ValueError(f"unknown KV cache spec kind {kind!r}")
    return out
