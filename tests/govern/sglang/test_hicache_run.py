"""A HiCache run of the governed cache, on the CPU, through SGLang's own HiCache code.

What runs is SGLang's: its settings published the way its scheduler publishes them
(``publish(server_args, role="scheduler", ranks=...)``), the ``kvgov`` radix-cache
factory with HiCache on (``init_hicache``: SGLang's host pool, its
``HybridCacheController`` and storage threads, kvgov's backend built by SGLang's
``dynamic`` storage entry from the extra config, with a disk tier in the test's
folder), then the tree driven as SGLang's scheduler drives it: a request's match,
its KV written, ``checkpoint``, the write-through to host memory, the storage
backup, eviction from the device and from host memory; a later request's storage
hit query, prefetch from L3 into host memory and load back onto the device.

Two of SGLang's leaf calls need CUDA and are stood in for here, nothing else:

* pinning the host pool: ``MHATokenToKVPoolHost`` pins its buffer (``cudaHostRegister``
  through ``torch.cuda.cudart()``: on a CPU-only torch ``AssertionError: Torch not
  compiled with CUDA enabled``) and the scratch pages of its storage threads
  (``torch.zeros(pin_memory=True)``: ``RuntimeError: pin_memory=True requires a CUDA or
  other accelerator backend``); the pool is built with ``pin_memory=False`` (pinning
  speeds DMA, it changes no byte);
* the device<->host copy: the ``direct`` io backend calls sgl_kernel's
  ``transfer_kv_direct``, which SGLang imports on CUDA and ROCm only (here:
  ``NameError``); a torch index copy with its contract (per layer,
  ``dst[dst_indices] = src[src_indices]``) stands in.

The tests without them pin down those failures, so this docstring and docs/sglang.md
go stale loudly if SGLang gains a CPU path.
"""

from __future__ import annotations

import json
import time
from array import array
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytestmark = pytest.mark.sglang
torch = pytest.importorskip("torch")
pytest.importorskip("sglang.srt.mem_cache.unified_radix_cache")

import sglang.srt.mem_cache.pool_host.mha as sglang_mha  # noqa: E402
from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import (  # noqa: E402
    CacheRequestHandle,
    EvictParams,
    InitLoadBackParams,
    MatchPrefixParams,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool  # noqa: E402
from sglang.srt.mem_cache.pool_host.base import host_memory_budget_scope  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixKey  # noqa: E402
from sglang.srt.mem_cache.registry import TreeCacheBuildContext  # noqa: E402
from sglang.srt.runtime_context import SpawnRanks, publish, reset_context  # noqa: E402
from sglang.srt.server_args import ServerArgs  # noqa: E402

from kvgov.audit.queries import AuditQueries  # noqa: E402
from kvgov.govern.sglang import fence  # noqa: E402
from kvgov.govern.sglang.cache import (  # noqa: E402
    GovernedUnifiedRadixCache,
    kvgov_radix_cache_factory,
)
from kvgov.govern.sglang.storage import GovernedHiCacheStorage  # noqa: E402

from .test_differential import _req  # noqa: E402
from .test_sharing import _environ  # noqa: E402

PAGE = 16
POOL = 512  # device tokens: 32 pages
PROMPT = 5 * PAGE  # a prompt of 5 pages; a match and a prefetch cover its first 4
KEK = "42" * 32
HOST_BUDGET = 1 << 26
#: a bound on every wait for SGLang's threads (a hang fails, a slow host does not)
WAIT_S = 60.0


def _transfer_kv_direct(
    src_layers: list[Any],
    dst_layers: list[Any],
    src_indices: Any,
    dst_indices: Any,
    page_size: int,
) -> None:
    """sgl_kernel's ``transfer_kv_direct``, in torch: per layer, ``dst[dst_i] = src[src_i]``."""
    for src, dst in zip(src_layers, dst_layers, strict=True):
        dst[dst_indices.to(dst.device)] = src[src_indices.to(src.device)].to(dst.device)


def _stand_in_pinning(monkeypatch: pytest.MonkeyPatch) -> None:
    """SGLang's MHA host pool, built unpinned (pinning needs CUDA)."""
    init = sglang_mha.MHATokenToKVPoolHost.__init__

    def unpinned(self: Any, *args: Any, **kwargs: Any) -> None:
        kwargs["pin_memory"] = False
        init(self, *args, **kwargs)

    monkeypatch.setattr(sglang_mha.MHATokenToKVPoolHost, "__init__", unpinned)


def _stand_in_transfers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sglang_mha, "transfer_kv_direct", _transfer_kv_direct, raising=False)


