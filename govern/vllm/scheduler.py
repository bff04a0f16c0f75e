"""The governed vLLM scheduler: select it with ``--scheduler-cls`` or ``scheduler_cls=``.

::

    vllm serve MODEL --scheduler-cls kvgov.govern.vllm.GovernedScheduler \\
        --additional-config '{"kvgov": {"audit_url": "postgresql+psycopg://..."}}'

It is vLLM's ``Scheduler`` (or ``AsyncScheduler`` with async scheduling: users
name one class, :class:`GovernedScheduler` hands back the async variant) with
the governance of :class:`~kvgov.govern.vllm.binding.VllmGovernance` at the
points vLLM itself calls:

================================  ==================================================
``__init__``                      refuses what is not governed; adopts vLLM's pool and
                                  manager; opens the governor (settings, policy, audit);
                                  governs the KV connector by kind or refuses it by name
``add_request``                   scope, admission, namespace, keyed hasher; a refused
                                  request is kept out of the queues
``schedule``                      the fleet's queued orders, then the retention sweep
                                  (vLLM's own schedule follows)
``_get_new_block_ids_to_zero``    the ids that left an owner go to this step's workers
                                  (through :class:`.fence.SchedulerOverrides`)
``has_requests``                  also true while zeroing, a refusal or a fleet order is
                                  pending, so an idle engine runs the step that carries them
``update_from_output``            "done" for the step's zeroing; refusals reach clients;
                                  fleet orders whose zeroing the step carried complete
``shutdown``                      flushes and closes the audit trail
================================  ==================================================

``kvgov_call(op, *args)`` runs the binding's erasure and maintenance
operations; the general plugin exposes it as an engine utility, so a client
reaches it with ``engine_core.call_utility("kvgov_call", "purge_tenant", "acme")``.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from typing import Any, ClassVar

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.engine import EngineCoreOutputs
from vllm.v1.request import RequestStatus

from kvgov import __version__
from kvgov.exceptions import InvalidArgument, UnsupportedEngine

from ..erasure import SCOPE_FILTERS
from . import fence, fleet_target, groups, plugin
from .binding import VllmGovernance
from .connectors import ConnectorGovernance
from .manager import GovernedKVCacheManager
from .pool import GovernedBlockPool
from .request_state import RequestGovernance
from .settings import BindingSettings

__all__ = ["GovernedAsyncScheduler", "GovernedScheduler", "GovernedSchedulerMixin"]

#: The operations ``kvgov_call`` runs.
OPERATIONS = ("invalidate", "purge_tenant", "rotate_secret", "state", "stats", "sweep")


class GovernedSchedulerMixin(fence.SchedulerOverrides):
    """The governance, mixed in before vLLM's ``Scheduler`` or ``AsyncScheduler``.

    A test may build the scheduler with ``object.__new__`` and set only vLLM's
    attributes, so every override falls back to vLLM's behaviour when
    :attr:`kvgov` is None.
    """

    #: The clock of retention and audit times; a subclass may inject another.
    kvgov_clock: ClassVar[Callable[[], float]] = staticmethod(time.time)
    #: The binding; None until ``__init__`` opened it.
    kvgov: VllmGovernance | None = None
    #: The KV connector's governance; None without a connector.
    kvgov_connector: ConnectorGovernance | None = None
    #: The fleet agent's hooks (docs/fleet.md); None without ``fleet_url``.
    kvgov_fleet: fleet_target.VllmFleet | None = None

    # vLLM's scheduler attributes the governance uses (set by vLLM's __init__)
    vllm_config: Any
    kv_cache_config: Any
    kv_cache_manager: Any
    hash_block_size: int
    requests: dict[str, Any]
    connector: Any

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        plugin.check_registered()
        fence.check_version()
        super().__init__(*args, **kwargs)
        self._kvgov_refused: dict[str, tuple[Any, str]] = {}
        _check_governable(self)
        pool = GovernedBlockPool.adopt(self.kv_cache_manager.block_pool)
        binding = VllmGovernance.open(
            vllm_config=self.vllm_config,
            kv_cache_config=self.kv_cache_config,
            pool=pool,
            block_size=self.hash_block_size,
            clock=type(self).kvgov_clock,
            environ=os.environ,
        )
        GovernedKVCacheManager.adopt(self.kv_cache_manager, binding)
        self.kvgov = binding
        if self.connector is not None:
            try:
                self.kvgov_connector = ConnectorGovernance.attach(
                    binding, self.connector, connector_kinds(self.vllm_config)
                )
            except BaseException:
                binding.close()
                raise
        try:
            self.kvgov_fleet = fleet_target.open_fleet(
                BindingSettings.load(
                    getattr(self.vllm_config, "additional_config", None), os.environ
                ),
                binding,
                self.kvgov_live,
                {"kvgov": __version__, "vllm": fence.VLLM_VERSION},
            )
        except BaseException:
            binding.close()
            raise
        #: read by the plugin's engine hook: the engine need not hash requests
        self.kvgov_defers_hashing = True

    # ------------------------------------------------------------------ request path

    def add_request(self, request: Any) -> None:
        binding = self.kvgov
        if binding is None or request.request_id in self.requests:
            super().add_request(request)  # type: ignore[misc]  # a streaming continuation
            return
        refusal = binding.admit(request)
        if refusal is None:
            if self.kvgov_connector is not None:
                self.kvgov_connector.admitted(request)
            super().add_request(request)  # type: ignore[misc]
            return
        # known (so an abort finds it), never queued nor scheduled, finished with the
        # reason at the next update_from_output
        self.requests[request.request_id] = request
        self._kvgov_refused[request.request_id] = (request, refusal)

    def schedule(self, *args: Any, **kwargs: Any) -> Any:
        if self.kvgov_fleet is not None:
            self.kvgov_fleet.boundary()
        if self.kvgov is not None:
            self.kvgov.sweep_due()
        return super().schedule(*args, **kwargs)  # type: ignore[misc]

    def kvgov_block_ids_to_zero(self) -> list[int] | None:
        """This step's ``new_block_ids_to_zero``: every block that left an owner since the last."""
        binding = self.kvgov
        if binding is None:
            return super().kvgov_block_ids_to_zero()
        # vLLM's own record of new blocks: kept only where vLLM's cache needs zeroing itself
        # (mixed precision: a block reused across groups must read zero under the other
        # precision); otherwise the manager's adopt turned it off, as every block that left
        # an owner was ordered zeroed already (docs/vllm.md, "Cost")
        return binding.zero_orders(self.kv_cache_manager.take_new_block_ids())

    def has_requests(self) -> bool:
        if super().has_requests():  # type: ignore[misc]
            return True
        binding = self.kvgov
        return binding is not None and (
            binding.zero_pending()
            or bool(self._kvgov_refused)
            or (self.kvgov_fleet is not None and self.kvgov_fleet.has_orders())
        )

    def update_from_output(self, scheduler_output: Any, model_runner_output: Any) -> Any:
        outputs = super().update_from_output(scheduler_output, model_runner_output)  # type: ignore[misc]
        binding = self.kvgov
        if binding is None:
            return outputs
        if self._kvgov_refused:
            self._kvgov_deliver_refusals(outputs)
        binding.drain()
        binding.step_returned(
            scheduler_output.new_block_ids_to_zero, has_requests=self.has_requests
        )
        if self.kvgov_fleet is not None:
            self.kvgov_fleet.step_returned(scheduler_output.new_block_ids_to_zero)
        return outputs

    def _kvgov_deliver_refusals(self, outputs: dict[int, Any]) -> None:
        refused, self._kvgov_refused = self._kvgov_refused, {}
        for req_id, (request, message) in refused.items():
            if req_id not in self.requests or self.requests[req_id] is not request:
                continue  # aborted meanwhile: vLLM finished it
            request.status = RequestStatus.FINISHED_ERROR
            request.stop_reason = message
            fence.free_request(self, request)
            out = fence.error_output(request, message)
            batch = outputs.get(request.client_index)
            if batch is None:
                outputs[request.client_index] = batch = EngineCoreOutputs(outputs=[])
            batch.outputs.append(out)

    def shutdown(self) -> None:
        try:
            super().shutdown()  # type: ignore[misc]
        finally:
            try:
                if self.kvgov_fleet is not None:
                    self.kvgov_fleet.stop()
            finally:
                if self.kvgov is not None:
                    self.kvgov.close()

    # ------------------------------------------------------------------ operations

    def kvgov_live(self) -> list[RequestGovernance]:
        """The governance of every request vLLM still holds."""
        return [s for r in self.requests.values() if (s := fence.governance_of(r)) is not None]

    def kvgov_call(self, op: str, *args: Any) -> Any:
        """Run an erasure or maintenance operation; results are plain dicts.

        Operations: ``purge_tenant(tenant)``, ``invalidate({field: value})``,
        ``sweep()``, ``rotate_secret(secret_bytes)``, ``stats()``, ``state()``
        (block ids by state and pending zeroing, for checks).

        Raises:
            InvalidArgument: an unknown operation, or wrong arguments.
            UnsupportedEngine: the scheduler is not governed.
        """
        binding = self.kvgov
        if binding is None:
            raise UnsupportedEngine("this scheduler", "it was not built by vLLM's engine")
        if op not in OPERATIONS:
            raise InvalidArgument("op", op, f"one of {OPERATIONS}")
        try:
            if op == "purge_tenant":
                (tenant,) = args
                return _plain(binding.purge_tenant(tenant, self.kvgov_live()))
            if op == "invalidate":
                (filters,) = args
                if not isinstance(filters, dict) or not set(filters) <= set(SCOPE_FILTERS):
                    raise InvalidArgument("filters", filters, f"a dict of {SCOPE_FILTERS}")
                return _plain(binding.invalidate(self.kvgov_live(), filters))
            if op == "rotate_secret":
                (secret,) = args
                return binding.rotate_secret(secret, self.kvgov_live())
            if op == "stats":
                return _plain(binding.stats(len(self.requests)))
            if op == "state":
                return _pool_state(binding)
            return binding.sweep()
        except ValueError as exc:  # a wrong number of arguments
            if isinstance(exc, InvalidArgument):
                raise
            raise InvalidArgument("args", list(args), f"the arguments of {op}") from None


