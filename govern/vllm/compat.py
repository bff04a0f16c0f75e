"""Everything that differs between the vLLM minors the binding supports (0.32 and 0.33).

The rest of :mod:`kvgov.govern.vllm` is the same code on both. What differs,
and what the binding does about it:

* ``EngineCoreOutput.error`` (a ``RequestError``) exists only in 0.33: there a
  refused request reaches an OpenAI client as HTTP 400 with kvgov's reason
  (``validation_error``). 0.32 has no such field and would answer HTTP 500
  without a reason, so the general plugin installs a shim in the API process
  that answers HTTP 403 with the reason (:func:`needs_frontend_shim`).
* ``num_hash_lookahead_tokens`` (EAGLE/MTP lookahead hashing) exists only in
  0.33; the binding refuses it when non-zero (:func:`hash_lookahead_tokens`).
* ``get_request_block_hasher`` takes a third argument in 0.33; the plugin's
  replacement takes ``*args``.
* ``BlockPool.free_blocks`` / ``touch`` handle the null block in a different
  order; the governed pool's post-pass skips it either way.

Any other minor is refused at start (:func:`check_version`).
"""

from __future__ import annotations

from typing import Any

import vllm
from vllm.v1.core.kv_cache_utils import generate_block_hash_extra_keys
from vllm.v1.engine import EngineCoreOutput, FinishReason

from kvgov.exceptions import UnsupportedEngine

__all__ = [
    "HAS_OUTPUT_ERROR",
    "SUPPORTED_MINORS",
    "VLLM_VERSION",
    "block_extra_keys",
    "check_version",
    "error_output",
    "hash_lookahead_tokens",
    "needs_frontend_shim",
]

#: The installed vLLM's version string.
VLLM_VERSION: str = vllm.__version__
#: The (major, minor) versions the binding is tested on.
SUPPORTED_MINORS = ((0, 32), (0, 33))
#: Whether a finished output can carry a ``RequestError`` (0.33).
HAS_OUTPUT_ERROR: bool = "error" in EngineCoreOutput.__struct_fields__

#: vLLM's extra keys of one block (LoRA, multimodal items, cache salt, prompt
#: embeddings): ``(request, start, end, start_mm_idx) -> (keys or None, next_mm_idx)``;
#: the same function and shapes in both minors.
block_extra_keys = generate_block_hash_extra_keys


def _minor(version: str) -> tuple[int, ...]:
    parts = []
    for piece in version.split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else -1)
    return tuple(parts)


def check_version(version: str = VLLM_VERSION) -> None:
    """Refuse a vLLM minor the binding was not tested on.

    Raises:
        UnsupportedEngine: the version is not 0.32.x or 0.33.x.
    """
    if _minor(version) not in SUPPORTED_MINORS:
        raise UnsupportedEngine(
            f"vLLM {version}",
            "install a tested version: pip install 'kvgov[vllm]' (vLLM 0.32.x or 0.33.x)",
        )


def needs_frontend_shim() -> bool:
    """Whether refusals need the API-process shim to reach clients with a reason (0.32)."""
    return not HAS_OUTPUT_ERROR


def hash_lookahead_tokens(vllm_config: Any) -> int:
    """Tokens after each block its hash covers (0.33's EAGLE/MTP lookahead; 0 on 0.32)."""
    return int(getattr(vllm_config, "num_hash_lookahead_tokens", 0) or 0)


def error_output(request: Any, message: str) -> EngineCoreOutput:
    """The output that finishes a refused request with a reason its client can read.

    Args:
        request: the vLLM ``Request``.
        message: the reason, starting with ``kvgov:``.

    Returns:
        An ``EngineCoreOutput`` with ``FinishReason.ERROR`` and ``stop_reason``
        set to the message; on 0.33 also ``error=RequestError("validation_error",
        message)`` (HTTP 400 with the message).
    """
    kwargs: dict[str, Any] = {
        "request_id": request.request_id,
        "new_token_ids": [],
        "finish_reason": FinishReason.ERROR,
        "stop_reason": message,
        "events": request.take_events(),
        "trace_headers": request.trace_headers,
    }
    if HAS_OUTPUT_ERROR:
        from vllm.outputs import RequestError

        kwargs["error"] = RequestError(code="validation_error", message=message)
    return EngineCoreOutput(**kwargs)
