"""The KV layout of one model: :class:`KVSpec`.

A spec fixes how many bytes one token and one block of KV cache take, which is
all the pool and the capacity math need to know about a model. It is built by
hand or read from a Hugging Face ``config.json`` with :meth:`KVSpec.from_hf_config`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from kvgov.defaults import BLOCK_SIZE
from kvgov.exceptions import InvalidSpec

__all__ = ["KV_DTYPES", "KVSpec", "parse_dtype", "positive_int"]

#: dtypes a KV cache may be stored in, by every name a config or a caller uses for them.
#: ``fp8`` means ``float8_e4m3fn``, as vLLM's ``--kv-cache-dtype fp8`` does.
KV_DTYPES: Mapping[str, torch.dtype] = {
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "fp8": torch.float8_e4m3fn,
    "fp8_e4m3": torch.float8_e4m3fn,
    "float8_e4m3fn": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
    "float8_e5m2": torch.float8_e5m2,
    "int8": torch.int8,
    "uint8": torch.uint8,
}
_ALLOWED = frozenset(KV_DTYPES.values())


def positive_int(field: str, value: object) -> int:
    """Return ``value`` if it is an int greater than zero (``bool`` is refused).

    Args:
        field: name used in the error.
        value: the value to check.

    Returns:
        The value as an ``int``.

    Raises:
        InvalidSpec: ``value`` is not an int (or is a bool) or is not positive.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidSpec(field, value, "must be an int greater than zero")
    if value <= 0:
        raise InvalidSpec(field, value, "must be greater than zero")
    return int(value)


def parse_dtype(value: object, field: str = "dtype") -> torch.dtype:
    """Turn a dtype or its name (``"bfloat16"``, ``"torch.float16"``, ``"fp8"``) into a dtype.

    Args:
        value: a ``torch.dtype`` or one of the names in :data:`KV_DTYPES`, optionally
            prefixed with ``torch.``.
        field: name used in the error.

    Returns:
        The torch dtype.

    Raises:
        InvalidSpec: the dtype is unknown or not one a KV cache is stored in.
    """
    accepted = ", ".join(sorted(KV_DTYPES))
    if isinstance(value, torch.dtype):
        if value not in _ALLOWED:
            raise InvalidSpec(field, value, f"not a KV cache dtype; use one of {accepted}")
        return value
    if isinstance(value, str):
        name = value.strip().lower().removeprefix("torch.")
        dtype = KV_DTYPES.get(name)
        if dtype is not None:
            return dtype
    raise InvalidSpec(field, value, f"unknown dtype; use a torch.dtype or one of {accepted}")