class GovernedScheduler(GovernedSchedulerMixin, Scheduler):
    """vLLM's scheduler, governed: ``--scheduler-cls kvgov.govern.vllm.GovernedScheduler``.

    With async scheduling on (vLLM's default for a custom class when the platform
    supports it), constructing it returns a :class:`GovernedAsyncScheduler`.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        config = kwargs.get("vllm_config") or (args[0] if args else None)
        if (
            cls is GovernedScheduler
            and config is not None
            and getattr(config.scheduler_config, "async_scheduling", False)
        ):
            # not an instance of cls, so Python does not call __init__ on it again
            return GovernedAsyncScheduler(*args, **kwargs)
        return super().__new__(cls)


class GovernedAsyncScheduler(GovernedSchedulerMixin, AsyncScheduler):
    """vLLM's async scheduler, governed by kvgov."""


def _check_governable(sched: Any) -> None:
    """Refuse every configuration whose KV the binding does not govern.

    Raises:
        UnsupportedEngine: a KV cache group kvgov does not govern (sink, R-SWA,
            HiSparse, circular buffers; Mamba state without kvgov's state zeroer:
            :func:`.groups.check_groups`) or, where requests are hashed (prefix
            caching on, or a KV connector), a hash block size other than a group's
            block size. A KV connector is
            classified after the binding opened (:mod:`.connectors`: governed by
            kind, or refused by name).
    """
    groups.check_groups(
        sched.kv_cache_config,
        sched.kv_cache_manager.coordinator,
        sched.hash_block_size,
        connector=sched.connector is not None,
    )


