"""kvgov's vLLM general plugin: the entry point ``kvgov`` of group ``vllm.general_plugins``.

vLLM runs :func:`register` once in every process it starts: the API server or
``LLM`` process, the engine core (first thing in ``EngineCore.__init__``, before
the scheduler is built) and each worker. Installing ``kvgov[vllm]`` registers it
(``pyproject.toml``); ``VLLM_PLUGINS`` can exclude it. Per process it:

1. forces ``KVCacheConfig.needs_kv_cache_zeroing`` on. A worker builds its KV
   zeroer only when that flag is true (the V1 GPU runner otherwise silently
   zeroes nothing; the CPU runner zeroes what it is given either way). The cost:
   in this environment every engine's managers record each new block id, and a
   *stock* scheduler then sends every newly allocated block to be zeroed (vLLM's
   behaviour for Mamba models); the governed scheduler sends only blocks that
   left an owner;
2. in the engine core, gives a governed engine a request hasher that hashes
   nothing (the governed scheduler hashes each request once, in its namespace,
   at admission) — a stock engine in the same environment keeps vLLM's hasher —
   and adds the engine utility ``kvgov_call(op, *args)``, which runs the
   scheduler's erasure and maintenance operations between steps::

       llm.llm_engine.engine_core.call_utility("kvgov_call", "purge_tenant", "acme")

3. makes the workers' zeroers clear Mamba state: the GPU runners' ``KVBlockZeroer``
   skips Mamba layers, kvgov's wrapper also fills the given blocks of every Mamba
   layer's conv and ssm state tensors with zeros (:func:`fence.install_state_zeroer`);
   on the CPU build, replaces the CPU runner's zeroer, which clears full-attention
   layers only, with one that clears every attention layer's tensor and every Mamba
   layer's state (a model whose layers all have a window keeps no KV in a zeroed block,
   a freed state block no state; :func:`fence.install_cpu_zeroer`);
4. on vLLM 0.32 only, in the API process: a refused request would reach an
   OpenAI client as HTTP 500 without a reason; the shim turns it into HTTP 403
   with kvgov's reason (0.33 carries it natively as HTTP 400).

The governed scheduler refuses to start where the plugin did not run
(:func:`check_registered`). :func:`register` never raises: vLLM does not guard
general plugins, and a stock engine must keep starting.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kvgov.exceptions import UnsupportedEngine

__all__ = ["check_registered", "register"]

_log = logging.getLogger("kvgov.vllm")


def register() -> None:
    """Install kvgov's hooks in this vLLM process (see the module docstring). Idempotent."""
    try:
        from . import fence

        fence.check_version()
    except Exception as exc:  # an untested vLLM: the governed scheduler refuses to start
        _log.warning("kvgov: vLLM plugin not installed: %s", exc)
        return
    fence.force_kv_cache_zeroing()
    try:
        fence.install_cpu_zeroer()
    except Exception as exc:  # the governed scheduler then refuses windowed groups on the CPU
        _log.warning("kvgov: CPU zeroer not installed: %s", exc)
    try:
        fence.install_state_zeroer()
    except Exception as exc:  # the governed scheduler then refuses Mamba groups
        _log.warning("kvgov: Mamba state zeroer not installed: %s", exc)
    _install_engine_hooks()
    if fence.needs_frontend_shim():
        _install_frontend_shim()


def check_registered() -> None:
    """Refuse to build a governed scheduler in a process where the plugin did not run.

    Raises:
        UnsupportedEngine: the zeroing flag is not forced or the engine hooks are
            missing (kvgov not installed in the engine's environment, or excluded
            with ``VLLM_PLUGINS``).
    """
    from . import fence

    if not (fence.kv_cache_zeroing_forced() and fence.engine_hooked()):
        raise UnsupportedEngine(
            "this engine: kvgov's vLLM plugin did not run in the engine process, so freed "
            "KV blocks would not be zeroed in the workers",
            "install kvgov in the engine's environment (pip install 'kvgov[vllm]') so vLLM "
            "loads its vllm.general_plugins entry point, and keep 'kvgov' in VLLM_PLUGINS "
            "if you set it",
        )


def _install_engine_hooks() -> None:
    from . import fence
    from .requests import deferred_block_hasher

    if fence.engine_hooked():
        return

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def preprocess_add_request(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(self.scheduler, "kvgov_defers_hashing", False):
                fence.set_engine_hasher(self, deferred_block_hasher)
            return original(self, request, *args, **kwargs)

        return preprocess_add_request

    def kvgov_call(self: Any, op: str, *args: Any) -> Any:
        """Run one of the governed scheduler's operations (purge_tenant, invalidate, ...)."""
        call = getattr(self.scheduler, "kvgov_call", None)
        if call is None:
            raise UnsupportedEngine(
                "this engine's scheduler",
                "start it with --scheduler-cls kvgov.govern.vllm.GovernedScheduler",
            )
        return call(op, *args)

    fence.wrap_preprocess_add_request(wrap)
    fence.add_engine_call(kvgov_call)


def _install_frontend_shim() -> None:
    """vLLM 0.32, API process: a kvgov refusal becomes HTTP 403 with its reason."""
    from http import HTTPStatus

    from vllm.exceptions import GracefulHTTPError
    from vllm.v1.engine import FinishReason

    from . import fence

    def wrap(original: Callable[..., Any]) -> Callable[..., Any]:
        def process_outputs(self: Any, engine_core_outputs: Any, *args: Any, **kwargs: Any) -> Any:
            keep = engine_core_outputs
            for out in engine_core_outputs:
                if (
                    out.finish_reason == FinishReason.ERROR
                    and isinstance(out.stop_reason, str)
                    and out.stop_reason.startswith("kvgov:")
                ):
                    state = self.request_states.get(out.request_id)
                    if state is None or state.queue is None:  # LLM(...): the normal path reports
                        continue
                    state.queue.put(GracefulHTTPError(out.stop_reason, HTTPStatus.FORBIDDEN))
                    fence.finish_output_request(self, state)
                    keep = [x for x in keep if x is not out]
            return original(self, keep, *args, **kwargs)

        return process_outputs

    fence.wrap_process_outputs(wrap)
