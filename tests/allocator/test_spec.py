"""Tests for allocator.spec: KVSpec sizes, validation and Hugging Face config parsing."""

from __future__ import annotations

import pytest
import torch

from kvgov.allocator.spec import KVSpec, parse_dtype, positive_int
from kvgov.exceptions import InvalidSpec

LLAMA3_8B = {
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_hidden_layers": 32,
    "num_key_value_heads": 8,
    "torch_dtype": "bfloat16",
}


def test_bytes_per_token_and_block_follow_the_layout() -> None:
    """A Llama-3-8B-like fp16 spec takes 128 KiB per token and 2 MiB per 16-token block."""
    spec = KVSpec(num_layers=32, num_kv_heads=8, head_dim=128)
    assert spec.bytes_per_token == 32 * 2 * 8 * 128 * 2 == 131072
    assert spec.bytes_per_block == 2 * 1024 * 1024
    assert spec.block_shape == (32, 2, 16, 8, 128)


def test_defaults_are_block_size_16_and_float16() -> None:
    """Block size and dtype default to 16 tokens and float16."""
    spec = KVSpec(1, 1, 1)
    assert spec.block_size == 16
    assert spec.dtype is torch.float16


def test_spec_is_frozen() -> None:
    """A spec cannot be changed after construction."""
    spec = KVSpec(1, 1, 1)
    with pytest.raises(AttributeError):
        spec.num_layers = 2  # type: ignore[misc]


def test_dtype_given_by_name_is_parsed() -> None:
    """A dtype name such as "bf16" is accepted and stored as the torch dtype."""
    assert KVSpec(1, 1, 1, dtype="bf16").dtype is torch.bfloat16  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("num_layers", 0),
        ("num_layers", -1),
        ("num_kv_heads", 0),
        ("head_dim", -128),
        ("block_size", 0),
        ("num_layers", True),
        ("head_dim", 128.0),
        ("num_kv_heads", "8"),
    ],
)
def test_nonsense_sizes_are_refused(field: str, value: object) -> None:
    """Zero, negative, bool, float and string sizes raise InvalidSpec naming the field."""
    kwargs: dict[str, object] = {"num_layers": 2, "num_kv_heads": 2, "head_dim": 8}
    kwargs[field] = value
    with pytest.raises(InvalidSpec) as info:
        KVSpec(**kwargs)  # type: ignore[arg-type]
    assert info.value.field == field


@pytest.mark.parametrize("dtype", ["float64", "complex64", torch.float64, torch.bool, 3, None])
def test_unknown_dtype_is_refused(dtype: object) -> None:
    """A dtype a KV cache is not stored in raises InvalidSpec."""
    with pytest.raises(InvalidSpec):
        KVSpec(1, 1, 1, dtype=dtype)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        ("fp8", torch.float8_e4m3fn),
        ("float8_e4m3fn", torch.float8_e4m3fn),
        ("torch.float8_e5m2", torch.float8_e5m2),
        ("FP16", torch.float16),
        ("torch.bfloat16", torch.bfloat16),
        ("float32", torch.float32),
    ],
)
def test_parse_dtype_accepts_known_names(name: str, dtype: torch.dtype) -> None:
    """Known dtype names, with or without a torch. prefix, map to their dtype."""
    assert parse_dtype(name) is dtype


def test_positive_int_returns_the_value() -> None:
    """positive_int passes a positive int through."""
    assert positive_int("x", 7) == 7


def test_from_hf_config_reads_llama3() -> None:
    """A Llama-3-8B config gives 32 layers, 8 KV heads, head_dim 4096/32 and bfloat16."""
    spec = KVSpec.from_hf_config(LLAMA3_8B)
    assert spec == KVSpec(32, 8, 128, 16, torch.bfloat16)


def test_from_hf_config_falls_back_to_attention_heads() -> None:
    """Without num_key_value_heads (no GQA) the KV heads are the attention heads."""
    config = {k: v for k, v in LLAMA3_8B.items() if k != "num_key_value_heads"}
    assert KVSpec.from_hf_config(config).num_kv_heads == 32


def test_from_hf_config_prefers_explicit_head_dim() -> None:
    """An explicit head_dim wins over hidden_size / num_attention_heads."""
    config = {**LLAMA3_8B, "head_dim": 256}
    assert KVSpec.from_hf_config(config).head_dim == 256


