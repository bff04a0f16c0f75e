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
  and the hit cut at the first refused page (SGLang matches again up to there).
  A request first seen by a match has its ``admission`` event written right after
  that match (before it can use a page), and where the hit is only its own scope's
  pages, that event holds the reuse (``SglangGovernance.fold_own_reuse``);
* the allocator is re-classed in place: every page it takes back
  (``_release_page_ids``: frees, evictions, duplicates an insert exposed) is
  zeroed in every layer's K and V before any ``alloc*`` can hand it out again,
  all pages released since the last allocation in one indexed fill per layer
  (per buffer where a layer's K and V are not one allocation's halves), and
  audited (``zeroization``, per owner);
* with HiCache, the device pages a load back from host memory takes are owned by the
  node namespace's one scope and their reuse audited; in a namespace without one owner
  (a share group's) host copies are not loaded back (:meth:`load_back`).

:func:`kvgov_radix_cache_factory` is the ``kvgov`` radix-cache backend
(:mod:`.plugin` registers it); it refuses HiCache and KV events at start.
"""

from __future__ import annotations

import json
import logging
import os
import uuid
from collections.abc import Iterator, Mapping
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
from sglang.srt.mem_cache.utils import get_storage_hash_str

from kvgov.defaults import UNVERSIONED
from kvgov.exceptions import InvalidArgument, UnsupportedEngine

from ..scope import CacheScope
from ..scope_resolver import EngineScope, revision_of
from . import fence
from .governance import Admitted, SglangGovernance, page_ids
from .host_pool import HostPoolZeroer
from .keys import NAMESPACE_PREFIX
from .storage import BACKEND, GovernedHiCacheStorage, StorageOwner

__all__ = [
    "GovernedUnifiedRadixCache",
    "check_engine",
    "check_hicache",
    "check_params",
    "hicache_backend_problem",
    "kvgov_radix_cache_factory",
]

_log = logging.getLogger("kvgov.sglang")

#: The namespace of keys kvgov did not issue, for matching: nothing is ever inserted there.
_UNSCOPED = NAMESPACE_PREFIX + "unscoped"
#: The prefix of a namespace of its own (a refused request's, an unissued key's insert).
_PRIVATE = NAMESPACE_PREFIX + "private:"
_ADMITTED = "_kvgov_admitted"
#: A namespace's owner where more than one scope was admitted into it (a share group's).
_SEVERAL: tuple[CacheScope | None, float | None] = (None, None)
#: L3 owners kept per namespace (see kvgov_storage_owner), then emptied.
_OWNERS_KEPT = 4096


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
        #: kvgov's HiCache L3 backend, once HiCache is on (None: no HiCache)
        self.kvgov_storage: GovernedHiCacheStorage | None = None
        # namespace -> (policy revision, its L3 owner or None): see kvgov_storage_owner
        self.kvgov_owners: dict[str, tuple[str, StorageOwner | None]] = {}
        fence.govern_allocator(allocator, self.kvgov.zeroer.release, self.kvgov.zeroer.flush)
        self.kvgov.adapter.evict_unlocked = self.kvgov_evict_unlocked
        self.kvgov.on_retired = self.kvgov_retire

    # ------------------------------------------------------------------ keys

    def kvgov_admit(self, req: Any, *, defer: bool = False) -> str:
        """The request's namespace, admitting it the first time (rewrites its keys).

        ``defer``: the caller matches the request next and writes its admission event
        after (:meth:`SglangGovernance.record_admission`), whatever happens.
        """
        adm: Admitted | None = getattr(req, _ADMITTED, None)
        if adm is not None:
            return adm.namespace
        adm = self.kvgov.admit(req, defer=defer)
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
            self.kvgov_admit(req, defer=True)
            adm = getattr(req, _ADMITTED)
            if adm.pending is not None:
                return self._kvgov_first_match(params, req, adm)
        params.key = self._kvgov_key(key, adm.namespace, inserting=False)
        return self._kvgov_judged(params, adm, super().match_prefix(params), None)

    def _kvgov_first_match(self, params: MatchPrefixParams, req: Any, adm: Admitted) -> Any:
        """A request's first match, its admission event held back until now.

        The event is written after the match and before the request can use a page,
        the match failing or not; where the hit is only pages of the request's own
        scope it records their reuse too (:meth:`SglangGovernance.record_admission`).
        An admission that cannot be written refuses the request: its namespace is now
        a private one, where the match finds nothing.
        """
        pages: list[int] = []
        try:
            params.key = self._kvgov_key(params.key, adm.namespace, inserting=False)
            result = super().match_prefix(params)
            pages = self._kvgov_hit(params.key, adm, result)
        finally:
            admitted = self.kvgov.record_admission(req, adm, pages)
        if not admitted:
            req.extra_key = adm.namespace
            params.key = self._kvgov_key(params.key, adm.namespace, inserting=False)
            return super().match_prefix(params)
        return self._kvgov_judged(params, adm, result, pages)

    def _kvgov_hit(self, key: RadixKey, adm: Admitted, result: Any) -> list[int]:
        """The page ids of a match's hit, in prefix order, where it is judged (else [])."""
        n = result.device_prefix_len
        if not n or adm.view is None or key.extra_key != adm.namespace:
            return []
        return self._kvgov_path_pages(result.last_device_node, int(n))

    def _kvgov_path_pages(self, node: Any, tokens: int | None = None) -> list[int]:
        """The page ids of the device path to ``node``, in prefix order (its first
        ``tokens`` tokens' pages; None: all)."""
        return page_ids(self.path_device_indices(node), self.kvgov_unit, stop=tokens)

    def _kvgov_judged(
        self, params: MatchPrefixParams, adm: Admitted, result: Any, pages: list[int] | None
    ) -> Any:
        """``result`` cut to what the request may use; its hit judged and audited.

        ``pages``: the hit's pages if already read (:meth:`_kvgov_hit`).
        """
        key = params.key
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
        if pages is None:
            pages = self._kvgov_hit(key, adm, result)
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
                self.kvgov.owned(page_ids(value, page, start=start), *owner)
        return result

    def init_hicache(self, server_args: Any, params: Any) -> None:
        """HiCache, governed: refused unless its L3 backend is kvgov's (:func:`check_hicache`).

        SGLang builds its host pool, controller and storage backend; then every host
        page freed is zeroed before the host allocator hands it out again
        (:func:`fence.govern_host_pool`), and the storage backend, which must be a
        :class:`~kvgov.govern.sglang.storage.GovernedHiCacheStorage`, gets this cache's
        governance. Anything else is torn down and refused.

        Raises:
            UnsupportedEngine: no L3 backend, or another one than kvgov's, or a host
                pool kvgov cannot zero.
        """
        check_hicache(server_args)
        super().init_hicache(server_args, params)
        try:
            self.kvgov_govern_hicache()
        except BaseException:
            self.kvgov_drop_hicache()
            raise

    def kvgov_govern_hicache(self) -> None:
        """Zero the host pool's freed pages; attach the governance to kvgov's L3 backend."""
        controller = self.cache_controller
        if controller is None:
            return
        zero = self.kvgov.host_zeroed
        for pool in _host_pools(controller):
            fence.govern_host_pool(pool, HostPoolZeroer(pool, zero))
        backend = fence.storage_backend_of(controller)
        if backend is None:
            raise UnsupportedEngine(_HICACHE_NO_L3, _HICACHE_USE)
        if not isinstance(backend, GovernedHiCacheStorage):
            raise UnsupportedEngine(
                f"HiCache's L3 storage backend {type(backend).__name__} ({_PLAINTEXT_L3})",
                _HICACHE_USE,
            )
        backend.kvgov_attach(self.kvgov)
        self.kvgov_storage = backend

    def kvgov_drop_hicache(self) -> None:
        """Stop what SGLang's HiCache started (a refused start): storage threads, backend."""
        self.kvgov_storage = None
        try:
            self.shutdown()
        except Exception:
            _log.exception("kvgov: stopping a refused HiCache failed")

    def attach_storage_backend(
        self,
        storage_backend: str,
        storage_backend_extra_config_json: str | None = None,
        served_model_name: str | None = None,
        hicache_storage_prefetch_policy: str | None = None,
        hicache_write_policy: str | None = None,
    ) -> tuple[bool, str]:
        """SGLang's runtime attach: refused (False, why) unless the backend is kvgov's."""
        why = hicache_backend_problem(storage_backend, storage_backend_extra_config_json)
        if why is not None:
            return False, f"kvgov refuses {why}: {_HICACHE_USE}"
        ok, msg = super().attach_storage_backend(
            storage_backend,
            storage_backend_extra_config_json,
            served_model_name,
            hicache_storage_prefetch_policy,
            hicache_write_policy,
        )
        if not ok:
            return ok, msg
        try:
            self.kvgov_govern_hicache()
        except UnsupportedEngine as exc:
            self.detach_storage_backend()
            return False, str(exc)
        return ok, msg

    def detach_storage_backend(self) -> tuple[bool, str]:
        self.kvgov_storage = None
        ok, msg = super().detach_storage_backend()
        return bool(ok), str(msg)

    # ------------------------------------------------------------------ L3 page names

    def kvgov_storage_owner(self, ns: Any) -> StorageOwner | None:
        """The L3 owner of namespace ``ns``'s pages (None: none may be stored or found).

        A namespace one scope was admitted into (a tenant's own): that scope, if the
        offload policy allows it a tier. A share group's (several scopes: the owner of
        a page would be a guess), a private, retired or unknown one: None.
        """
        backend = self.kvgov_storage
        known = self.kvgov_namespaces.get(ns)
        if backend is None or known is None or known[0] is None:
            return None
        scope, ttl = known
        if scope is None:
            return None
        revision = self.kvgov.gov.policy.bundle_revision
        kept = self.kvgov_owners.get(ns)
        if kept is not None and kept[0] == revision:
            return kept[1]
        view = self.kvgov.gov.ledger.views.view(scope, admitted=True)
        owner = backend.owner_of(view, ttl)
        if len(self.kvgov_owners) >= _OWNERS_KEPT:
            self.kvgov_owners.clear()
        self.kvgov_owners[ns] = (revision, owner)
        return owner

    def kvgov_storage_bind(
        self, token_ids: Any, extra_key: Any, cache_salt: Any, last_hash: str | None = None
    ) -> list[str]:
        """Bind the L3 page names SGLang derives for these tokens to their owner.

        The names are SGLang's (``get_storage_hash_str`` over the page-aligned tokens
        in the namespace, continuing ``last_hash``), as its controller derives them
        for a storage query or prefetch; bound only where the namespace has an owner
        (:meth:`kvgov_storage_owner`). Returns the names bound (empty: none).
        """
        owner = self.kvgov_storage_owner(extra_key)
        backend = self.kvgov_storage
        if owner is None or backend is None:
            return []
        key = RadixKey(
            token_ids, extra_key, is_bigram=bool(self.tree_core.is_eagle), cache_salt=cache_salt
        ).page_aligned(self.page_size)
        if not len(key):
            return []
        names = get_storage_hash_str(key, last_hash, page_size=self.page_size)
        names = [names] if isinstance(names, str) else list(names)
        backend.bind(names, owner)
        return names

    def query_storage_hit_length(
        self,
        last_host_node_id: Any,
        new_input_tokens: Any,
        last_hash: str | None = None,
        prefix_keys: list[str] | None = None,
        extra_key: str | None = None,
        cache_salt: str | None = None,
    ) -> int:
        if self.enable_storage:
            self.kvgov_storage_bind(new_input_tokens, extra_key, cache_salt, last_hash)
        return int(
            super().query_storage_hit_length(
                last_host_node_id, new_input_tokens, last_hash, prefix_keys, extra_key, cache_salt
            )
        )

    def prefetch_from_storage(
        self,
        request: Any,
        last_host_node_id: Any,
        new_input_tokens: Any,
        last_hash: str | None = None,
        prefix_keys: list[str] | None = None,
        matched_prefix_tokens: Any = None,
        extra_key: str | None = None,
        cache_salt: str | None = None,
        storage_hit_end: int | None = None,
    ) -> bool | None:
        if self.enable_storage:
            self.kvgov_storage_bind(new_input_tokens, extra_key, cache_salt, last_hash)
        result: bool | None = super().prefetch_from_storage(
            request,
            last_host_node_id,
            new_input_tokens,
            last_hash,
            prefix_keys,
            matched_prefix_tokens,
            extra_key,
            cache_salt,
            storage_hit_end,
        )
        return result

    def load_back(self, node_id: Any, mem_quota: int | None = None, req: Any = None) -> bool:
        """SGLang's host-to-device load, its pages owned (and their reuse audited).

        The device pages a load back takes hold KV that left the device earlier (a
        write-through copy, or pages a prefetch brought from L3): no insert attributes
        them, so here they become the node namespace's one owner's, as a bare insert's
        would (:meth:`_kvgov_owner`); the loading request's reuse of them is audited
        (:meth:`SglangGovernance.judge_hit`). In a namespace without one owner (a share
        group's once several scopes were admitted into it, or one kvgov does not hold
        live) nothing is loaded: the owner of each host page would be a guess, and its
        use would escape the sharing policy. SGLang then computes the prefix again.
        """
        if self.cache_controller is None:
            return bool(super().load_back(node_id, mem_quota, req))
        ns, _salt = self.tree_core.prefetch_anchor_info(node_id)
        scope, ttl = self.kvgov_namespaces.get(ns, _SEVERAL)
        if scope is None:
            return False
        if not super().load_back(node_id, mem_quota, req):
            return False
        pages = self._kvgov_path_pages(node_id)
        self.kvgov.owned(pages, scope, ttl)
        adm: Admitted | None = getattr(req, _ADMITTED, None) if req is not None else None
        if adm is not None and adm.namespace == ns and adm.view is not None:
            self.kvgov.judge_hit(adm, pages)
        return True

    def write_backup_storage(self, node_id: Any) -> None:
        if self.enable_storage and self.kvgov_storage is not None:
            ns, _salt = self.tree_core.prefetch_anchor_info(node_id)
            owner = self.kvgov_storage_owner(ns)
            if owner is not None:
                self.kvgov_storage.bind(list(self.tree_core.get_hash_values(node_id)), owner)
        super().write_backup_storage(node_id)

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
        evicted = 0
        if size > 0:
            evicted = int(self.evict(EvictParams(num_tokens=size)).num_tokens_evicted)
        controller = self.cache_controller
        if controller is not None:  # HiCache: the host copies too (zeroed as freed)
            for pool in _host_pools(controller):
                self.evict_host(int(pool.size))
        return evicted

    def kvgov_retire(self, namespaces: set[str]) -> None:
        """Forget namespaces an erasure retired: their keys match nothing from now on."""
        for ns in namespaces:
            self.kvgov_namespaces.pop(ns, None)
            self.kvgov_owners.pop(ns, None)

    def kvgov_flush(self) -> None:
        """Zero what is pending and store every audit event (:meth:`SglangGovernance.flush`)."""
        self.kvgov.flush()

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


_PLAINTEXT_L3 = (
    "SGLang's storage backends write plaintext pages under unkeyed SHA-256 names of "
    "their token ids, and purge cannot reach them"
)
_HICACHE_NO_L3 = (
    "HiCache (--enable-hierarchical-cache) without kvgov's L3 storage backend: every page "
    "it offloads must leave sealed under its tenant's data key"
)
_HICACHE_USE = (
    "select kvgov's encrypted tier: --hicache-storage-backend dynamic "
    '--hicache-storage-backend-extra-config \'{"backend_name": "kvgov", '
    '"module_path": "kvgov.govern.sglang.storage", "class_name": "GovernedHiCacheStorage", '
    '"kvgov": {...}}\' (docs/sglang.md), or run without --enable-hierarchical-cache'
)
#: kvgov's backend, as SGLang's dynamic entry names it
_MODULE = "kvgov.govern.sglang.storage"
_CLASS = "GovernedHiCacheStorage"


def _extra_config(raw: Any) -> Mapping[str, Any] | None:
    """SGLang's storage extra config (a JSON string, a mapping or None); None if unreadable."""
    if raw is None or raw == "":
        return {}
    if isinstance(raw, Mapping):
        return raw
    if isinstance(raw, str) and not raw.startswith("@"):
        try:
            value = json.loads(raw)
        except ValueError:
            return None
        return value if isinstance(value, Mapping) else None
    return None  # a config file (@path): read by SGLang; judged by the built backend


def hicache_backend_problem(backend: Any, extra_config: Any) -> str | None:
    """Why an L3 backend selection is not kvgov's (None: it is).

    kvgov's is SGLang's ``dynamic`` entry naming ``backend_name`` ``kvgov``, module
    ``kvgov.govern.sglang.storage`` and class ``GovernedHiCacheStorage``, or the name
    ``kvgov`` registered with SGLang's factory. A config file (``@path``) is judged when
    the backend is built (the governed cache checks the object's class).
    """
    if backend is None or backend == "":
        return "HiCache without an L3 storage backend (host memory alone is refused)"
    if backend == BACKEND:
        return None
    if backend != "dynamic":
        return f"the HiCache L3 storage backend {backend!r} ({_PLAINTEXT_L3})"
    if isinstance(extra_config, str) and extra_config.startswith("@"):
        return None
    config = _extra_config(extra_config)
    if config is None:
        return "a HiCache dynamic storage backend whose extra config is not a JSON object"
    named = (config.get("backend_name"), config.get("module_path"), config.get("class_name"))
    if named != (BACKEND, _MODULE, _CLASS):
        return (
            f"the HiCache dynamic storage backend {named[0]!r} ({named[1]}.{named[2]}: "
            f"{_PLAINTEXT_L3})"
        )
    return None


def check_hicache(server_args: Any) -> None:
    """Refuse HiCache unless its L3 storage backend is kvgov's (before anything is built).

    Raises:
        UnsupportedEngine: HiCache (or SGLang's host-pool retraction backup, which builds
            its host pool) without an L3 backend, or with another backend than kvgov's;
            the host memory mode ``buffer_only`` (its loads back to the device go through
            SGLang's buffer pipeline, not ``load_back``, so kvgov could not give the pages
            they take an owner: every later hit on them would be refused).
    """
    sources: list[Any] = [server_args]
    try:  # what SGLang's init_hicache reads, once its scheduler published its settings
        from sglang.srt.runtime_context import get_memory

        sources.append(get_memory())
    except Exception:  # not published (a cache built outside a scheduler)
        pass
    for source in sources:
        why = hicache_backend_problem(
            getattr(source, "hicache_storage_backend", None),
            getattr(source, "hicache_storage_backend_extra_config", None),
        )
        if why is not None:
            raise UnsupportedEngine(why, _HICACHE_USE)
        if getattr(source, "hicache_host_memory_mode", None) == "buffer_only":
            raise UnsupportedEngine(
                "HiCache's host memory mode buffer_only (its loads back to the device "
                "bypass load_back, where kvgov gives loaded pages their owner)",
                "use the default host memory mode",
            )


def _host_pools(controller: Any) -> Iterator[Any]:
    """The HiCache controller's host pools (a pool group's entries each), each once."""
    seen: set[int] = set()
    pools = [getattr(controller, "mem_pool_host", None)]
    pools.append(getattr(controller, "storage_host_pool", None))
    for pool in pools:
        entries = getattr(pool, "entries", None)
        for one in [e.host_pool for e in entries] if entries is not None else [pool]:
            if one is not None and id(one) not in seen:
                seen.add(id(one))
                yield one


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
        UnsupportedEngine: HiCache whose L3 storage backend is not kvgov's encrypted
            tier (:func:`check_hicache`: none, or another one, refused by name), KV cache
            events (they publish cached token ids), a hybrid model.
    """
    if getattr(ctx, "enable_hierarchical_cache", False):
        check_hicache(ctx.server_args)
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
