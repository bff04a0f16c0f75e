"""Speculative decoding on a real engine: vLLM's n-gram proposer (3 draft tokens), governed.

The n-gram proposer runs on the CPU build (no drafter model, and no lookahead block
hashing, which is EAGLE's and MTP's: the draft tokens are scheduled as the request's next
tokens, their KV written into its blocks, a rejected draft's slots written again), so the
governed engine must keep the same guarantees with it on. Stock and governed
``LLM(...)`` on the tiny OPT model, one engine each for the module:

* the drafter really drafts: the governed engine's ``vllm:spec_decode_num_draft_tokens``
  grows over repetitive prompts (the proposer matches their n-grams);
* a second tenant's request of a prompt is served 0 cached tokens (stock, the control:
  192), the first tenant's second request hits its own;
* after requests with drafts every block holding KV is one the cache keeps, and after
  vLLM's ``reset_prefix_cache`` governed reads all zero (stock keeps the KV).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from vllm_cpu_env import prompt

from . import conftest
from .conftest import engine_pair, start_llm

pytestmark = [pytest.mark.vllm, pytest.mark.vllm_e2e]

NUM_BLOCKS = 61
SPECULATIVE = {
    "method": "ngram",
    "num_speculative_tokens": 3,
    "prompt_lookup_min": 2,
    "prompt_lookup_max": 3,
}


def _start(model: Path, governed: bool, audit_url: str) -> Any:
    return start_llm(
        model,
        governed,
        {"audit_url": audit_url, "model_revision": "r1"},
        served_model_name="governed" if governed else "stock",  # the metrics' label
        num_gpu_blocks_override=NUM_BLOCKS,
        speculative_config=dict(SPECULATIVE),
        disable_log_stats=False,  # the draft counters
    )


class Engines(conftest.Engines):
    def drafts(self) -> int:
        """The governed engine's draft tokens so far."""
        return sum(
            int(getattr(m, "value", 0))
            for m in self.by_name["governed"].get_metrics()
            if m.name == "vllm:spec_decode_num_draft_tokens"
            and m.labels.get("model_name") == "governed"
        )


@pytest.fixture(scope="module")
def engines(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Engines]:
    audit_url = f"sqlite:///{tmp_path_factory.mktemp('ngram') / 'audit.db'}"
    with engine_pair(lambda governed: _start(tiny_model, governed, audit_url)) as pair:
        yield Engines(*pair)


def test_governed_ngram_speculation_keeps_isolation_and_zeroing(engines: Engines) -> None:
    drafts0 = engines.drafts()
    # a repetitive prompt: the proposer finds its n-grams and drafts 3 tokens a step
    text = " ".join(["loan risk model cache"] * 50)  # 200 tokens
    hits = {
        name: [
            engines.generate(name, text, "acme", max_tokens=40),
            engines.generate(name, text, "globex", max_tokens=40),
            engines.generate(name, text, "acme", max_tokens=40),
        ]
        for name in engines.by_name
    }
    for i in range(3):  # tails and drafts over distinct prompts too
        for name in engines.by_name:
            engines.generate(name, prompt(f"ngram {i}", 150) + " " + text[:100], "initech", 60)
    drafted = engines.drafts() - drafts0
    print(f"\ncached tokens acme, globex, acme: {hits}; governed draft tokens {drafted}")
    assert drafted > 0, "the n-gram proposer drafted on the governed engine"
    assert hits["stock"][1] > 0, "control: stock serves globex acme's KV"
    assert hits["governed"][1] == 0
    assert hits["governed"][2] > 0
    assert engines.remnants() == []
    stock, governed = engines.after_reset("stock"), engines.after_reset("governed")
    print(f"after reset_prefix_cache, blocks holding KV: stock {len(stock)}, governed {governed}")
    assert stock, "control: stock leaves the KV of blocks that left their owner"
    assert governed == []