def connector_kinds(vllm_config: Any) -> Any:
    """The ``connector_kinds`` setting (operator-vouched connector classes), or None."""
    additional = getattr(vllm_config, "additional_config", None)
    return BindingSettings.load(additional, os.environ).connector_kinds


def _plain(result: Any) -> Any:
    """A dataclass result as plain dicts and lists (engine utility calls serialize them)."""
    if dataclasses.is_dataclass(result) and not isinstance(result, type):
        return {f.name: _plain(getattr(result, f.name)) for f in dataclasses.fields(result)}
    if isinstance(result, dict) or hasattr(result, "items"):
        return {k: _plain(v) for k, v in result.items()}
    if isinstance(result, tuple | list):
        return [_plain(v) for v in result]
    return result


def _pool_state(binding: VllmGovernance) -> dict[str, Any]:
    """Block ids by state, and the zeroing ordered but not yet carried by a step."""
    binding.drain()
    owned, cached = [], []
    for b in binding.pool.blocks:
        if b.is_null:
            continue
        if b.ref_cnt:
            owned.append(b.block_id)
        elif fence.block_hash(b) is not None:
            cached.append(b.block_id)
    return {
        "num_blocks": len(binding.pool.blocks),
        "owned": owned,
        "cached": cached,
        "pending_zero": list(binding.pool.kvgov_zero),
    }
