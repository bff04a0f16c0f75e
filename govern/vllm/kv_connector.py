"""``GovernedKVConnector``: kvgov's sealed Redis tier as a vLLM KV connector, for a fleet.

Selected with::

    --kv-transfer-config '{"kv_connector": "GovernedKVConnector",
        "kv_connector_module_path": "kvgov.govern.vllm.kv_connector", "kv_role": "kv_both",
        "kv_connector_extra_config": {"kvgov": {"redis_url": "rediss://...",
                                                "key_store_url": "postgresql://..."}}}'

(kvgov's vLLM plugin also registers the name, so ``kv_connector_module_path`` may be
left out.) It keys external KV by ``request.block_hashes``, which under the governed
scheduler are kvgov's keyed chain in the request's namespace: a request finds only
blocks of its own scope. Requests that publish in a share group are neither saved nor
loaded (their blocks may be sealed under another tenant's data key: fail closed), nor
are those whose scope the offload policy does not allow on the tier (``offload_tiers``
in the policy's data must list the tier's name, ``tier_name``, for the classification).

Scheduler side (the engine core process, where the governor and its audit log live)::

    get_num_new_matched_tokens  own chain, from the first block not computed: one
                                pipelined EXISTS in Redis (deadline: timeout_s);
                                Redis down or backing off, nothing stored, or
                                (blocks stored but) recomputing cheaper -> 0,
                                audited as a miss
                                (offload_restore, reused_tokens 0, details.outcome)
    update_state_after_alloc    the blocks vLLM allocated for the hit -> a load
    build_connector_meta        loads, and saves of the blocks this step fills
                                (owning tenant's keyed name, keyed scope, deadline)
    update_connector_output     the workers' reports -> audit (offload on a save,
                                offload_refused on a refused object, a miss on a
                                failed load) and the cost figures

Worker side (each worker process: it holds the KV tensors, not the audit log, so it
reports through ``build_connector_worker_meta``, which vLLM carries back to the
scheduler in ``KVConnectorOutput.kv_connector_worker_meta``)::

    start_load_kv   each load: verify and decrypt every block into its KV slots
                    (synchronous, bounded by the Redis timeout); a block that misses
                    or is refused is reported in ``get_block_ids_with_load_errors``,
                    so vLLM recomputes it and the blocks after it
    wait_for_save   each save: seal the block's KV under the owner's data key (the
                    AAD binds tier, block hash, keyed scope, keyed tenant, deadline)
                    and store it; Redis down -> reported as not saved

The blocks a load fills are the request's (the scheduler owns them like any other
block of the request), and a synchronous load ends before the forward pass that reads
them, so none is zeroed while it is filled.
"""

from __future__ import annotations

import os
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorWorkerMetadata,
)

from kvgov.audit import AuditEvent, EventType, SqlWrappedKeyStore
from kvgov.exceptions import UnsupportedEngine
from kvgov.offload import LocalKEK, PutOutcome, RedisTier

from ..fleet_kv import ConnectorOffloading, CostModel, FleetNames, FleetSettings, FleetStore
from ..scope import CacheScope
from . import fence

__all__ = [
    "GovernedKVConnector",
    "GovernedKVMetadata",
    "GovernedWorkerReports",
    "Transfer",
]

#: Scopes remembered for ``invalidate`` (digest -> own root, scope), newest last.
_MAX_KNOWN = 4096
#: Requests whose state is kept for the workers' reports.
_MAX_TRACKED = 4096


@dataclass(frozen=True, slots=True)
class Transfer:
    """One request's blocks to load or save this step (names only: no tenant, no tokens)."""

    req_id: str
    block_ids: tuple[int, ...]
    block_keys: tuple[bytes, ...]
    scope: bytes
    tenant: str
    deadline: float = 0.0