def _wait(done: Callable[[], bool], step: Callable[[], Any]) -> None:
    deadline = time.monotonic() + WAIT_S
    while not done():
        assert time.monotonic() < deadline, "SGLang's HiCache threads did not finish"
        step()
        time.sleep(0.005)


class Run:
    """The governed cache SGLang's factory built with HiCache on, and its scheduler's calls."""

    def __init__(self, tmp: Path, tree_core: str | None, environ: dict[str, str]) -> None:
        self.tmp = tmp
        extra = {
            "backend_name": "kvgov",
            "module_path": "kvgov.govern.sglang.storage",
            "class_name": "GovernedHiCacheStorage",
            "prefetch_threshold": PAGE,  # SGLang's own setting: prefetch from one page
            "kvgov": {"key_store_url": f"sqlite:///{tmp}/keys.db", "disk_path": str(tmp / "l3")},
        }
        self.args = ServerArgs(
            model_path="dummy",
            device="cpu",
            enable_hierarchical_cache=True,
            hicache_ratio=2.0,
            hicache_io_backend="direct",
            hicache_mem_layout="layer_first",
            hicache_write_policy="write_through",
            hicache_storage_prefetch_policy="wait_complete",
            hicache_storage_backend="dynamic",
            hicache_storage_backend_extra_config=json.dumps(extra),
        )
        reset_context()
        publish(self.args, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None))
        self.kv = MHATokenToKVPool(
            size=POOL,
            page_size=PAGE,
            dtype=torch.float32,
            head_num=1,
            head_dim=4,
            layer_num=2,
            device="cpu",
            enable_memory_saver=False,
        )
        self.alloc = PagedTokenToKVPoolAllocator(
            size=POOL,
            page_size=PAGE,
            dtype=torch.float32,
            device="cpu",
            kvcache=self.kv,
            need_sort=False,
        )
        params = CacheInitParams(
            disable=False,
            req_to_token_pool=ReqToTokenPool(
                size=8, max_context_len=1024, device="cpu", enable_memory_saver=False
            ),
            token_to_kv_pool_allocator=self.alloc,
            page_size=PAGE,
            tree_core_backend=tree_core,
        )
        GovernedUnifiedRadixCache.kvgov_environ = {
            "KVGOV_AUDIT_URL": f"sqlite:///{tmp}/audit.db",
            "KVGOV_EPHEMERAL_SECRET": "1",
            "KVGOV_DEFAULT_TEMPLATE": "v1",
            **environ,
        }
        self.counters: list[Any] = []
        ctx = TreeCacheBuildContext(
            server_args=self.args,
            params=params,
            is_hybrid_swa=False,
            is_hybrid_ssm=False,
            enable_hierarchical_cache=True,
            disable_radix_cache=False,
            tp_worker=SimpleNamespace(register_hicache_layer_transfer_counter=self.counters.append),
            model_config=None,
            tp_size=1,
            tp_rank=0,
            tp_group=None,
        )
        # SGLang books its host pools against the machine's free memory less a reserve;
        # this pool is a few KiB, so it is booked against a fixed budget of SGLang's scope
        with host_memory_budget_scope(HOST_BUDGET):
            self.cache: Any = kvgov_radix_cache_factory(ctx)
        backend = self.cache.kvgov_storage
        assert isinstance(backend, GovernedHiCacheStorage)
        self.backend = backend
        self.host = self.cache.cache_controller.mem_pool_host.entries[0].host_pool
        #: every (names, tenant) SGLang's threads asked the backend to store
        self.stored: list[tuple[list[str], list[str | None]]] = []
        batch_set = backend.batch_set

        def spy(keys: list[str], values: Any = None, *args: Any, **kwargs: Any) -> bool:
            owners = backend.kvgov_owners(keys)
            self.stored.append((list(keys), [o and o.view.scope.tenant for o in owners]))
            return bool(batch_set(keys, values, *args, **kwargs))

        backend.batch_set = spy  # type: ignore[method-assign]

    # ------------------------------------------------------------------ the scheduler's calls

    def match(self, req: Any) -> Any:
        toks = array("q", req.origin_input_ids)
        key = RadixKey(toks, req.extra_key, limit=len(toks) - 1)
        return self.cache.match_prefix(MatchPrefixParams(key=key, req=req))

    def settle(self) -> None:
        """SGLang's scheduler steps until every write-through and storage backup is acked."""
        cache = self.cache
        _wait(
            lambda: not cache.ongoing_write_through and not cache.ongoing_backup,
            cache.check_hicache_events,
        )

    def serve(self, i: int, tenant: str, toks: array, value: float, **custom: str) -> Any:
        """A request served and finished: match, KV written (``value``), ``checkpoint``."""
        req = _req(i, tenant, toks, **{"kvgov_classification": "public", **custom})
        n = len(toks)
        m = self.match(req)
        prefix_len = int(m.device_prefix_len)
        req.lock = self.cache.lock(m.last_device_node)
        prefix = self.cache.path_device_indices(m.last_device_node)[:prefix_len]
        new = self.alloc.alloc(n - prefix_len)
        for buf in (*self.kv.k_buffer, *self.kv.v_buffer):
            buf[new] = value
        self.cache.req_to_token_pool.write(
            (0, slice(0, n)), torch.cat((prefix, new)).to(torch.int32)
        )
        req.kv = SimpleNamespace(
            req_pool_idx=0, cache_protected_len=prefix_len, cache_inserted_len=prefix_len
        )
        req.full_untruncated_fill_ids = array("q", toks)
        req.origin_input_ids = array("q", toks)
        req.finished = lambda: True
        req.finished_reason = None
        req.priority = 0
        req.session_id = None
        req.kv_rotation_base = None
        self.cache.checkpoint(req, up_to=n)
        self.cache.unlock(req.lock)
        return req

    def node_of(self, req: Any) -> Any:
        """The tree node holding the request's whole prompt (a full match splits nothing)."""
        key = RadixKey(array("q", req.origin_input_ids), req.extra_key)
        return self.cache.match_prefix(MatchPrefixParams(key=key, req=req)).last_device_node

    def evict_device(self) -> int:
        return int(self.cache.evict(EvictParams(num_tokens=POOL)).num_tokens_evicted)

    def evict_host(self) -> int:
        return int(self.cache.evict_host(int(self.host.size)))

    def arrive(self, i: int, tenant: str, toks: array, **custom: str) -> Any:
        """A new request: matched, its scheduler's fields set."""
        req = _req(i, tenant, toks, **{"kvgov_classification": "public", **custom})
        m = self.match(req)
        req.last_node = m.last_device_node
        req.swa_host_hit_length = 0
        req.mamba_host_hit_length = 0
        req.kv = SimpleNamespace(mamba_pool_idx=None, req_pool_idx=0)
        req.handle = CacheRequestHandle(req.rid, 0)
        req.m = m
        return req

    def storage_hits(self, req: Any) -> int:
        """SGLang's scheduler's storage hit query for the part the match did not cover."""
        m, toks = req.m, array("q", req.origin_input_ids)
        start = int(m.device_prefix_len) + int(m.host_hit_length)
        return int(
            self.cache.query_storage_hit_length(
                m.last_host_node,
                toks[start : len(toks) - 1],
                self.cache.get_last_hash_value(m.last_host_node),
                None,
                req.extra_key,
                req.cache_salt,
            )
        )

    def prefetch(self, req: Any) -> int:
        """The scheduler's prefetch from L3, waited for: the tokens it brought to host memory."""
        m, toks = req.m, array("q", req.origin_input_ids)
        start = int(m.device_prefix_len) + int(m.host_hit_length)
        self.cache.prefetch_from_storage(
            req.handle,
            m.last_host_node,
            toks[start : len(toks) - 1],
            self.cache.get_last_hash_value(m.last_host_node),
            None,
            matched_prefix_tokens=toks[:start],
            extra_key=req.extra_key,
            cache_salt=req.cache_salt,
        )

        def done() -> bool:
            return bool(self.cache.check_prefetch_progress(req.handle))

        _wait(done, self.cache.check_hicache_events)
        loaded, _start = self.cache.pop_prefetch_loaded_span(req.handle)
        req.m = self.match(req)
        req.last_node = req.m.last_device_node
        return int(loaded)

    def load_back(self, req: Any) -> int:
        """The scheduler's load back of the host hit onto the device, waited for."""
        m = req.m
        loaded, _node = self.cache.init_load_back(
            InitLoadBackParams(
                best_match_node=m.last_host_node, host_hit_length=m.host_hit_length, req=req
            )
        )
        self.cache.ready_to_load_host_cache()
        _wait(lambda: not self.cache.ongoing_load_back, self.cache.check_hicache_events)
        return int(loaded)

    def device_values(self, req: Any) -> tuple[int, list[float]]:
        """The request's device hit now (matched again) and the KV values it holds."""
        m = self.match(req)
        n = int(m.device_prefix_len)
        idx = self.cache.path_device_indices(m.last_device_node)[:n]
        values = torch.cat([b[idx].flatten() for b in (*self.kv.k_buffer, *self.kv.v_buffer)])
        return n, sorted({float(v) for v in values.tolist()})

    def events(self, etype: str) -> list[Any]:
        self.cache.kvgov.gov.audit.flush()
        with AuditQueries(f"sqlite:///{self.tmp}/audit.db") as q:
            return list(q.events(type=etype))

    def close(self) -> None:
        try:
            self.cache.shutdown()  # SGLang's detach: its storage threads stop, the backend closes
        finally:
            self.cache.kvgov_close()


