"""The vLLM binding's refusals: :mod:`kvgov.govern.refusal`, shared with every binding."""

from __future__ import annotations

from ..refusal import (
    CLAIM_CHARS,
    ERROR_PATH,
    REASON_CHARS,
    SCOPE_PATH,
    describe_error,
    printable,
    refusal_event,
    refuse,
)

__all__ = [
    "CLAIM_CHARS",
    "ERROR_PATH",
    "REASON_CHARS",
    "SCOPE_PATH",
    "describe_error",
    "printable",
    "refusal_event",
    "refuse",
]