@dataclass
class GovernedKVMetadata(KVConnectorMetadata):
    """Scheduler -> workers, per step."""

    loads: list[Transfer] = field(default_factory=list)
    saves: list[Transfer] = field(default_factory=list)
    #: tokens the step computes (the prefill rate's numerator)
    tokens: int = 0


@dataclass
class GovernedWorkerReports(KVConnectorWorkerMetadata):
    """Workers -> scheduler, per step: what each transfer did (the scheduler audits it)."""

    #: (what, req_id, block_ids, outcome, detail): what is "save", "load" or "refused"
    reports: list[tuple[str, str, tuple[int, ...], str, str]] = field(default_factory=list)
    #: (bytes, seconds, blocks) of the loads; (tokens, seconds) of the forward passes
    restores: list[tuple[int, float, int]] = field(default_factory=list)
    prefills: list[tuple[int, float]] = field(default_factory=list)

    def aggregate(self, other: KVConnectorWorkerMetadata) -> KVConnectorWorkerMetadata:
        if isinstance(other, GovernedWorkerReports):
            self.reports.extend(other.reports)
            self.restores.extend(other.restores)
            self.prefills.extend(other.prefills)
        return self


def _host_bytes(view: torch.Tensor) -> memoryview | None:
    """The bytes of a contiguous tensor in host memory, writable; None for another device
    or a strided view (those take torch's ``copy_``).

    A block's KV is copied through this with one ``memcpy`` on the calling thread. torch's
    ``copy_`` splits a copy of this size (a layer's block: ~200 KB) across its OpenMP
    threads; in vLLM's CPU worker (2 threads pinned to the cores, which the engine's other
    processes keep busy) each such copy waited for a core: 2-57 ms per 2.25 MiB block where
    a memcpy takes 0.2 ms, most of the 10x between the tier's speed and a load's.
    """
    if view.device.type != "cpu" or not view.is_contiguous():
        return None
    try:
        array: Any = view.view(torch.uint8).numpy()  # shares the tensor's memory
        return memoryview(array).cast("B")
    except (RuntimeError, TypeError, ValueError):  # a tensor numpy cannot share
        return None


def _open_store(settings: FleetSettings) -> FleetStore:
    tier = RedisTier(
        settings.redis_url,
        settings.capacity_bytes,
        name=settings.tier_name,
        prefix=settings.prefix,
        timeout=settings.timeout_s,
    )
    return FleetStore(
        tier,
        SqlWrappedKeyStore(settings.key_store_url),
        LocalKEK.from_env(os.environ),
        key_recheck_s=settings.key_recheck_s,
    )