@pytest.fixture()
def run_of(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Run]]:
    monkeypatch.setenv("KVGOV_KEK", KEK)
    # the factory sets the cache class's engine; the environment is set per run
    for name in ("kvgov_engine", "kvgov_environ"):
        monkeypatch.setattr(
            GovernedUnifiedRadixCache, name, getattr(GovernedUnifiedRadixCache, name)
        )
    _stand_in_pinning(monkeypatch)
    _stand_in_transfers(monkeypatch)
    runs: list[Run] = []

    def make(tree_core: str | None = None, environ: dict[str, str] | None = None) -> Run:
        r = Run(tmp_path, tree_core, environ or {})
        runs.append(r)
        return r

    try:
        yield make
    finally:
        for r in runs:
            r.close()
        reset_context()


def _prompt(start: int) -> array:
    return array("q", range(start, start + PROMPT))


# ---------------------------------------------------------------------- the run


def test_sglangs_init_hicache_builds_kvgovs_backend_and_governs_the_host_pool(
    run_of: Callable[..., Run],
) -> None:
    run = run_of()
    cache = run.cache
    controller = cache.cache_controller
    assert cache.enable_storage and controller is not None
    assert fence.storage_backend_of(controller) is run.backend  # built by SGLang's factory
    assert run.backend.attached and run.backend.mem_pool_host is not None
    assert type(run.host).__name__.startswith("Governed")  # zeroed as it frees
    assert run.counters  # the scheduler's worker got the layer-done counter


