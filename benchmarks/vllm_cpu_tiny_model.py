"""Write a tiny local model directory that a real vLLM engine serves on the CPU with dummy weights.

An OPT-125m-shaped config (no weights: start vLLM with ``load_format="dummy"``) and a small
byte-level BPE tokenizer trained here on made-up text, with a chat template, so ``LLM(...)``
and the OpenAI server accept text prompts and chat messages with no hub access. Outputs are
meaningless; the KV cache is real (``benchmarks/vllm-cpu.md`` has what it runs on).

``write_hybrid`` writes a tiny Gemma-2-shaped model instead (the same tokenizer): four
layers alternating sliding-window (64 tokens) and full attention, so vLLM builds two KV
cache groups (its ``HybridKVCacheCoordinator`` with a ``SlidingWindowManager`` and a
``FullAttentionManager``), and a prompt longer than the window slides it.

    python vllm_cpu_tiny_model.py DIR [--hybrid]   (in a venv with transformers and tokenizers)
"""

from __future__ import annotations

import random
import sys

#: The words of the tokenizer's training text: prompts made of them tokenize one token a word.
WORDS = [
    "account", "balance", "tenant", "patient", "record", "policy", "loan", "risk", "model",
    "cache", "the", "a", "of", "and", "to", "is", "in", "for", "with", "on",
]  # fmt: skip


#: The sliding window of the hybrid model's window layers, tokens (two blocks of 32).
HYBRID_WINDOW = 64


def write(out: str) -> None:
    """Write the OPT config and the tokenizer into directory ``out``."""
    import transformers

    transformers.OPTConfig(architectures=["OPTForCausalLM"], torch_dtype="float32").save_pretrained(
        out
    )
    write_tokenizer(out)


def write_hybrid(out: str, window_only: bool = False) -> None:
    """Write the hybrid (Gemma-2-shaped) config and the tokenizer into directory ``out``.

    The shape is that of a tiny Gemma 2 config measured to run on the ``vllm-cpu`` 0.32
    build (kvgov's engine-facts notes, ``tiny-gemma2.json``): hidden 128, 4 heads of 32
    over 2 KV heads, 4 layers alternating sliding (window 64) and full attention, the
    soft-capping Gemma 2 ships with. The vocabulary is sized to this tokenizer.
    ``window_only``: every layer has the window (one sliding-window KV cache group and
    no full-attention layer, as a Mistral with a window on every layer).
    """
    import transformers

    transformers.Gemma2Config(
        architectures=["Gemma2ForCausalLM"],
        vocab_size=1024,  # the tokenizer's 1,000 tokens
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        query_pre_attn_scalar=32,
        sliding_window=HYBRID_WINDOW,
        layer_types=(
            ["sliding_attention"] * 4
            if window_only
            else ["sliding_attention", "full_attention"] * 2
        ),
        attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0,
        max_position_embeddings=2048,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        dtype="float32",
    ).save_pretrained(out)
    write_tokenizer(out)


def write_granite_hybrid(out: str) -> None:
    """Write a tiny GraniteMoeHybrid (Mamba2 + attention) config and the tokenizer into ``out``.

    Four layers, Mamba2 and attention alternating (4 heads of 32 over 2 KV heads; 4 Mamba
    heads of 32 with a 16-wide state, a 4-wide convolution), 2 experts. The ``vllm-cpu``
    0.32 build runs it only with prefix caching off (``benchmarks/vllm-cpu.md``): vLLM then
    builds an attention group of the engine's block size and a Mamba group in
    ``mamba_cache_mode="none"``, one state block per request spanning the model's length.
    """
    import transformers

    transformers.GraniteMoeHybridConfig(
        architectures=["GraniteMoeHybridForCausalLM"],
        vocab_size=1024,  # the tokenizer's 1,000 tokens
        hidden_size=128,
        intermediate_size=256,
        shared_intermediate_size=256,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        layer_types=["mamba", "attention", "mamba", "attention"],
        num_local_experts=2,
        num_experts_per_tok=1,
        mamba_n_heads=4,
        mamba_d_head=32,
        mamba_d_state=16,
        mamba_n_groups=1,
        mamba_d_conv=4,
        mamba_expand=1,
        mamba_chunk_size=64,
        max_position_embeddings=2048,
        position_embedding_type="rope",
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=2,
        dtype="float32",
    ).save_pretrained(out)
    write_tokenizer(out)


#: The tiny Whisper's encoder positions: every request's cross-attention KV spans them
#: (vLLM pads audio to 30 s, 1,500 encoder positions).
WHISPER_ENCODER_TOKENS = 1500


def write_whisper(out: str) -> int:
    """Write a tiny Whisper (encoder-decoder) config, feature extractor and tokenizer.

    One encoder and one decoder layer, 4 heads of 32; the tokenizer is this module's,
    with Whisper's special tokens added (its processor needs them). vLLM builds a
    decoder self-attention group and a cross-attention group (``CrossAttentionManager``,
    ``WHISPER_ENCODER_TOKENS`` per request), and runs it only with prefix caching off.
    Returns the id of ``<|startoftranscript|>``, the decoder prompt.
    """
    import os

    import transformers

    write_tokenizer(out)
    tok = transformers.WhisperTokenizerFast(
        tokenizer_file=os.path.join(out, "tokenizer.json"),
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        pad_token="<|endoftext|>",
    )
    special = ["<|endoftext|>", "<|startoftranscript|>", "<|en|>", "<|transcribe|>"]
    tok.add_special_tokens({"additional_special_tokens": [*special, "<|notimestamps|>"]})
    for name in os.listdir(out):  # the plain tokenizer's files: the Whisper one replaces them
        if name.startswith(("tokenizer", "special_tokens", "chat_template")):
            os.remove(os.path.join(out, name))
    tok.save_pretrained(out)
    start = int(tok.convert_tokens_to_ids("<|startoftranscript|>"))
    end = int(tok.convert_tokens_to_ids("<|endoftext|>"))
    transformers.WhisperConfig(
        architectures=["WhisperForConditionalGeneration"],
        vocab_size=1024,
        num_mel_bins=80,
        d_model=128,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_ffn_dim=256,
        decoder_ffn_dim=256,
        max_source_positions=WHISPER_ENCODER_TOKENS,
        max_target_positions=448,
        decoder_start_token_id=start,
        bos_token_id=end,
        eos_token_id=end,
        pad_token_id=end,
        dtype="float32",
    ).save_pretrained(out)
    transformers.WhisperFeatureExtractor(feature_size=80).save_pretrained(out)
    return start


def write_tokenizer(out: str) -> None:
    """Train the tiny byte-level BPE tokenizer and save it (with a chat template) in ``out``."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(0)
    corpus = [" ".join(rng.choice(WORDS) for _ in range(30)) for _ in range(2000)]
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(
        corpus,
        trainers.BpeTrainer(
            vocab_size=1000,
            special_tokens=["<pad>", "<s>", "</s>", "<unk>"],
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tok = transformers.PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
    )
    tok.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant:"
    )
    tok.save_pretrained(out)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--hybrid"]
    if "--hybrid" in sys.argv[1:]:
        write_hybrid(args[0] if args else "tiny-gemma2")
    else:
        write(args[0] if args else "tiny-opt")
