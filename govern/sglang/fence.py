"""SGLang's internals behind one fence: every private name of SGLang that kvgov touches.

SGLang gives kvgov a public way in (a general plugin, ``register_radix_cache_backend``,
``create_unified_radix_cache(ctx, cache_class=...)``, a subclass of ``UnifiedRadixCache``
that overrides its public methods), but zeroing every page that leaves an owner
needs the allocator re-classed, and for the paged allocator one private path:
``_release_page_ids``, where every page it takes back passes (frees, evictions, the
duplicates an insert exposed); the page-size-1 allocator's is its public ``free``.
This module is the only place in kvgov that reads, writes, calls, overrides or
re-classes a private name of SGLang; ``tests/govern/vllm/test_fence.py`` fails on
one used anywhere else (each engine's private names only in that engine's fence).

:data:`TOUCHED` lists every name, with where it lives in SGLang, why kvgov needs
it and what differs by version; docs/sglang.md's table "What kvgov touches in
SGLang, and why" is checked against it. An upgrade of SGLang starts here.
Needs SGLang only when an accessor runs (the registry reads without it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvgov.exceptions import UnsupportedEngine

from ..touch import Touch

__all__ = [
    "TOUCHED",
    "govern_allocator",
    "govern_host_pool",
    "register_storage_backend",
    "storage_backend_of",
]


_TESTED = "tested on 0.5.23"

#: Every SGLang internal this module touches; docs/sglang.md's table is checked against it.
TOUCHED: tuple[Touch, ...] = (
    Touch(
        "PagedTokenToKVPoolAllocator",
        "re-class",
        "sglang.srt.mem_cache.allocator",
        "the allocator SGLang built becomes a governed subclass in place: the tree, the "
        "scheduler and the KV pool keep pointing at the same object",
        _TESTED,
    ),
    Touch(
        "PagedTokenToKVPoolAllocator._release_page_ids",
        "override",
        "sglang.srt.mem_cache.allocator",
        "every page the allocator takes back passes here (frees, evictions, an insert's "
        "duplicates): noted for zeroing before any alloc can hand it out again",
        _TESTED,
    ),
    Touch(
        "TokenToKVPoolAllocator",
        "re-class",
        "sglang.srt.mem_cache.allocator",
        "the allocator SGLang builds for page size 1 becomes a governed subclass in place, "
        "as the paged one does",
        _TESTED,
    ),
    Touch(
        "TokenToKVPoolAllocator.free",
        "override",
        "sglang.srt.mem_cache.allocator",
        "page size 1 has no _release_page_ids: every slot it takes back passes through "
        "free (free_page_ids and free_group_end call it), noted for zeroing there",
        _TESTED,
    ),
    Touch(
        "HostKVCache",
        "re-class",
        "sglang.srt.mem_cache.pool_host.base",
        "HiCache's host pool becomes a governed subclass in place (the controller and the "
        "tree keep the same object): every page it takes back is zeroed before alloc can "
        "hand it out again",
        _TESTED,
    ),
    Touch(
        "HostKVCache.free",
        "override",
        "sglang.srt.mem_cache.pool_host.base",
        "every host page the tree or the controller frees passes here: zeroed under the "
        "pool's lock, one indexed fill per call (clear zeroes the whole buffer)",
        _TESTED,
    ),
    Touch(
        "StorageBackendFactory._create_builtin_backend",
        "wrap",
        "sglang.srt.mem_cache.storage.backend_factory",
        "a registered backend is built by a fixed list of names, so the name kvgov "
        "(StorageBackendFactory.register_backend) builds kvgov's backend here; every other "
        "name goes to SGLang's own",
        _TESTED,
    ),
    Touch(
        "StorageBackendFactory._registry",
        "read",
        "sglang.srt.mem_cache.storage.backend_factory",
        "registering the name kvgov twice is a no-op (the factory warns and overwrites)",
        _TESTED,
    ),
    Touch(
        "HiCacheStorageFailureInjector._backend",
        "read",
        "sglang.srt.mem_cache.hicache_storage",
        "SGLang's test hook wraps the storage backend; the governed cache checks the "
        "backend inside",
        _TESTED,
    ),
)


# ---------------------------------------------------------------------- the allocator


def govern_allocator(
    allocator: Any, release: Callable[[Any], None], flush: Callable[[], Any]
) -> None:
    """Re-class SGLang's allocator in place: released pages are noted, zeroed before reuse.

    Args:
        allocator: SGLang's ``PagedTokenToKVPoolAllocator`` or, for page size 1, its
            ``TokenToKVPoolAllocator`` (or a subclass of either).
        release: called with each tensor of page ids the allocator takes back (page
            size 1: slot ids, which are its page ids).
        flush: called before every ``alloc*`` (zeroes what is pending; cheap when nothing is).

    Raises:
        UnsupportedEngine: another allocator (hybrid SWA, Mamba, sparse, ...).
    """
    base = type(allocator)
    if base in _GOVERNED.values():  # governed already (a second cache on the same pool)
        base = base.__mro__[1]
    cls = _GOVERNED.get(base)
    if cls is None:
        from sglang.srt.mem_cache.allocator import (
            PagedTokenToKVPoolAllocator,
            TokenToKVPoolAllocator,
        )

        if issubclass(base, PagedTokenToKVPoolAllocator):
            methods = {"_release_page_ids": _releasing(base._release_page_ids)}
        elif issubclass(base, TokenToKVPoolAllocator) and int(allocator.page_size) == 1:
            methods = {"free": _freeing(base.free)}
        else:
            raise UnsupportedEngine(
                f"the allocator {base.__name__}",
                "run a full-attention model (SGLang's paged or page-size-1 allocator)",
            )
        for name in _ALLOCS:
            if hasattr(base, name):
                methods[name] = _flushing(name, getattr(base, name))
        cls = type(f"Governed{base.__name__}", (base,), dict(methods))
        _GOVERNED[base] = cls
    allocator.kvgov_release = release
    allocator.kvgov_flush = flush
    allocator.__class__ = cls


_GOVERNED: dict[type, type] = {}


# Each governed method calls its base class's own (captured when the class is made: the
# allocator's path, per call, is one Python frame more than SGLang's own).


def _releasing(inner: Callable[..., None]) -> Callable[..., None]:
    def _release_page_ids(self: Any, *page_ids: Any) -> None:
        release = self.kvgov_release
        for ids in page_ids:
            release(ids)
        inner(self, *page_ids)

    return _release_page_ids


def _flushing(name: str, inner: Callable[..., Any]) -> Callable[..., Any]:
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        self.kvgov_flush()
        return inner(self, *args, **kwargs)

    call.__name__ = name
    return call


def _freeing(inner: Callable[[Any, Any], None]) -> Callable[[Any, Any], None]:
    def free(self: Any, free_index: Any) -> None:
        # a free group defers the slots to free_group_end, which frees them through here
        if self.free_group is None and free_index.numel():
            self.kvgov_release(free_index)
        inner(self, free_index)

    return free


#: The allocation calls: each zeroes what is pending before it hands out anything.
_ALLOCS = ("alloc", "alloc_extend", "alloc_decode")


# ---------------------------------------------------------------------- HiCache


def govern_host_pool(pool: Any, zeroer: Any) -> None:
    """Re-class SGLang's HiCache host pool in place: every page it takes back is zeroed.

    ``free`` zeroes the slots it took back (``zeroer.zero``: one indexed fill) under the
    pool's own lock, so no ``alloc`` can hand them out first; ``clear`` zeroes the whole
    buffer (``zeroer.zero_all``).

    Args:
        pool: a ``HostKVCache`` (SGLang's MHA or MLA host pool).
        zeroer: a :class:`~kvgov.govern.sglang.host_pool.HostPoolZeroer` of ``pool``.

    Raises:
        UnsupportedEngine: not a ``HostKVCache``, or one whose ``free`` kvgov did not wrap.
    """
    from sglang.srt.mem_cache.pool_host.base import HostKVCache

    base = type(pool)
    if base in _GOVERNED_HOST.values():
        base = base.__mro__[1]
    if not isinstance(pool, HostKVCache) or not hasattr(pool, "lock"):
        raise UnsupportedEngine(
            f"a HiCache host pool {base.__name__}", "use SGLang's MHA or MLA host pool"
        )
    cls = _GOVERNED_HOST.get(base)
    if cls is None:
        cls = type(
            f"Governed{base.__name__}",
            (base,),
            {"free": _host_freeing(base.free), "clear": _host_clearing(base.clear)},
        )
        _GOVERNED_HOST[base] = cls
    pool.kvgov_zeroer = zeroer
    pool.__class__ = cls


_GOVERNED_HOST: dict[type, type] = {}


def _host_freeing(inner: Callable[[Any, Any], int]) -> Callable[[Any, Any], int]:
    def free(self: Any, indices: Any) -> int:
        with self.lock:  # SGLang's pool lock (re-entrant): no alloc between free and fill
            n = inner(self, indices)
            if n:
                self.kvgov_zeroer.zero(indices)
            return n

    return free


def _host_clearing(inner: Callable[[Any], None]) -> Callable[[Any], None]:
    def clear(self: Any) -> None:
        with self.lock:
            inner(self)
            zeroer = getattr(self, "kvgov_zeroer", None)
            if zeroer is not None:
                zeroer.zero_all()

    return clear


def storage_backend_of(controller: Any) -> Any:
    """The HiCache controller's storage backend (SGLang's test wrapper looked through)."""
    backend = getattr(controller, "storage_backend", None)
    if not getattr(controller, "enable_storage", False):
        return None
    inner = getattr(backend, "_backend", None)
    return backend if inner is None else inner


def register_storage_backend(name: str, module_path: str, class_name: str) -> None:
    """Register kvgov's L3 backend with SGLang's ``StorageBackendFactory`` under ``name``.

    SGLang's factory builds a registered backend only if its name is one of its own
    (``_create_builtin_backend``); the wrap builds ``name`` as a dynamic backend is
    built (``backend_class(storage_config, {})``) and leaves every other name to SGLang.
    Registering twice is a no-op.
    """
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    factory: Any = StorageBackendFactory
    if name not in factory._registry:
        factory.register_backend(name, module_path, class_name)
    inner = factory.__dict__["_create_builtin_backend"].__func__
    if getattr(inner, "kvgov_names", None) is not None:
        inner.kvgov_names.add(name)
        return

    def _create_builtin_backend(
        cls: Any, backend_name: str, backend_class: Any, storage_config: Any, mem_pool_host: Any
    ) -> Any:
        if backend_name in names:
            return backend_class(storage_config, {})
        return inner(cls, backend_name, backend_class, storage_config, mem_pool_host)

    names = {name}
    _create_builtin_backend.kvgov_names = names  # type: ignore[attr-defined]
    factory._create_builtin_backend = classmethod(_create_builtin_backend)