@pytest.mark.parametrize("tree_core", [None, "python"], ids=["rust", "python"])
def test_a_scope_gets_its_pages_back_from_l3_and_another_tenant_none(
    run_of: Callable[..., Run], tree_core: str | None
) -> None:
    run = run_of(tree_core)
    toks = _prompt(1000)
    acme = run.serve(0, "acme", toks, 7.0)
    run.settle()
    assert run.stored and all(t == ["acme"] * len(n) for n, t in run.stored)
    assert bool((run.host.kv_buffer == 7.0).any())  # the write-through copied the KV to host

    assert run.evict_device() == PROMPT and run.evict_host() == PROMPT
    assert not bool(run.host.kv_buffer.any())  # every host page freed reads zero

    # another tenant, the very same tokens: nothing on the device, host or L3
    globex = run.arrive(1, "globex", toks)
    assert (globex.m.device_prefix_len, globex.m.host_hit_length) == (0, 0)
    assert run.storage_hits(globex) == 0
    assert run.prefetch(globex) == 0

    # the same scope, a later request: its pages come back from L3, sealed and audited
    again = run.arrive(2, "acme", toks)
    assert (again.m.device_prefix_len, again.m.host_hit_length) == (0, 0)
    assert run.storage_hits(again) == PROMPT - PAGE
    assert run.prefetch(again) == PROMPT - PAGE
    assert again.m.host_hit_length == PROMPT - PAGE
    assert run.load_back(again) == PROMPT - PAGE
    assert run.device_values(again) == (PROMPT - PAGE, [7.0])  # acme's KV, byte for byte

    assert acme.extra_key == again.extra_key != globex.extra_key
    hicache = [
        e for e in run.events("offload") if e.details.get("backend") == "kvgov.sglang/hicache"
    ]
    assert [(e.tenant, e.details["outcome"]) for e in hicache] == [("acme", "save_stored")]
    restores = [
        e
        for e in run.events("offload_restore")
        if e.details.get("backend") == "kvgov.sglang/hicache"
    ]
    loaded = [e for e in restores if e.details["outcome"] == "loaded"]
    assert [(e.tenant, e.reused_tokens) for e in loaded] == [("acme", PROMPT - PAGE)]
    misses = [e for e in restores if e.details["outcome"] == "miss"]
    assert misses and {e.tenant for e in misses} == {"globex"}
    reuse = [e for e in run.events("reuse") if e.sequence_id == again.rid]
    assert [e.reused_tokens for e in reuse] == [PROMPT - PAGE]  # the load back's reuse


