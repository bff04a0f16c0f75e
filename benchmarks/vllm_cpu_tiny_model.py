"""Write a tiny local model directory that a real vLLM engine serves on the CPU with dummy weights.

An OPT-125m-shaped config (no weights: start vLLM with ``load_format="dummy"``) and a small
byte-level BPE tokenizer trained here on made-up text, with a chat template, so ``LLM(...)``
and the OpenAI server accept text prompts and chat messages with no hub access. Outputs are
meaningless; the KV cache is real (``benchmarks/vllm-cpu.md`` has what it runs on).

    python vllm_cpu_tiny_model.py DIR      (in a venv with transformers and tokenizers)
"""

from __future__ import annotations

import random
import sys

#: The words of the tokenizer's training text: prompts made of them tokenize one token a word.
WORDS = [
    "account", "balance", "tenant", "patient", "record", "policy", "loan", "risk", "model",
    "cache", "the", "a", "of", "and", "to", "is", "in", "for", "with", "on",
]  # fmt: skip


def write(out: str) -> None:
    """Write the config and the tokenizer into directory ``out``."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    transformers.OPTConfig(architectures=["OPTForCausalLM"], torch_dtype="float32").save_pretrained(
        out
    )
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
    write(sys.argv[1] if len(sys.argv) > 1 else "tiny-opt")
