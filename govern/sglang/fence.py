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

__all__ = ["TOUCHED", "govern_allocator"]


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
