"""Write config-only Hugging Face cache entries, so vLLM's ModelConfig resolves these names offline.

vLLM's scheduler tests build a ModelConfig for a named model; with no hub access, the config must
be in the local cache. No weights are written: the scheduler never loads a model. ``make
test-vllm`` (``tests/govern/vllm/suite/run_test_vllm.py``) runs it in the vLLM venv.

    HF_HOME=.bench/vllm-tests/hf python vllm_config_only_models.py   (in a venv with transformers)
"""

from __future__ import annotations

import os
from typing import Any

HUB = os.path.join(os.environ.get("HF_HOME", os.path.expanduser("~/.cache/huggingface")), "hub")
REV = "0" * 40


def put(repo: str, cfg: Any) -> None:
    """Save ``cfg`` (a ``transformers.PretrainedConfig``) as the hub cache's entry for ``repo``."""
    d = os.path.join(HUB, "models--" + repo.replace("/", "--"))
    snap = os.path.join(d, "snapshots", REV)
    os.makedirs(snap, exist_ok=True)
    os.makedirs(os.path.join(d, "refs"), exist_ok=True)
    with open(os.path.join(d, "refs", "main"), "w") as f:
        f.write(REV)
    cfg.save_pretrained(snap)
    print(repo, sorted(os.listdir(snap)))


def main() -> None:
    """Write every model vLLM's scheduler and prefix-cache tests name."""
    import transformers as T

    put(
        "facebook/opt-125m",
        T.OPTConfig(  # default of vLLM tests/v1/core/utils.py:create_scheduler
            architectures=["OPTForCausalLM"], torch_dtype="float16"
        ),
    )
    put(
        "Qwen/Qwen3-0.6B",
        T.Qwen3Config(
            vocab_size=151936,
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            max_position_embeddings=40960,
            architectures=["Qwen3ForCausalLM"],
            torch_dtype="bfloat16",
        ),
    )
    put(
        "llava-hf/llava-1.5-7b-hf",
        T.LlavaConfig(
            architectures=["LlavaForConditionalGeneration"],
            text_config=T.LlamaConfig(max_position_embeddings=4096),
            torch_dtype="float16",
        ),
    )
    put(
        "Qwen/Qwen2.5-VL-3B-Instruct",
        T.Qwen2_5_VLConfig(
            architectures=["Qwen2_5_VLForConditionalGeneration"], torch_dtype="bfloat16"
        ),
    )
    put(
        "Qwen/Qwen1.5-7B",
        T.Qwen2Config(
            architectures=["Qwen2ForCausalLM"],
            max_position_embeddings=32768,
            torch_dtype="bfloat16",
        ),
    )
    put(
        "Qwen/Qwen3-Next-80B-A3B-Instruct",
        T.Qwen3NextConfig(  # hybrid (linear + full) with MTP
            architectures=["Qwen3NextForCausalLM"],
            intermediate_size=5120,
            max_position_embeddings=262144,
            rope_parameters={
                "rope_type": "default",
                "rope_theta": 10000000.0,
                "partial_rotary_factor": 0.25,
            },
            bos_token_id=151643,
            eos_token_id=151645,
            torch_dtype="bfloat16",
        ),
    )


if __name__ == "__main__":
    main()
