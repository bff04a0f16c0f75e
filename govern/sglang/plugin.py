"""The SGLang general plugin (entry point ``kvgov`` in ``sglang.srt.plugins``).

SGLang runs it in the engine and in every scheduler process; it registers the
``kvgov`` radix-cache backend, which an operator selects with
``--radix-cache-backend kvgov`` (docs/sglang.md). Registering twice is a no-op.
"""

from __future__ import annotations

__all__ = ["BACKEND", "register"]

#: The name of the backend: ``--radix-cache-backend kvgov``.
BACKEND = "kvgov"


def register() -> None:
    """Register the ``kvgov`` radix-cache backend with SGLang's registry."""
    from sglang.srt.mem_cache.registry import (
        register_radix_cache_backend,
        registered_radix_cache_backends,
    )

    from .cache import kvgov_radix_cache_factory

    if BACKEND not in registered_radix_cache_backends():
        register_radix_cache_backend(BACKEND, kvgov_radix_cache_factory)
