"""SGLang's ``UnifiedRadixCache``, governed: :class:`GovernedUnifiedRadixCache`.

Behaviour within one namespace is SGLang's (the same tree, the same matches,
locks, evictions and checkpoints); what changes:

* every request is admitted once, the first time the tree sees it (``match_prefix``
  with its ``req``, or ``checkpoint``): its ``extra_key`` becomes its kvgov tree
  namespace (:func:`kvgov.govern.sglang.keys.tree_namespace`) and its
  ``cache_salt`` None, so every key SGLang builds from the request afterwards
  (match, insert, checkpoint) lies in the namespace kvgov chose; a key whose
  ``extra_key`` kvgov did not issue matches nothing and is inserted in a
  namespace of its own;
* the pages the tree takes are recorded as owned by the scope of the request that
  inserts them (``checkpoint(req)``, SGLang's scheduler's insert), never guessed
  from the namespace: in a share group's namespace several tenants' scopes meet. A
  bare ``insert`` (a key, no request) is attributed only where the namespace has
  one possible owner (one scope admitted into it), and refused
  (:class:`~kvgov.exceptions.InvalidArgument`, the tree untouched) where it has more;
* a hit (``match_prefix`` with its ``req``) is audited as reused; in a share
  group's namespace each owner of another tenant is judged by the sharing policy
  and the hit cut at the first refused page (SGLang matches again up to there);
* the allocator is re-classed in place: every page it takes back
  (``_release_page_ids``: frees, evictions, duplicates an insert exposed) is
  zeroed in every layer's K and V before any ``alloc*`` can hand it out again,
  all pages released since the last allocation in one indexed fill per layer
  (per buffer where a layer's K and V are not one allocation's halves), and
  audited (``zeroization``, per owner).

:func:`kvgov_radix_cache_factory` is the ``kvgov`` radix-cache backend
(:mod:`.plugin` registers it); it refuses HiCache and KV events at start.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from typing import Any

import torch
from sglang.srt.mem_cache.base_prefix_cache import (
    EvictParams,
    InsertParams,
    InsertResult,
    MatchPrefixParams,
)
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

from kvgov.defaults import UNVERSIONED
from kvgov.exceptions import InvalidArgument, UnsupportedEngine

from ..scope import CacheScope
from ..scope_resolver import EngineScope, revision_of
from . import fence
from .governance import Admitted, SglangGovernance
from .keys import NAMESPACE_PREFIX

__all__ = [
    "GovernedUnifiedRadixCache",
    "check_engine",
    "check_params",
    "kvgov_radix_cache_factory",
]

#: The namespace of keys kvgov did not issue, for matching: nothing is ever inserted there.
_UNSCOPED = NAMESPACE_PREFIX + "unscoped"
#: The prefix of a namespace of its own (a refused request's, an unissued key's insert).
_PRIVATE = NAMESPACE_PREFIX + "private:"
_ADMITTED = "_kvgov_admitted"
#: A namespace's owner where more than one scope was admitted into it (a share group's).
_SEVERAL: tuple[CacheScope | None, float | None] = (None, None)


class GovernedUnifiedRadixCache(UnifiedRadixCache):
    """SGLang's unified radix cache under kvgov (see the module docstring).

    Class attributes set before construction (the factory sets them): ``kvgov_engine``
    (model and tokenizer of every scope) and ``kvgov_environ`` (the settings).
    """

    kvgov_engine = EngineScope(UNVERSIONED, UNVERSIONED, UNVERSIONED, UNVERSIONED)
    kvgov_environ: Mapping[str, str] | None = None

    def __init__(self, params: Any) -> None:
        check_params(params)
        super().__init__(params)
        allocator = params.token_to_kv_pool_allocator
        kv = allocator.get_kvcache()
        buffers = _kv_buffers(kv)
        # kvgov's page is the allocator's (what it hands out and takes back); the tree's
        # page is a multiple of it (equal but under test fixtures that pair a paged tree
        # with SGLang's page-size-1 allocator)
        unit = int(allocator.page_size)
        if unit <= 0 or int(params.page_size) % unit:
            raise UnsupportedEngine(
                f"a tree page of {params.page_size} tokens over allocator pages of {unit}",
                "use the allocator SGLang builds for the tree's page size",
            )
        self.kvgov_unit = unit
        self.kvgov = SglangGovernance.open(
            allocator=allocator,
            buffers=buffers,
            page_size=unit,
            num_pages=int(allocator.size) // unit,
            engine=self.kvgov_engine,
            environ=dict(os.environ if self.kvgov_environ is None else self.kvgov_environ),
        )
        # live namespace -> scope and retention of the requests admitted into it, while
        # one scope was; _SEVERAL once several were (a share group's: no one owner)
        self.kvgov_namespaces: dict[str, tuple[CacheScope | None, float | None]] = {}
        #: the admission of the request whose checkpoint is inserting now (None: none)
        self.kvgov_inserting: Admitted | None = None
        fence.govern_allocator(allocator, self.kvgov.zeroer.release, self.kvgov.zeroer.flush)
        self.kvgov.adapter.evict_unlocked = self.kvgov_evict_unlocked
        self.kvgov.on_retired = self.kvgov_retire

    # ------------------------------------------------------------------ keys

    def kvgov_admit(self, req: Any) -> str:
        """The request's namespace, admitting it the first time (rewrites its keys)."""
        adm: Admitted | None = getattr(req, _ADMITTED, None)
        if adm is not None:
            return adm.namespace
        adm = self.kvgov.admit(req)
        ns = adm.namespace
        scope = adm.scope
        if scope is not None:
            known = self.kvgov_namespaces.get(ns)
            if known is None or known[0] is scope or (known[0] is not None and known[0] == scope):
                self.kvgov_namespaces[ns] = (scope, adm.ttl)
            else:  # another scope's namespace too (a share group's): owners come per insert
                self.kvgov_namespaces[ns] = _SEVERAL
        req.extra_key = ns
        req.cache_salt = None
        setattr(req, _ADMITTED, adm)
        return ns

    def _kvgov_key(self, key: RadixKey, ns: Any, *, inserting: bool) -> RadixKey:
        """``key`` in namespace ``ns`` if kvgov issued it and it is live, else in none.

        A namespace kvgov did not issue, or one an erasure retired, matches nothing
        (``_UNSCOPED``) and is inserted in a private namespace of its own.
        """
        if ns not in self.kvgov_namespaces and not (
            isinstance(ns, str) and ns.startswith(_PRIVATE)
        ):
            ns = f"{_PRIVATE}{uuid.uuid4().hex}" if inserting else _UNSCOPED
        if key.extra_key == ns and key.cache_salt is None:
            return key
        return RadixKey(
            key.token_ids, ns, is_bigram=key.is_bigram, limit=key.limit, cache_salt=None
        )

    def match_prefix(self, params: MatchPrefixParams) -> Any:
        req = params.req
        key = params.key
        if req is None:
            params.key = self._kvgov_key(key, key.extra_key, inserting=False)
            return super().match_prefix(params)
        adm: Admitted | None = getattr(req, _ADMITTED, None)
        if adm is None:
            self.kvgov_admit(req)
            adm = getattr(req, _ADMITTED)
        params.key = key = self._kvgov_key(key, adm.namespace, inserting=False)
        result = super().match_prefix(params)
        n = result.device_prefix_len
        if not n or adm.view is None or key.extra_key != adm.namespace:
            return result
        unit = self.kvgov_unit
        n = int(n)
        if not adm.shared and n // unit <= adm.reused:
            return result  # its own tenant's pages, every one audited at an earlier match
        # the hit's pages, judged per owner in a share group and audited as reused;
        # a refused owner cuts the hit: SGLang matches again up to the kept pages, so
        # the node the scheduler locks is the end of what the request may use
        slots = self.path_device_indices(result.last_device_node)[:n:unit].tolist()
        pages = [slot // unit for slot in slots]
        keep = self.kvgov.judge_hit(adm, pages)
        if keep < len(pages):
            cut = keep * unit
            params.key = RadixKey(
                key.token_ids,
                key.extra_key,
                is_bigram=key.is_bigram,
                limit=cut - cut % self.page_size,
                cache_salt=None,
            )
            result = super().match_prefix(params)
        return result

    def touch_prefix(self, key: RadixKey) -> None:
        super().touch_prefix(self._kvgov_key(key, key.extra_key, inserting=False))

    def checkpoint(self, req: Any, *, up_to: int, **kwargs: Any) -> None:
        self.kvgov_admit(req)
        outer = self.kvgov_inserting
        # the pages its inserts add are this request's (see _kvgov_owner)
        self.kvgov_inserting = getattr(req, _ADMITTED)
        try:
            super().checkpoint(req, up_to=up_to, **kwargs)
        finally:
            self.kvgov_inserting = outer

    def _kvgov_owner(self, ns: Any) -> tuple[CacheScope, float | None] | None:
        """Scope and retention of the pages an insert into ``ns`` adds (None: no owner).

        The inserting request's (inside its ``checkpoint``); without one, the
        namespace's one possible owner. A namespace kvgov does not hold live (a
        private or retired one) has none.

        Raises:
            InvalidArgument: no inserting request in a namespace several scopes were
                admitted into, or an inserting request whose own namespace is not
                ``ns``: the owner would be a guess.
        """
        known = self.kvgov_namespaces.get(ns)
        if known is None:
            return None
        adm = self.kvgov_inserting
        if adm is not None and adm.namespace == ns and adm.scope is not None:
            return adm.scope, adm.ttl
        scope, ttl = known
        if adm is None and scope is not None:
            return scope, ttl
        raise InvalidArgument(
            "key.extra_key",
            ns,
            "pages inserted into a namespace without the request that owns them "
            "(several scopes share it, or it is not the inserting request's): "
            "insert through checkpoint(req)",
        )

    def insert(self, params: InsertParams) -> InsertResult:
        key = params.key
        if key is None:
            return super().insert(params)
        params.key = key = self._kvgov_key(key, key.extra_key, inserting=True)
        owner = self._kvgov_owner(key.extra_key)  # before the tree takes anything
        result = super().insert(params)
        value = params.value
        if owner is not None and isinstance(value, torch.Tensor):
            # the pages past the matched prefix (already owned) are the request's new ones;
            # a value is page-aligned, so its every unit-th slot names each page once
            page = self.kvgov_unit
            start = int(params.prev_prefix_len or 0)
            start -= start % page
            if value.numel() > start:
                self.kvgov.owned([slot // page for slot in value[start::page].tolist()], *owner)
        return result

    def init_hicache(self, server_args: Any, params: Any) -> None:
        """Refused: HiCache's host and storage tiers would keep KV in plaintext.

        Raises:
            UnsupportedEngine: always.
        """
        raise UnsupportedEngine(_HICACHE, "run without --enable-hierarchical-cache")

    def reset(self) -> None:
        super().reset()
        if hasattr(self, "kvgov"):
            self.kvgov.zeroer.flush()

    def kvgov_evict_unlocked(self) -> int:
        """Evict every page of the tree no running request holds (SGLang's own eviction walk).

        SGLang's tree core offers no eviction of chosen nodes, so an erasure evicts
        every unlocked page; the pages it frees are zeroed by the caller. Returns the
        tokens evicted.
        """
        size = int(self.evictable_size())
        if size <= 0:
            return 0
        return int(self.evict(EvictParams(num_tokens=size)).num_tokens_evicted)

    def kvgov_retire(self, namespaces: set[str]) -> None:
        """Forget namespaces an erasure retired: their keys match nothing from now on."""
        for ns in namespaces:
            self.kvgov_namespaces.pop(ns, None)

    def kvgov_close(self) -> None:
        """Zero what is pending and close the audit trail."""
        self.kvgov.close()


def _kv_buffers(kv: Any) -> list[torch.Tensor]:
    """Every layer's K and V tensors of SGLang's device KV pool (MHA), or MLA's KV."""
    names = (
        ("k_buffer", "v_buffer") if getattr(kv, "k_buffer", None) is not None else ("kv_buffer",)
    )
    buffers: list[torch.Tensor] = []
    for name in names:
        layers = getattr(kv, name, None)
        if not isinstance(layers, list | tuple) or not all(
            isinstance(t, torch.Tensor) for t in layers
        ):
            raise UnsupportedEngine(
                f"a KV pool of type {type(kv).__name__} (no per-layer {name})",
                "serve a model with an MHA or MLA KV pool",
            )
        buffers.extend(layers)
    return buffers


_HICACHE = (
    "HiCache (--enable-hierarchical-cache): SGLang's host and storage tiers keep "
    "plaintext KV and its storage backends name pages by unkeyed hashes"
)


def check_params(params: Any) -> None:
    """Refuse a tree kvgov cannot govern (the cache's own check, before it is built).

    Raises:
        UnsupportedEngine: a disabled tree (SGLang serves ``--disable-radix-cache``
            with its chunk cache, which kvgov does not zero), KV cache events (they
            publish cached pages' token ids), or a tree of other components than
            full attention (SWA, Mamba: hybrid models).
    """
    if getattr(params, "disable", False):
        raise UnsupportedEngine(
            "a disabled radix cache (nothing would zero the pages it frees)",
            "serve with the radix cache on (without --disable-radix-cache)",
        )
    if getattr(params, "enable_kv_cache_events", False):
        raise UnsupportedEngine(
            "KV cache events (--kv-events-config): they publish cached pages' token ids",
            "run without --kv-events-config",
        )
    components = getattr(params, "tree_components", None)
    if components is not None and {getattr(c, "name", c) for c in components} != {"FULL"}:
        names = sorted(str(getattr(c, "name", c)) for c in components)
        raise UnsupportedEngine(
            f"a radix tree of components {names} (a hybrid SWA or Mamba model)",
            "serve a full-attention model",
        )


def check_engine(ctx: Any) -> None:
    """Refuse, at start, what would let KV or token ids leave ungoverned.

    Raises:
        UnsupportedEngine: HiCache (host or storage tiers: kvgov's encrypted tier is not
            yet registered as an SGLang storage backend, and SGLang writes plaintext
            pages), KV cache events (they publish cached token ids), a hybrid model.
    """
    if getattr(ctx, "enable_hierarchical_cache", False):
        raise UnsupportedEngine(_HICACHE, "run without --enable-hierarchical-cache")
    check_params(ctx.params)
    if getattr(ctx, "is_hybrid_swa", False) or getattr(ctx, "is_hybrid_ssm", False):
        raise UnsupportedEngine("a hybrid (SWA or Mamba) model", "serve a full-attention model")


def kvgov_radix_cache_factory(ctx: Any) -> Any:
    """The ``kvgov`` radix-cache backend: checks the engine, builds the governed cache."""
    from sglang.srt.mem_cache.registry import create_unified_radix_cache

    check_engine(ctx)
    server_args = ctx.server_args
    model = getattr(server_args, "model_path", None)
    tokenizer = getattr(server_args, "tokenizer_path", None) or model
    GovernedUnifiedRadixCache.kvgov_engine = EngineScope(
        model=revision_of(model),
        model_revision=revision_of(getattr(server_args, "revision", None)),
        tokenizer=revision_of(tokenizer),
        tokenizer_revision=revision_of(getattr(server_args, "revision", None)),
    )
    return create_unified_radix_cache(ctx, cache_class=GovernedUnifiedRadixCache)
