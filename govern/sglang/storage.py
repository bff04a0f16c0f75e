"""``GovernedHiCacheStorage``: kvgov's sealed tiers as SGLang's HiCache L3 storage backend.

Selected with (SGLang's ``--hicache-storage-backend`` takes a fixed list of names, so a
third-party backend is named through its ``dynamic`` entry; the plugin also registers
the name ``kvgov`` with SGLang's ``StorageBackendFactory``, for the runtime attach API)::

    --enable-hierarchical-cache --radix-cache-backend kvgov \\
    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config \\
      '{"backend_name": "kvgov", "module_path": "kvgov.govern.sglang.storage",
        "class_name": "GovernedHiCacheStorage",
        "kvgov": {"key_store_url": "postgresql://...", "redis_url": "rediss://..."}}'

SGLang hands a storage backend pages under its own names: a SHA-256 chain over the
page's token ids, seeded by the request's ``extra_key`` and ``cache_salt`` (under the
governed cache, kvgov's tree namespace). Such a name is unkeyed and says nothing of
who owns the page, and the backend is called from SGLang's storage threads, which
know no request. So nothing here trusts it alone:

* **Binding** (:meth:`GovernedHiCacheStorage.bind`): the governed cache, which admitted
  the request, tells the backend which SGLang page names belong to which owner
  (:class:`StorageOwner`: the scope's view, its keyed tenant and scope names, the tiers
  the offload policy allows, its retention) before SGLang's threads use them: on a
  backup, the node's names in the node's namespace; on a prefetch or a storage hit
  query, the names SGLang will compute from the request's tokens in the request's
  namespace. A name no governed request bound is neither stored nor looked up
  (``unbound``: a refused or private request, a share group's namespace, a retired
  one). The owner comes from kvgov's governance, never from a client field.
* **Keyed, scoped object names**: a page's object key is
  ``HMAC-SHA256(secret, PAGE_TAG || SHA-256(shard) || scope name || SGLang name)`` with
  kvgov's cache-key secret (:class:`~kvgov.govern.keys.KeyDeriver`), the owner's keyed
  scope name (:class:`~kvgov.govern.fleet_kv.FleetNames`: the tenant's namespace root
  and the scope digest, keyed) and this rank's shard of the model (model, TP/PP/CP
  rank and size, layout, dtype). Another tenant or scope with the same tokens gets
  another object key, and the tier's keys name no tenant, scope or prompt.
* **Sealed**: every page is sealed by :class:`~kvgov.offload.OffloadStore` with the
  owner's tenant data key before any tier sees it (AES-256-GCM; the associated data
  binds the object to its key, scope name, tenant name, tier and deadline), so a
  tampered or moved object is refused, and ``purge_tenant`` destroys the tenant's
  data key (crypto-shredding every copy in every tier at once).

Every save, load, miss and refusal is audited (``offload``, ``offload_restore``,
``offload_refused``, ``details.backend`` ``"kvgov.sglang/hicache"``), per call and
owner, the way the vLLM connector audits its transfers.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections import Counter, OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolTransfer,
    PoolTransferResult,
)

from kvgov.audit import AuditEvent, EventType, SqlWrappedKeyStore
from kvgov.defaults import DATA_KEY_RECHECK_SECONDS, REDIS_KEY_PREFIX
from kvgov.exceptions import BindingConfigError, InvalidOffloadArgument, OffloadError
from kvgov.offload import (
    DeleteReport,
    DiskTier,
    HostMemoryTier,
    KeyProvider,
    LocalKEK,
    OffloadStore,
    PutOutcome,
    RedisTier,
    ShredReport,
    Tier,
    WrappedKeyStore,
)

from ..fleet_kv import FleetNames, kvgov_settings
from ..keys import KeyDeriver, ScopeDigest
from ..offloading import Offloading
from ..scope import CacheScope
from ..views import ScopeView

__all__ = [
    "BACKEND",
    "DETAILS_BACKEND",
    "GovernedHiCacheStorage",
    "HiCacheOffloading",
    "StorageOwner",
    "StorageSettings",
]

_log = logging.getLogger("kvgov.sglang")

#: The backend's name in SGLang's StorageBackendFactory (and ``backend_name`` of its
#: ``dynamic`` entry).
BACKEND = "kvgov"
#: ``details.backend`` of every event this backend writes.
DETAILS_BACKEND = "kvgov.sglang/hicache"
_PAGE_TAG = b"kvgov.sglang.hicache.page.v1\x00"
#: Page names bound to owners kept by default (least recently bound dropped first).
DEFAULT_BOUND_PAGES = 1 << 18


@dataclass(frozen=True, slots=True)
class StorageSettings:
    """The backend's settings: ``extra_config["kvgov"]`` of SGLang's storage config.

    Attributes:
        key_store_url: the wrapped-key store's database (PostgreSQL in a fleet).
        redis_url: a Redis tier (None: none).
        disk_path: a local disk tier's folder (None: none).
        host_bytes: a host-memory tier's capacity (0: none). Host first, disk, Redis.
        capacity_bytes: the disk and Redis tiers' capacity each.
        prefix: the Redis key prefix.
        timeout_s: the deadline of one Redis call.
        key_recheck_s: how long a data key is trusted before its state is read again.
        bound_pages: page names bound to owners kept (least recently bound dropped first:
            a dropped name misses, as ``unbound``).
    """

    key_store_url: str
    redis_url: str | None = None
    disk_path: str | None = None
    host_bytes: int = 0
    capacity_bytes: int = 1 << 30
    prefix: str = REDIS_KEY_PREFIX + ":hicache"
    timeout_s: float = 0.25
    key_recheck_s: float = DATA_KEY_RECHECK_SECONDS
    bound_pages: int = DEFAULT_BOUND_PAGES

    @classmethod
    def from_extra(cls, extra: Mapping[str, Any] | None) -> StorageSettings:
        """Read ``extra_config["kvgov"]``.

        Raises:
            BindingConfigError: a missing or malformed setting, or no tier.
        """
        where = "hicache_storage_backend_extra_config.kvgov"
        raw = kvgov_settings(
            extra, where, cls.__dataclass_fields__, "a mapping with key_store_url and a tier"
        )
        if not isinstance(raw.get("key_store_url"), str) or not raw["key_store_url"]:
            raise BindingConfigError(f"{where}.key_store_url", None, "a database URL")
        for name in ("redis_url", "disk_path"):
            if raw.get(name) is not None and (not isinstance(raw[name], str) or not raw[name]):
                raise BindingConfigError(f"{where}.{name}", raw[name], "a non-empty string")
        for name in ("host_bytes", "capacity_bytes", "timeout_s", "key_recheck_s", "bound_pages"):
            value = raw.get(name, 1)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise BindingConfigError(f"{where}.{name}", value, "a number >= 0")
        settings = cls(**dict(raw))
        if not (settings.redis_url or settings.disk_path or settings.host_bytes):
            raise BindingConfigError(
                where, None, "at least one of redis_url, disk_path, host_bytes"
            )
        return settings

    def tiers(self) -> list[Tier]:
        """The tiers, fastest first: host memory, disk, Redis."""
        tiers: list[Tier] = []
        if self.host_bytes:
            tiers.append(HostMemoryTier(int(self.host_bytes), name="host"))
        if self.disk_path:
            tiers.append(DiskTier(self.disk_path, int(self.capacity_bytes), name="disk"))
        if self.redis_url:
            tiers.append(
                RedisTier(
                    self.redis_url,
                    int(self.capacity_bytes),
                    name="redis",
                    prefix=self.prefix,
                    timeout=self.timeout_s,
                )
            )
        return tiers


@dataclass(frozen=True, slots=True)
class StorageOwner:
    """Who a page belongs to, as kvgov's governance decided it (see :meth:`owner_of`).

    Attributes:
        view: the owner scope's view (its audit fields, digest and tenant's root).
        tenant: the tenant's keyed name in the tiers and the key store.
        scope: the scope's keyed name (bound into every object's associated data).
        tiers: the tiers the offload policy allows for the scope (empty: none).
        ttl: retention of its pages (seconds from a save).
    """

    view: ScopeView
    tenant: str
    scope: bytes
    tiers: tuple[str, ...]
    ttl: float


def shard_identity(config: HiCacheStorageConfig, host_pool: Any = None) -> bytes:
    """What makes one rank's page bytes differ from another's: bound into object keys."""
    fields = [
        f"model={config.model_name or ''}",
        f"tp={config.tp_rank}/{config.tp_size}",
        f"pp={config.pp_rank}/{config.pp_size}",
        f"cp={config.attn_cp_rank}/{config.attn_cp_size}",
        f"dcp={config.dcp_rank}/{config.dcp_size}",
        f"mla={int(bool(config.is_mla_model))}",
    ]
    if config.is_mla_model:  # MLA KV is replicated across TP ranks: one copy for all
        fields[1] = "tp=*"
    if host_pool is not None:
        fields.append(f"layout={getattr(host_pool, 'layout', '')}")
        fields.append(f"dtype={getattr(host_pool, 'dtype', '')}")
        fields.append(f"page={getattr(host_pool, 'page_size', '')}")
    return hashlib.sha256("\x00".join(fields).encode()).digest()


class GovernedHiCacheStorage(HiCacheStorage):
    """SGLang's HiCache storage interface over kvgov's sealed tiers (module docstring).

    Built by SGLang (``backend_class(storage_config, kwargs)``); until the governed
    cache attaches its governance (:meth:`kvgov_attach`) every page is refused.

    Args:
        storage_config: SGLang's storage config (ranks, model, ``extra_config``).
        kwargs: what SGLang's factory passes to a dynamic backend (unused).
        tiers: the tiers, fastest first (default: opened from the settings).
        key_store: the wrapped-key store (default: the settings' ``key_store_url``);
            closed with the backend.
        kek: the key-encryption key (default: ``LocalKEK.from_env()``).
        bound_pages: page names bound to owners kept (default: the settings').

    Raises:
        BindingConfigError: malformed settings.
        KEKError: no key-encryption key (``KVGOV_KEK`` / ``KVGOV_KEK_FILE``).
    """

    def __init__(
        self,
        storage_config: HiCacheStorageConfig,
        kwargs: Mapping[str, Any] | None = None,
        *,
        tiers: Sequence[Tier] | None = None,
        key_store: WrappedKeyStore | None = None,
        kek: KeyProvider | None = None,
        bound_pages: int | None = None,
    ) -> None:
        self.storage_config = storage_config
        recheck = DATA_KEY_RECHECK_SECONDS
        if tiers is None or key_store is None:
            settings = StorageSettings.from_extra(storage_config.extra_config)
            tiers = settings.tiers() if tiers is None else tiers
            recheck = settings.key_recheck_s
            if bound_pages is None:
                bound_pages = settings.bound_pages
            if key_store is None:
                key_store = SqlWrappedKeyStore(settings.key_store_url)
        try:
            self.store = OffloadStore(
                tiers,
                key_store,
                LocalKEK.from_env(os.environ) if kek is None else kek,
                key_recheck_seconds=recheck,
            )
        except BaseException:
            key_store.close()
            raise
        self.tiers: tuple[Tier, ...] = tuple(tiers)
        self.kvgov_key_store: WrappedKeyStore | None = key_store
        self.kvgov_max_bound = int(bound_pages or DEFAULT_BOUND_PAGES)
        self.kvgov_lock = threading.Lock()
        self.kvgov_bound: OrderedDict[str, StorageOwner] = OrderedDict()
        self.kvgov_shard = shard_identity(storage_config)
        self.kvgov_deriver: KeyDeriver | None = None
        self.kvgov_names: FleetNames | None = None
        self.kvgov_gov: Any = None
        self.mem_pool_host: Any = None
        #: outcomes so far, by kind (get_stats)
        self.counts: Counter[str] = Counter()

    # ------------------------------------------------------------------ governance

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """SGLang's host pool (page bytes and layout): bound into the shard identity."""
        self.mem_pool_host = mem_pool_host
        self.kvgov_shard = shard_identity(self.storage_config, mem_pool_host)

    def kvgov_attach(self, governance: Any) -> None:
        """The governed cache's governance: names, audit, policy; purge reaches the tiers.

        Args:
            governance: the cache's :class:`~kvgov.govern.sglang.governance.SglangGovernance`.
        """
        gov = governance.gov
        self.kvgov_gov = gov
        self.kvgov_deriver = gov.deriver
        self.kvgov_names = FleetNames(gov.deriver)
        gov.offload = HiCacheOffloading(self)

    @property
    def attached(self) -> bool:
        """Whether a governance is attached (else every page is refused)."""
        return self.kvgov_gov is not None

    def owner_of(self, view: ScopeView, ttl: float | None) -> StorageOwner | None:
        """The storage owner of a scope's pages, or None if none may be stored.

        None: not attached, no retention (not cacheable), the tenant being purged, or
        the offload policy allows no tier for the scope (asked per tier by its name).
        """
        gov = self.kvgov_gov
        names = self.kvgov_names
        if gov is None or names is None or ttl is None or ttl <= 0:
            return None
        if view.scope.tenant in gov.ledger.purging:
            return None
        tiers = tuple(t for t in self.store.tier_names if gov.policy.offload(view.fields, t).allow)
        if not tiers:
            self.kvgov_audit_miss(view, 0, "offload_denied")
            return None
        return StorageOwner(
            view=view,
            tenant=names.tenant(view.scope.tenant),
            scope=names.scope(bytes(view.own_root), bytes(view.digest)),
            tiers=tiers,
            ttl=float(ttl),
        )

    def bind(self, page_names: Sequence[str], owner: StorageOwner) -> None:
        """SGLang's names of pages ``owner`` wrote (or may read): called by the governed cache."""
        if not page_names:
            return
        with self.kvgov_lock:
            bound = self.kvgov_bound
            for name in page_names:
                bound[name] = owner
                bound.move_to_end(name)
            while len(bound) > self.kvgov_max_bound:
                bound.popitem(last=False)

    def unbind_tenant(self, tenant: str) -> None:
        """Forget every binding of ``tenant`` (its pages are neither stored nor found)."""
        with self.kvgov_lock:
            for name in [n for n, o in self.kvgov_bound.items() if o.view.scope.tenant == tenant]:
                del self.kvgov_bound[name]

    def tenant_name(self, tenant: str) -> str:
        """The tenant's keyed name in the tiers and the key store.

        Raises:
            OffloadError: no governance attached (no secret to key it with).
        """
        if self.kvgov_names is None:
            raise OffloadError("the kvgov HiCache backend has no governance attached")
        return self.kvgov_names.tenant(tenant)

    def bound_owners(self) -> list[StorageOwner]:
        """The owners some page name is bound to now, each once."""
        with self.kvgov_lock:
            return list({id(o): o for o in self.kvgov_bound.values()}.values())

    def unbind_where(self, matches: Callable[[CacheScope], bool]) -> None:
        """Forget every binding of a scope that ``matches`` (invalidation)."""
        with self.kvgov_lock:
            for name in [n for n, o in self.kvgov_bound.items() if matches(o.view.scope)]:
                del self.kvgov_bound[name]

    def object_key(self, page_name: str, owner: StorageOwner) -> bytes:
        """The object key of one page: keyed (the secret), scoped (the owner's scope name)."""
        deriver = self.kvgov_deriver
        if deriver is None:
            raise OffloadError("the kvgov HiCache backend has no governance attached")
        try:
            name = bytes.fromhex(page_name)
        except (TypeError, ValueError):
            name = str(page_name).encode("utf-8", "surrogatepass")
        return bytes(
            deriver.derive_key(_PAGE_TAG + self.kvgov_shard, name, ScopeDigest(owner.scope))
        )

    def kvgov_owners(self, keys: Sequence[str]) -> list[StorageOwner | None]:
        with self.kvgov_lock:
            bound = self.kvgov_bound
            return [bound.get(k) for k in keys]

    # ------------------------------------------------------------------ audit

    def kvgov_record(self, event: AuditEvent) -> None:
        gov = self.kvgov_gov
        if gov is None:
            return
        try:
            gov.audit.record(event)
        except Exception:  # a storage thread must not die; the page is refused anyway
            _log.exception("kvgov: auditing a HiCache storage event failed")

    def kvgov_event(
        self, view: ScopeView | None, etype: str, *, reused: int | None = None, **details: Any
    ) -> AuditEvent:
        with self.kvgov_lock:
            self.counts[str(details.get("outcome", etype))] += 1
        fields: dict[str, Any] = {}
        if view is not None:
            fields = {**view.fields, "requester_tenant": view.scope.tenant}
        return AuditEvent(
            type=etype,
            **fields,
            reused_tokens=reused,
            details={"backend": DETAILS_BACKEND, **details},
        )

    def kvgov_audit_miss(self, view: ScopeView | None, pages: int, reason: str) -> None:
        self.kvgov_record(
            self.kvgov_event(
                view,
                EventType.OFFLOAD_RESTORE,
                reused=0,
                outcome="miss",
                reason=reason,
                pages=pages,
            )
        )

    # ------------------------------------------------------------------ lookups

    def kvgov_present(self, key: bytes) -> bool:
        """Whether some tier holds an object under ``key`` (not opened: a load verifies it)."""
        for tier in self.tiers:
            try:
                if isinstance(tier, RedisTier):
                    if tier.exists([key])[0]:
                        return True
                elif isinstance(tier, DiskTier):
                    if tier.path_of(key).is_file():
                        return True
                elif tier.get(key) is not None:
                    return True
            except OffloadError:
                continue
        return False

    def batch_exists(
        self, keys: list[str], extra_info: HiCacheStorageExtraInfo | None = None
    ) -> int:
        """How many of ``keys``, from the first, this request's scope has stored.

        A name no governed request bound is not looked up (a miss, ``unbound``).
        A run that finds nothing is audited as a miss (``absent``, ``unbound``).
        """
        owners = self.kvgov_owners(keys)
        found = 0
        reason = "absent"
        for key, owner in zip(keys, owners, strict=True):
            if owner is None:
                reason = "unbound"
                break
            if not self.kvgov_present(self.object_key(key, owner)):
                break
            found += 1
        if not found and keys:
            self.kvgov_audit_miss(owners[0].view if owners[0] else None, len(keys), reason)
        return found

    def exists(self, key: str) -> bool:
        """Whether the page is stored for the scope its name is bound to."""
        return self.batch_exists([key]) == 1

    def batch_exists_v2(
        self,
        keys: list[str],
        pool_transfers: list[PoolTransfer] | None = None,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> PoolTransferResult:
        """KV pages only: a hybrid model's extra pools are refused at start."""
        if pool_transfers:
            return PoolTransferResult.empty()
        hits = self.batch_exists(keys, extra_info)
        return PoolTransferResult(hits, {"kv": hits} if hits else {}, list(range(1, hits + 1)))

    # ------------------------------------------------------------------ loads

    def batch_get(
        self,
        keys: list[str],
        target_locations: Any = None,
        target_sizes: Any = None,
    ) -> list[torch.Tensor | None]:
        """Verify and decrypt pages into ``target_locations`` (one flat tensor a page).

        Stops at the first page that misses or is refused (SGLang uses the leading
        run); each refusal is audited (``offload_refused``), the loaded pages once per
        owner (``offload_restore``, ``outcome`` ``loaded``), a miss with its reason.
        """
        out: list[torch.Tensor | None] = [None] * len(keys)
        targets = list(target_locations or [None] * len(keys))
        owners = self.kvgov_owners(keys)
        loaded: dict[int, tuple[StorageOwner, int]] = {}
        page_tokens = self.kvgov_page_tokens()
        for i, (key, owner) in enumerate(zip(keys, owners, strict=True)):
            target = targets[i]
            if owner is None:
                self.kvgov_audit_miss(None, len(keys) - i, "unbound")
                break
            if target is None:
                self.kvgov_audit_miss(owner.view, len(keys) - i, "no_target")
                break
            got = self.kvgov_restore(key, owner, target)
            if got is None:
                break
            out[i] = target
            entry = loaded.get(id(owner))
            loaded[id(owner)] = (owner, 1 if entry is None else entry[1] + 1)
        for owner, pages in loaded.values():
            self.kvgov_record(
                self.kvgov_event(
                    owner.view,
                    EventType.OFFLOAD_RESTORE,
                    reused=pages * page_tokens,
                    outcome="loaded",
                    pages=pages,
                )
            )
        return out

    def kvgov_restore(self, key: str, owner: StorageOwner, target: torch.Tensor) -> bool | None:
        """Load one page into ``target``; audit a miss or refusals. None: not loaded."""
        object_key = self.object_key(key, owner)
        flat = target.view(-1) if target.is_contiguous() else None
        if flat is None:
            self.kvgov_audit_miss(owner.view, 1, "target_not_contiguous")
            return None
        try:
            got = self.store.restore(object_key, owner.scope, owner.tenant, into=flat)
        except InvalidOffloadArgument as exc:  # the stored page is of another size
            self.kvgov_audit_miss(owner.view, 1, "size_mismatch")
            _log.warning("kvgov: HiCache page of another size: %s", exc)
            return None
        for refusal in got.refusals:
            self.kvgov_record(
                self.kvgov_event(
                    owner.view,
                    EventType.OFFLOAD_REFUSED,
                    outcome="refused",
                    reason=str(refusal.reason),
                    detail=refusal.detail,
                    tier=refusal.tier,
                )
            )
        if not got.hit:
            self.kvgov_audit_miss(owner.view, 1, str(got.reason))
            return None
        return True

    def get(
        self, key: str, target_location: Any = None, target_sizes: Any = None
    ) -> torch.Tensor | None:
        """One page (see :meth:`batch_get`)."""
        return self.batch_get([key], [target_location])[0]

    def batch_get_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        """Load pages straight into SGLang's host pool at ``host_indices`` (one slot a token)."""

        def load(pool: Any, key: str, index: int) -> bool:
            scratch = pool.get_dummy_flat_data_page()
            try:
                if self.batch_get([key], [scratch])[0] is None:
                    return False
                pool.set_from_flat_data_page(index, scratch)
                return True
            finally:
                scratch.zero_()

        return self.kvgov_each_page(keys, host_indices, load)

    def kvgov_each_page(
        self, keys: list[str], host_indices: torch.Tensor, one: Callable[[Any, str, int], bool]
    ) -> list[bool]:
        """``one(pool, key, first slot)`` per page, in order, until one fails: which succeeded."""
        pool = self.mem_pool_host
        results = [False] * len(keys)
        if pool is None:
            return results
        page = int(pool.page_size)
        for i, key in enumerate(keys):
            if not one(pool, key, int(host_indices[i * page])):
                break
            results[i] = True
        return results

    # ------------------------------------------------------------------ saves

    def kvgov_page_tokens(self) -> int:
        pool = self.mem_pool_host
        return int(getattr(pool, "page_size", 0) or 0)

    def batch_set(
        self,
        keys: list[str],
        values: Any = None,
        target_locations: Any = None,
        target_sizes: Any = None,
    ) -> bool:
        """Seal and store pages (one flat tensor a page) under their owners' data keys.

        A page whose name no governed request bound, or whose owner is being purged, is
        refused (not stored, audited ``offload_refused``). The stored pages are
        audited once per owner (``offload``, ``outcome`` ``save_stored``). Returns
        whether every page was stored.
        """
        values = list(values or [])
        owners = self.kvgov_owners(keys)
        gov = self.kvgov_gov
        saved: dict[int, tuple[StorageOwner, int, str]] = {}
        ok = len(values) == len(keys)
        now = time.time()
        for key, value, owner in zip(keys, values, owners, strict=False):
            if owner is None or gov is None:
                self.kvgov_record(
                    self.kvgov_event(
                        None, EventType.OFFLOAD_REFUSED, outcome="refused", reason="unbound"
                    )
                )
                ok = False
                break
            if owner.view.scope.tenant in gov.ledger.purging:
                self.kvgov_record(
                    self.kvgov_event(
                        owner.view, EventType.OFFLOAD_REFUSED, outcome="refused", reason="purging"
                    )
                )
                ok = False
                break
            result = self.store.offload(
                self.object_key(key, owner),
                owner.scope,
                owner.tenant,
                now + owner.ttl,
                value,
                tiers=owner.tiers,
            )
            stored = any(p.outcome is PutOutcome.STORED for p in result.puts)
            outcome = PutOutcome.STORED.value
            if not stored:
                allowed = [p for p in result.puts if p.outcome is not PutOutcome.NOT_ALLOWED]
                outcome = (allowed or list(result.puts))[0].outcome.value
            entry = saved.get(id(owner))
            if entry is None or entry[2] != outcome:
                if entry is not None:
                    self.kvgov_audit_save(*entry)
                entry = (owner, 0, outcome)
            saved[id(owner)] = (owner, entry[1] + 1, outcome)
            if not stored:
                ok = False
                break
        for entry in saved.values():
            self.kvgov_audit_save(*entry)
        return ok

    def kvgov_audit_save(self, owner: StorageOwner, pages: int, outcome: str) -> None:
        self.kvgov_record(
            self.kvgov_event(
                owner.view,
                EventType.OFFLOAD,
                outcome=f"save_{outcome}",
                pages=pages,
                tiers=list(owner.tiers),
            )
        )

    def set(
        self,
        key: str,
        value: Any = None,
        target_location: Any = None,
        target_sizes: Any = None,
    ) -> bool:
        """One page (see :meth:`batch_set`)."""
        return self.batch_set([key], [value])

    def batch_set_v1(
        self,
        keys: list[str],
        host_indices: torch.Tensor,
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> list[bool]:
        """Store pages straight from SGLang's host pool at ``host_indices``."""
        return self.kvgov_each_page(
            keys,
            host_indices,
            lambda pool, key, index: self.batch_set([key], [pool.get_data_page(index, flat=True)]),
        )

    # ------------------------------------------------------------------ extra pools

    def batch_get_v2(
        self,
        transfers: list[PoolTransfer],
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> dict[str, list[bool]]:
        """Refused: extra pools belong to hybrid models, which kvgov refuses at start."""
        return {str(t.name): [False] * len(t.keys or []) for t in transfers}

    def batch_set_v2(
        self,
        transfers: list[PoolTransfer],
        extra_info: HiCacheStorageExtraInfo | None = None,
    ) -> dict[str, list[bool]]:
        """Refused: extra pools belong to hybrid models, which kvgov refuses at start."""
        return {str(t.name): [False] * len(t.keys or []) for t in transfers}

    # ------------------------------------------------------------------ life

    def clear(self) -> bool:
        """Delete every object of the tiers (SGLang's ``/hicache/storage-backend/clear``)."""
        report = self.store.delete_where(lambda info: True)
        self.kvgov_record(
            self.kvgov_event(
                None,
                EventType.INVALIDATION,
                outcome="cleared",
                deleted=dict(report.deleted),
                unreachable=list(report.unreachable),
            )
        )
        return not report.unreachable

    def get_stats(self) -> dict[str, Any]:
        """Outcome counts and the tiers' counters."""
        return {"outcomes": dict(self.counts), "tiers": self.store.stats().tiers}

    def close(self) -> None:
        """Close the tiers and the key store this backend opened. Idempotent."""
        try:
            self.store.close()
        finally:
            if self.kvgov_key_store is not None:
                key_store, self.kvgov_key_store = self.kvgov_key_store, None
                key_store.close()


class HiCacheOffloading(Offloading):
    """The governor's offload hook for the HiCache backend: erasure reaches the L3 tiers.

    ``purge_tenant`` destroys the tenant's data key (every stored page of it becomes
    undecryptable at once, in every tier), deletes its objects and forgets its
    bindings; ``invalidate`` deletes the matching scopes' objects that this engine
    bound; a rotated secret drops every object (their keys were derived with the old one).
    """

    def __init__(self, backend: GovernedHiCacheStorage) -> None:
        super().__init__(backend.store)
        self._backend = backend

    def shred(self, tenant: str) -> ShredReport:
        """Destroy the tenant's data key, then delete its objects; forget its bindings."""
        backend = self._backend
        backend.unbind_tenant(tenant)
        return self.store.shred(backend.tenant_name(tenant))

    def invalidate(self, matches: Callable[[CacheScope], bool]) -> DeleteReport:
        """Delete the objects of every bound scope that ``matches``; forget those bindings."""
        backend = self._backend
        stale = {o.scope for o in backend.bound_owners() if matches(o.view.scope)}
        backend.unbind_where(matches)
        if not stale:
            return DeleteReport({t: 0 for t in self.tier_names}, ())
        return self.store.delete_where(lambda info: info.scope_digest in stale)

    def close(self) -> None:
        """Nothing: the backend closes its own store (SGLang's controller closes it)."""
