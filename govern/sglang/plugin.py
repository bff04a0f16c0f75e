"""The SGLang general plugin (entry point ``kvgov`` in ``sglang.srt.plugins``).

SGLang runs it in the engine and in every scheduler process; it registers the
``kvgov`` radix-cache backend, which an operator selects with
``--radix-cache-backend kvgov``, and the ``kvgov`` HiCache storage backend with
SGLang's ``StorageBackendFactory`` (kvgov's encrypted L3 tier, :mod:`.storage`;
docs/sglang.md). Registering twice is a no-op.
"""

from __future__ import annotations

__all__ = ["BACKEND", "STORAGE_CLASS", "STORAGE_MODULE", "register"]

#: The name of the backend: ``--radix-cache-backend kvgov``; the HiCache storage backend's too.
BACKEND = "kvgov"
#: Where kvgov's HiCache storage backend lives (SGLang's dynamic entry names both).
STORAGE_MODULE = "kvgov.govern.sglang.storage"
STORAGE_CLASS = "GovernedHiCacheStorage"


def register() -> None:
    """Register the ``kvgov`` radix-cache backend and the ``kvgov`` HiCache storage backend."""
    from sglang.srt.mem_cache.registry import (
        register_radix_cache_backend,
        registered_radix_cache_backends,
    )

    from . import fence
    from .cache import kvgov_radix_cache_factory

    if BACKEND not in registered_radix_cache_backends():
        register_radix_cache_backend(BACKEND, kvgov_radix_cache_factory)
    fence.register_storage_backend(BACKEND, STORAGE_MODULE, STORAGE_CLASS)