@dataclass(frozen=True, slots=True)
class KVSpec:
    """The KV cache layout of one model: layers, KV heads, head size, block size, dtype.

    One token holds a key and a value vector per KV head per layer, so::

        bytes_per_token = num_layers * 2 * num_kv_heads * head_dim * dtype.itemsize
        bytes_per_block = bytes_per_token * block_size

    Args:
        num_layers: transformer layers that keep a KV cache.
        num_kv_heads: key/value heads per layer (fewer than attention heads under GQA).
        head_dim: size of one head's key (and value) vector.
        block_size: tokens per block.
        dtype: dtype the cache is stored in (see :data:`KV_DTYPES`; a name is accepted).

    Raises:
        InvalidSpec: a size is not a positive int (bools refused) or the dtype is unknown.
    """

    num_layers: int
    num_kv_heads: int
    head_dim: int
    block_size: int = BLOCK_SIZE
    dtype: torch.dtype = torch.float16

    def __post_init__(self) -> None:
        positive_int("num_layers", self.num_layers)
        positive_int("num_kv_heads", self.num_kv_heads)
        positive_int("head_dim", self.head_dim)
        positive_int("block_size", self.block_size)
        object.__setattr__(self, "dtype", parse_dtype(self.dtype))

    @property
    def bytes_per_token(self) -> int:
        """Bytes of K and V that one token takes across all layers."""
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * self.dtype.itemsize

    @property
    def bytes_per_block(self) -> int:
        """Bytes one block of ``block_size`` tokens takes (one contiguous range in the pool)."""
        return self.bytes_per_token * self.block_size

    @property
    def block_shape(self) -> tuple[int, int, int, int, int]:
        """Shape of one block: ``(num_layers, 2, block_size, num_kv_heads, head_dim)``."""
        return (self.num_layers, 2, self.block_size, self.num_kv_heads, self.head_dim)

    @classmethod
    def from_hf_config(
        cls,
        config: Mapping[str, Any],
        block_size: int = BLOCK_SIZE,
        *,
        kv_cache_dtype: torch.dtype | str | None = None,
    ) -> KVSpec:
        """Read a spec from a Hugging Face ``config.json`` (already parsed to a dict).

        Reads ``num_hidden_layers``; ``num_key_value_heads``, falling back to
        ``num_attention_heads`` (models without GQA); ``head_dim``, falling back to
        ``hidden_size / num_attention_heads``; and the dtype from ``torch_dtype`` (or
        the newer ``dtype`` key), default float16. Multimodal configs whose language
        model sits under ``text_config`` are read from there. Multi-head latent
        attention (DeepSeek MLA) is not modelled.

        Args:
            config: the parsed ``config.json``.
            block_size: tokens per block.
            kv_cache_dtype: store the cache in this dtype instead of the model's
                (e.g. ``"fp8"`` for ``float8_e4m3fn``); ``None`` or ``"auto"`` keeps
                the model dtype.

        Returns:
            The spec.

        Raises:
            InvalidSpec: a field is missing, not a positive int, ``hidden_size`` does
                not divide by ``num_attention_heads``, or the dtype is unknown.
        """
        if not isinstance(config, Mapping):
            raise InvalidSpec("config", type(config).__name__, "must be a dict (parsed JSON)")
        if "num_hidden_layers" not in config and isinstance(config.get("text_config"), Mapping):
            config = config["text_config"]
        layers = config.get("num_hidden_layers")
        if layers is None:
            raise InvalidSpec("num_hidden_layers", None, "missing from the config")
        attn_heads = config.get("num_attention_heads")
        kv_heads = config.get("num_key_value_heads")
        if kv_heads is None:
            if attn_heads is None:
                raise InvalidSpec(
                    "num_key_value_heads",
                    None,
                    "missing, and num_attention_heads to fall back on is missing too",
                )
            kv_heads = attn_heads
        head_dim = config.get("head_dim")
        if head_dim is None:
            hidden = config.get("hidden_size")
            if hidden is None or attn_heads is None:
                raise InvalidSpec(
                    "head_dim",
                    None,
                    "missing, and hidden_size / num_attention_heads to derive it are missing",
                )
            hidden = positive_int("hidden_size", hidden)
            attn_heads = positive_int("num_attention_heads", attn_heads)
            if hidden % attn_heads:
                raise InvalidSpec(
                    "hidden_size",
                    hidden,
                    f"does not divide by num_attention_heads={attn_heads}; give head_dim",
                )
            head_dim = hidden // attn_heads
        if kv_cache_dtype is None or kv_cache_dtype == "auto":
            raw = config.get("torch_dtype", config.get("dtype"))
            dtype = torch.float16 if raw is None else parse_dtype(raw, "torch_dtype")
        else:
            dtype = parse_dtype(kv_cache_dtype, "kv_cache_dtype")
        return cls(
            num_layers=positive_int("num_hidden_layers", layers),
            num_kv_heads=positive_int("num_key_value_heads", kv_heads),
            head_dim=positive_int("head_dim", head_dim),
            block_size=positive_int("block_size", block_size),
            dtype=dtype,
        )

    def blocks_for_tokens(self, tokens: int) -> int:
        """Blocks needed to hold ``tokens`` tokens (the last block may be partly full).

        Args:
            tokens: token count, zero or more.

        Returns:
            ``ceil(tokens / block_size)``.

        Raises:
            InvalidSpec: ``tokens`` is negative or not an int.
        """
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise InvalidSpec("tokens", tokens, "must be an int of zero or more")
        return -(-tokens // self.block_size)
