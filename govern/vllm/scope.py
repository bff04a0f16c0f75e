"""A vLLM request's cache scope: :mod:`kvgov.govern.scope_resolver`, shared with every binding.

vLLM passes the scope fields in ``sampling_params.extra_args`` (the OpenAI server's
``vllm_xargs``) and the adapter in ``lora_request``.
"""

from __future__ import annotations

from ..scope_resolver import (
    CLASSIFICATION_KEY,
    SCOPE_KEYS,
    TEMPLATE_KEY,
    TENANT_KEY,
    TOKEN_KEY,
    EngineScope,
    ScopeResolver,
    revision_of,
)

__all__ = [
    "CLASSIFICATION_KEY",
    "SCOPE_KEYS",
    "TEMPLATE_KEY",
    "TENANT_KEY",
    "TOKEN_KEY",
    "EngineScope",
    "ScopeResolver",
    "revision_of",
]