@pytest.mark.parametrize("tree_core", [None, "python"], ids=["rust", "python"])
def test_the_backup_stores_the_names_kvgov_bound_in_the_nodes_own_namespace(
    run_of: Callable[..., Run], tree_core: str | None
) -> None:
    """The two readings of SGLang's tree core the binding rests on, checked on a real backup.

    ``tree_core.prefetch_anchor_info(node)`` is the node's own namespace (kvgov's, of the
    request that inserted it) and ``tree_core.get_hash_values(node)`` are the names the
    backup hands to storage; both are also the names a later query derives from the
    request's tokens (``kvgov_storage_bind``).
    """
    run = run_of(tree_core)
    toks = _prompt(2000)
    reqs = [run.serve(0, "acme", toks, 3.0), run.serve(1, "globex", toks, 5.0)]
    run.settle()
    assert len(run.stored) == 2
    for req, (names, tenants) in zip(reqs, run.stored, strict=True):
        node = run.node_of(req)
        ns, salt = run.cache.tree_core.prefetch_anchor_info(node)
        assert (ns, salt) == (req.extra_key, None)
        assert ns.startswith("kvgov") and ns != reqs[1 - reqs.index(req)].extra_key
        assert list(run.cache.tree_core.get_hash_values(node)) == names
        assert tenants == [req.sampling_params.custom_params["kvgov_tenant"]] * len(names)
        assert len(names) == PROMPT // PAGE
        assert run.cache.kvgov_storage_bind(toks, ns, None) == names