def test_from_hf_config_null_head_dim_falls_back() -> None:
    """A head_dim of null is derived from hidden_size / num_attention_heads."""
    assert KVSpec.from_hf_config({**LLAMA3_8B, "head_dim": None}).head_dim == 128


def test_from_hf_config_kv_cache_dtype_override() -> None:
    """kv_cache_dtype="fp8" stores the cache in float8_e4m3fn whatever the model dtype."""
    spec = KVSpec.from_hf_config(LLAMA3_8B, kv_cache_dtype="fp8")
    assert spec.dtype is torch.float8_e4m3fn
    assert spec.bytes_per_block == 1024 * 1024


def test_from_hf_config_auto_keeps_model_dtype() -> None:
    """kv_cache_dtype="auto" keeps the model's torch_dtype."""
    assert KVSpec.from_hf_config(LLAMA3_8B, kv_cache_dtype="auto").dtype is torch.bfloat16


def test_from_hf_config_reads_newer_dtype_key_and_defaults_to_fp16() -> None:
    """The newer "dtype" key is read, and a config with neither key gives float16."""
    config = {k: v for k, v in LLAMA3_8B.items() if k != "torch_dtype"}
    assert KVSpec.from_hf_config({**config, "dtype": "float32"}).dtype is torch.float32
    assert KVSpec.from_hf_config(config).dtype is torch.float16


def test_from_hf_config_reads_text_config() -> None:
    """A multimodal config is read from its text_config."""
    assert KVSpec.from_hf_config({"text_config": LLAMA3_8B}).num_layers == 32


def test_from_hf_config_block_size() -> None:
    """The block size argument is used."""
    assert KVSpec.from_hf_config(LLAMA3_8B, block_size=32).block_size == 32


@pytest.mark.parametrize(
    ("config", "field"),
    [
        ({"num_attention_heads": 32, "hidden_size": 4096}, "num_hidden_layers"),
        ({"num_hidden_layers": 2, "hidden_size": 4096}, "num_key_value_heads"),
        ({"num_hidden_layers": 2, "num_key_value_heads": 2}, "head_dim"),
        ({**LLAMA3_8B, "hidden_size": 4097}, "hidden_size"),
        ({**LLAMA3_8B, "num_hidden_layers": 0}, "num_hidden_layers"),
        ({**LLAMA3_8B, "num_key_value_heads": True}, "num_key_value_heads"),
        ({**LLAMA3_8B, "torch_dtype": "float64"}, "torch_dtype"),
    ],
)
def test_from_hf_config_refuses_bad_configs(config: dict[str, object], field: str) -> None:
    """Missing or nonsense config fields raise InvalidSpec naming the field."""
    with pytest.raises(InvalidSpec) as info:
        KVSpec.from_hf_config(config)
    assert info.value.field == field


def test_from_hf_config_refuses_non_mapping() -> None:
    """A config that is not a dict raises InvalidSpec."""
    with pytest.raises(InvalidSpec):
        KVSpec.from_hf_config([1, 2])  # type: ignore[arg-type]


def test_from_hf_config_refuses_unknown_override() -> None:
    """An unknown kv_cache_dtype raises InvalidSpec."""
    with pytest.raises(InvalidSpec) as info:
        KVSpec.from_hf_config(LLAMA3_8B, kv_cache_dtype="fp4")
    assert info.value.field == "kv_cache_dtype"


def test_blocks_for_tokens_rounds_up() -> None:
    """Tokens round up to whole blocks: 0 -> 0, 1 -> 1, 16 -> 1, 17 -> 2."""
    spec = KVSpec(1, 1, 1)
    assert [spec.blocks_for_tokens(t) for t in (0, 1, 16, 17)] == [0, 1, 1, 2]


@pytest.mark.parametrize("tokens", [-1, 1.5, True])
def test_blocks_for_tokens_refuses_nonsense(tokens: object) -> None:
    """Negative, fractional or bool token counts raise InvalidSpec."""
    with pytest.raises(InvalidSpec):
        KVSpec(1, 1, 1).blocks_for_tokens(tokens)  # type: ignore[arg-type]