class GovernedKVConnector(KVConnectorBase_V1):
    """kvgov's own KV connector (see the module docstring).

    Raises:
        BindingConfigError: malformed ``kv_connector_extra_config["kvgov"]``.
        KEKError: no key-encryption key (``KVGOV_KEK`` / ``KVGOV_KEK_FILE``).
    """

    def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config
        self.kvgov_kv_cache_config = kv_cache_config
        self.settings = FleetSettings.from_extra(extra)
        self.block_size: int = vllm_config.cache_config.block_size
        self.fleet = _open_store(self.settings)
        # scheduler side: the rule's figures, from the workers' reports; worker side: the
        # same figures from the worker's own measurements (what it reports), for a probe
        self.cost = CostModel(
            restore_bytes_per_s=self.settings.restore_bytes_per_s,
            prefill_tokens_per_s=self.settings.prefill_tokens_per_s,
            max_age_s=self.settings.cost_max_age_s,
        )
        # scheduler side
        self.kvgov_binding: Any = None
        self.kvgov_pending: dict[str, tuple[int, tuple[bytes, ...]]] = {}
        self.kvgov_loads: list[Transfer] = []
        self.kvgov_requests: dict[str, Any] = {}
        self.kvgov_block_ids: dict[str, list[int]] = {}
        self.kvgov_saved: dict[str, int] = {}
        self.kvgov_tracked: OrderedDict[str, Any] = OrderedDict()
        self.kvgov_known: OrderedDict[bytes, tuple[bytes, CacheScope]] = OrderedDict()
        #: audited outcomes, by kind (metrics)
        self.counts: dict[str, int] = {}
        # worker side
        self.kvgov_kv: list[tuple[str, torch.Tensor, int]] = []
        self.kvgov_errors: set[int] = set()
        self.kvgov_out = GovernedWorkerReports()
        self.kvgov_step_start = 0.0
        self.kvgov_load_seconds = 0.0
        #: whether this worker has loaded before (its first load is not a cost sample)
        self.kvgov_warm = False
        self.kvgov_meta: KVConnectorMetadata | None = None

    # ================================================================== scheduler side

    def kvgov_bind(self, binding: Any) -> None:
        """Called by the governed scheduler once its binding is open: erasure reaches the tier."""
        self.kvgov_binding = binding
        binding.gov.offload = ConnectorOffloading(
            self.fleet, self.kvgov_names, lambda: self.kvgov_known
        )

    def kvgov_names(self) -> FleetNames:
        return FleetNames(self.kvgov_binding.gov.deriver)

    def kvgov_count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1

    def kvgov_remember(self, state: Any) -> None:
        view = state.view
        self.kvgov_known[view.digest] = (view.own_root, view.scope)
        self.kvgov_known.move_to_end(view.digest)
        if len(self.kvgov_known) > _MAX_KNOWN:
            self.kvgov_known.popitem(last=False)

    def kvgov_governed(self, request: Any) -> tuple[Any, str | None]:
        """The request's governance, and why it may not use the tier (None: it may)."""
        state = fence.governance_of(request)
        if state is None or self.kvgov_binding is None:
            return None, "ungoverned"
        if not state.cacheable:
            return state, "not_cacheable"
        if state.shared:
            return state, "share_group"
        if state.prefix_blocks:  # its blocks are of two scopes; the tier names one a request
            return state, "public_prefix"
        if state.scope.tenant in self.kvgov_binding.gov.ledger.purging:
            return state, "purging"
        # the offload policy, asked about this tier by its name (offload_tiers in the
        # policy's data); it fails closed (an engine error denies)
        if not self.kvgov_binding.gov.policy.offload(
            state.view.fields, self.settings.tier_name
        ).allow:
            return state, "offload_denied"
        return state, None

    def kvgov_audit(
        self,
        state: Any,
        etype: str,
        *,
        block_ids: tuple[int, ...] = (),
        reused: int | None = None,
        **details: Any,
    ) -> None:
        self.kvgov_count(str(details.get("outcome", etype)))
        self.kvgov_binding.gov.audit.record(
            AuditEvent(
                type=etype,
                **{**state.view.fields, "requester_tenant": state.scope.tenant},
                sequence_id=state.seq_id,
                block_ids=block_ids,
                reused_tokens=reused,
                details={"connector": "GovernedKVConnector", **details},
            )
        )

    def kvgov_miss(self, state: Any, reason: str, **details: Any) -> tuple[int, bool]:
        self.kvgov_audit(
            state, EventType.OFFLOAD_RESTORE, reused=0, outcome="miss", reason=reason, **details
        )
        return 0, False

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> Any:
        self.kvgov_pending.pop(request.request_id, None)
        state, why = self.kvgov_governed(request)
        if state is None:
            return 0, False
        start = num_computed_tokens // self.block_size
        end = min(len(request.block_hashes), (request.num_tokens - 1) // self.block_size)
        if end <= start:
            return 0, False  # nothing beyond the device's hit to look up
        if why is not None:
            return self.kvgov_miss(state, why)
        self.kvgov_remember(state)
        keys = tuple(bytes(h) for h in request.block_hashes[start:end])
        found = self.fleet.present(list(keys))
        if found is None:
            return self.kvgov_miss(state, "unavailable")
        if found == 0:
            return self.kvgov_miss(state, "absent")
        # asked after the lookup: a miss says "absent" when nothing of the scope is stored
        if self.settings.cost_rule and not self.cost.pays(self.block_size):
            self.cost.skip("load")
            figures = self.cost.metrics(self.block_size)
            return self.kvgov_miss(
                state,
                "recompute_cheaper",
                **{k: figures[k] for k in ("restore_bytes_per_s", "prefill_tokens_per_s")},
            )
        self.kvgov_pending[request.request_id] = (start, keys[:found])
        return found * self.block_size, False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        pending = self.kvgov_pending.pop(request.request_id, None)
        if pending is None or num_external_tokens <= 0:
            return
        state = fence.governance_of(request)
        if state is None:
            return
        start, keys = pending
        n = num_external_tokens // self.block_size
        ids = blocks.get_block_ids()[0][start : start + n]
        names = self.kvgov_names()
        self.kvgov_loads.append(
            Transfer(
                request.request_id,
                tuple(ids),
                keys[:n],
                names.scope(state.view.own_root, state.view.digest),
                names.tenant(state.scope.tenant),
            )
        )
        self.kvgov_track(request.request_id, state)

    def kvgov_track(self, req_id: str, state: Any) -> None:
        self.kvgov_tracked[req_id] = state
        self.kvgov_tracked.move_to_end(req_id)
        if len(self.kvgov_tracked) > _MAX_TRACKED:
            self.kvgov_tracked.popitem(last=False)

    def on_new_request(self, request: Any) -> None:
        self.kvgov_requests[request.request_id] = request

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        so = scheduler_output
        meta = GovernedKVMetadata(loads=self.kvgov_loads, tokens=so.total_num_scheduled_tokens)
        self.kvgov_loads = []
        progress: dict[str, int] = {}
        for new in so.scheduled_new_reqs:
            self.kvgov_block_ids[new.req_id] = list(new.block_ids[0])
            progress[new.req_id] = new.num_computed_tokens
            self.kvgov_saved.setdefault(new.req_id, new.num_computed_tokens // self.block_size)
        cached = so.scheduled_cached_reqs
        resumed: set[str] = getattr(cached, "resumed_req_ids", set())
        for i, req_id in enumerate(cached.req_ids):
            ids = cached.new_block_ids[i]
            if ids is not None:
                if req_id in resumed:
                    self.kvgov_block_ids[req_id] = list(ids[0])
                else:
                    self.kvgov_block_ids.setdefault(req_id, []).extend(ids[0])
            progress[req_id] = cached.num_computed_tokens[i]
        for req_id, computed in progress.items():
            save = self.kvgov_save_of(req_id, computed + so.num_scheduled_tokens.get(req_id, 0))
            if save is not None:
                meta.saves.append(save)
        return meta

    def kvgov_save_of(self, req_id: str, computed: int) -> Transfer | None:
        """The blocks of ``req_id`` this step fills that go to the tier, or None."""
        request = self.kvgov_requests.get(req_id)
        if request is None:
            return None
        first = self.kvgov_saved.get(req_id, 0)
        last = min(computed // self.block_size, len(request.block_hashes))
        ids = self.kvgov_block_ids.get(req_id, [])
        last = min(last, len(ids))
        if last <= first:
            return None
        self.kvgov_saved[req_id] = last
        state, why = self.kvgov_governed(request)
        if state is None or why is not None or state.plan.ttl is None:
            return None
        if self.settings.cost_rule and not self.cost.pays(self.block_size):
            self.cost.skip("save")
            self.kvgov_count("save_skipped")
            return None
        self.kvgov_remember(state)
        self.kvgov_track(req_id, state)
        names = self.kvgov_names()
        return Transfer(
            req_id,
            tuple(ids[first:last]),
            tuple(bytes(h) for h in request.block_hashes[first:last]),
            names.scope(state.view.own_root, state.view.digest),
            names.tenant(state.scope.tenant),
            time.time() + state.plan.ttl,  # the tier runs on wall time in every process
        )

    def request_finished(self, request: Any, block_ids: list[int]) -> tuple[bool, Any]:
        for table in (
            self.kvgov_requests,
            self.kvgov_block_ids,
            self.kvgov_saved,
            self.kvgov_pending,
        ):
            table.pop(request.request_id, None)
        return False, None

    def update_connector_output(self, connector_output: Any) -> None:
        out = connector_output.kv_connector_worker_meta
        if not isinstance(out, GovernedWorkerReports) or self.kvgov_binding is None:
            return
        for nbytes, seconds, blocks in out.restores:
            self.cost.restored(nbytes, seconds, blocks)
        for tokens, seconds in out.prefills:
            self.cost.prefilled(tokens, seconds)
        for what, req_id, ids, outcome, detail in out.reports:
            state = self.kvgov_tracked.get(req_id)
            if state is None:
                continue
            if what == "save":
                self.kvgov_audit(
                    state,
                    EventType.OFFLOAD,
                    block_ids=ids,
                    outcome=f"save_{outcome}",
                    tier=self.settings.tier_name,
                )
            elif what == "refused":
                self.kvgov_audit(
                    state,
                    EventType.OFFLOAD_REFUSED,
                    block_ids=ids,
                    outcome="refused",
                    reason=outcome,
                    detail=detail,
                    tier=self.settings.tier_name,
                )
            elif outcome != "loaded":
                self.kvgov_audit(
                    state,
                    EventType.OFFLOAD_RESTORE,
                    block_ids=ids,
                    reused=0,
                    outcome="load_failed",
                    reason=outcome,
                )
            else:
                self.kvgov_count("loaded")

    def kvgov_metrics(self) -> dict[str, Any]:
        """The connector's counters and the cost figures behind its decisions (see
        :meth:`CostModel.metrics`). On a worker: no counters, and the figures of the
        worker's own measurements, which are the samples it reports to the scheduler."""
        return {"outcomes": dict(self.counts), **self.cost.metrics(self.block_size)}

    # ================================================================== worker side

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Remember each layer's KV tensor and the dimension that indexes blocks."""
        num_blocks = self.kvgov_kv_cache_config.num_blocks
        self.kvgov_kv = []
        for name in sorted(kv_caches):
            tensor = kv_caches[name]
            dims = [d for d, size in enumerate(tensor.shape) if size == num_blocks]
            if not dims:
                raise UnsupportedEngine(
                    f"a KV cache layout without a dimension of {num_blocks} blocks (layer {name})",
                    "use an attention backend whose KV tensors index blocks in one dimension",
                )
            self.kvgov_kv.append((name, tensor, dims[0]))

    def kvgov_block_views(self, block_id: int) -> list[torch.Tensor]:
        return [t.select(dim, block_id) for _n, t, dim in self.kvgov_kv]

    def kvgov_stage(self, block_id: int, scratch: bytearray) -> memoryview:
        """Copy one block's KV (every layer's view, in order) into ``scratch``: the only
        plaintext copy a save makes, which the caller zeroes once the block is sealed."""
        pos = 0
        out = memoryview(scratch)
        for view in self.kvgov_block_views(block_id):
            n = view.numel() * view.element_size()
            host = _host_bytes(view)
            if host is not None:
                out[pos : pos + n] = host
            else:
                dst = torch.frombuffer(scratch, dtype=torch.uint8, count=n, offset=pos)
                dst.view(view.dtype).reshape(view.shape).copy_(view)
            pos += n
        return out[:pos]

    def kvgov_fill(self, block_id: int, data: memoryview) -> None:
        """Copy one block's KV from ``data`` (as :meth:`kvgov_stage` laid it out)."""
        pos = 0
        for view in self.kvgov_block_views(block_id):
            n = view.numel() * view.element_size()
            host = _host_bytes(view)
            if host is not None:
                host[:] = data[pos : pos + n]
            else:
                src = torch.frombuffer(data, dtype=torch.uint8, count=n, offset=pos)
                view.copy_(src.view(view.dtype).reshape(view.shape))
            pos += n

    def kvgov_block_nbytes(self) -> int:
        return sum(v.numel() * v.element_size() for v in self.kvgov_block_views(0))

    def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
        super().bind_connector_metadata(connector_metadata)
        self.kvgov_meta = connector_metadata

    def clear_connector_metadata(self) -> None:
        super().clear_connector_metadata()
        self.kvgov_meta = None

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        meta = self.kvgov_meta
        started = time.perf_counter()
        if isinstance(meta, GovernedKVMetadata):
            for load in meta.loads:
                self.kvgov_load(load)
        self.kvgov_load_seconds = time.perf_counter() - started
        self.kvgov_step_start = time.perf_counter()

    def kvgov_load(self, load: Transfer) -> None:
        scratch = bytearray(self.kvgov_block_nbytes())
        done = 0
        started = time.perf_counter()
        try:
            for i, (block_id, key) in enumerate(zip(load.block_ids, load.block_keys, strict=True)):
                got = self.fleet.load(key, load.scope, load.tenant, into=scratch)
                for refusal in got.refusals:
                    self.kvgov_out.reports.append(
                        ("refused", load.req_id, (block_id,), str(refusal.reason), refusal.detail)
                    )
                if not got.hit:
                    self.kvgov_errors.update(load.block_ids[i:])
                    self.kvgov_out.reports.append(
                        ("load", load.req_id, tuple(load.block_ids[i:]), str(got.reason), "")
                    )
                    break
                self.kvgov_fill(block_id, memoryview(scratch))
                done += 1
        finally:
            scratch[:] = bytes(len(scratch))
        if done:
            seconds = time.perf_counter() - started
            # a worker's first load also pays its one-time costs (the Redis connection,
            # the key store's, the first data key): it is not what a load costs
            if self.kvgov_warm:
                self.kvgov_out.restores.append((done * len(scratch), seconds, done))
                self.cost.restored(done * len(scratch), seconds, done)
            self.kvgov_warm = True
            self.kvgov_out.reports.append(
                ("load", load.req_id, load.block_ids[:done], "loaded", "")
            )

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kw: Any) -> None:
        return None

    def wait_for_save(self) -> None:
        meta = self.kvgov_meta
        if not isinstance(meta, GovernedKVMetadata):
            return
        if meta.tokens and self.kvgov_step_start:
            seconds = time.perf_counter() - self.kvgov_step_start
            self.kvgov_out.prefills.append((meta.tokens, seconds))
            self.cost.prefilled(meta.tokens, seconds)
        if not meta.saves:
            return
        # one plaintext staging buffer for the step's saves, zeroed however they end
        scratch = bytearray(self.kvgov_block_nbytes())
        try:
            for save in meta.saves:
                stored = []
                outcome = PutOutcome.STORED.value
                for block_id, key in zip(save.block_ids, save.block_keys, strict=True):
                    payload = self.kvgov_stage(block_id, scratch)
                    result = self.fleet.save(key, save.scope, save.tenant, save.deadline, payload)
                    payload.release()
                    put = result.puts[0].outcome
                    if put is not PutOutcome.STORED:
                        outcome = put.value
                        break
                    stored.append(block_id)
                self.kvgov_out.reports.append(("save", save.req_id, tuple(stored), outcome, ""))
        finally:
            scratch[:] = bytes(len(scratch))

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self.kvgov_errors = self.kvgov_errors, set()
        return errors

    def build_connector_worker_meta(self) -> KVConnectorWorkerMetadata | None:
        out, self.kvgov_out = self.kvgov_out, GovernedWorkerReports()
        if not (out.reports or out.restores or out.prefills):
            return None
        return out

    def shutdown(self) -> None:
        self.fleet.close()