def test_a_page_loaded_back_from_host_memory_is_its_scopes_and_its_reuse_audited(
    run_of: Callable[..., Run],
) -> None:
    """A load back's device pages had no owner: the next match refused the hit (InternalError)."""
    run = run_of()
    toks = _prompt(3000)
    run.serve(0, "acme", toks, 9.0)
    run.settle()
    assert run.evict_device() == PROMPT  # the host copy stays

    again = run.arrive(1, "acme", toks)
    assert (again.m.device_prefix_len, again.m.host_hit_length) == (0, PROMPT - PAGE)
    assert run.load_back(again) == PROMPT - PAGE
    assert run.device_values(again) == (PROMPT - PAGE, [9.0])
    ledger = run.cache.kvgov.gov.ledger
    idx = run.cache.path_device_indices(run.node_of(again))[::PAGE].tolist()
    owners = {ledger.owners.table[slot // PAGE] for slot in idx}
    assert len(owners) == 1 and next(iter(owners)).tenant == "acme"
    reuse = [e for e in run.events("reuse") if e.sequence_id == again.rid]
    assert [e.reused_tokens for e in reuse] == [PROMPT - PAGE]


def test_a_share_groups_host_copies_are_not_loaded_back(run_of: Callable[..., Run]) -> None:
    """Several tenants' pages meet there: a host page's owner would be a guess, unjudged."""
    run = run_of(environ=_environ("acme", "globex"))
    toks = _prompt(4000)
    acme = run.serve(0, "acme", toks, 4.0)
    globex = run.arrive(1, "globex", toks)
    assert globex.extra_key == acme.extra_key  # one namespace, two scopes
    run.settle()
    assert run.evict_device() == PROMPT

    globex = run.arrive(2, "globex", toks)
    assert globex.m.host_hit_length == PROMPT - PAGE
    assert run.load_back(globex) == 0
    assert run.match(globex).device_prefix_len == 0


def test_purge_tenant_zeroes_host_copies_and_shreds_l3(run_of: Callable[..., Run]) -> None:
    run = run_of()
    toks = _prompt(5000)
    acme = run.serve(0, "acme", toks, 6.0)
    run.serve(1, "globex", _prompt(6000), 8.0)
    run.settle()
    names = next(n for n, tenants in run.stored if tenants[0] == "acme")
    owner = run.cache.kvgov_storage_owner(acme.extra_key)
    assert owner is not None
    disk = run.backend.tiers[0]
    kept = [disk.get(run.backend.object_key(n, owner)) for n in names]
    assert all(k is not None for k in kept)
    assert bool((run.host.kv_buffer == 6.0).any())

    report = run.cache.kvgov.purge_tenant("acme")

    assert report.destroyed_key_ids
    assert not bool((run.host.kv_buffer == 6.0).any())  # acme's host copies read zero
    assert not any(bool((b == 6.0).any()) for b in (*run.kv.k_buffer, *run.kv.v_buffer))
    assert not any(disk.path_of(run.backend.object_key(n, owner)).exists() for n in names)
    # a copy kept aside (a backup of the disk) no longer opens
    for sealed in kept:
        disk.put(sealed, 0)
    run.backend.bind(names, owner)
    scratch = [run.host.get_dummy_flat_data_page() for _ in names[:1]]
    assert run.backend.batch_get(names[:1], scratch) == [None]
    refused = run.events("offload_refused")
    assert any(e.details.get("reason") == "key_destroyed" for e in refused)
    # acme's next request finds nothing anywhere
    again = run.arrive(2, "acme", toks)
    assert (again.m.device_prefix_len, again.m.host_hit_length) == (0, 0)
    assert run.storage_hits(again) == 0
    # globex keeps its pages in L3
    other = run.arrive(3, "globex", _prompt(6000))
    assert other.m.device_prefix_len == 0 and other.m.host_hit_length == 0
    assert run.storage_hits(other) == PROMPT - PAGE


# ---------------------------------------------------------------------- without the stand-ins


def test_without_a_cuda_build_sglangs_host_pool_cannot_pin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the first stand-in replaces: init_hicache fails in SGLang's host pool."""
    if torch.cuda.is_available():
        pytest.skip("a CUDA build pins host memory: nothing to stand in for")
    monkeypatch.setenv("KVGOV_KEK", KEK)
    try:
        with pytest.raises(AssertionError, match="Torch not compiled with CUDA enabled"):
            Run(tmp_path, None, {})
    finally:
        reset_context()


def test_without_sgl_kernel_the_direct_backend_has_no_copy(
    run_of: Callable[..., Run], monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the second stand-in replaces: the write-through fails in SGLang's transfer."""
    if hasattr(sglang_mha, "transfer_kv_direct") and (
        sglang_mha.transfer_kv_direct is not _transfer_kv_direct
    ):
        pytest.skip("sgl_kernel's transfer_kv_direct is installed: nothing to stand in for")
    run = run_of()
    monkeypatch.delattr(sglang_mha, "transfer_kv_direct")
    run.serve(0, "acme", _prompt(7000), 1.0)
    # SGLang's error path then syncs the stream, which torch.cpu.Stream cannot do
    with pytest.raises(AttributeError, match="synchronize") as info:
        run.settle()
    assert isinstance(info.value.__context__, NameError)
    assert "transfer_kv_direct" in str(info.value.__context__)
