"""Sample policy inputs shared by the policy tests and benchmarks/bench_policy.py."""

from __future__ import annotations

from typing import Any

#: A valid internal scope of tenant acme, no adapter.
SCOPE: dict[str, Any] = {
    "tenant": "acme",
    "classification": "internal",
    "model": "llama-3-8b",
    "model_revision": "r1",
    "adapter": None,
    "adapter_revision": None,
    "tokenizer": "llama3",
    "tokenizer_revision": "v1",
    "template_version": "sys-v3",
}
