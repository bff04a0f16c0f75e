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

3. on vLLM 0.32 only, in the API process: a refused request would reach an
   OpenAI client as HTTP 500 without a reason; the shim turns it into HTTP 403
   with kvgov's reason (0.33 carries it natively as HTTP 400).

The governed scheduler refuses to start where the plugin did not run
(:func:`check_registered`). :func:`register` never raises: vLLM does not guard
general plugins, and a stock engine must keep starting.
"""

from __future__ import annotations

import logging
from typing import Any

from kvgov.exceptions import UnsupportedEngine

__all__ = ["check_registered", "register"]

_log = logging.getLogger("kvgov.vllm")
_MARK = "_kvgov"


def register() -> None:
    """Install kvgov's hooks in this vLLM process (see the module docstring). Idempotent."""
    try:
        from . import compat

        compat.check_version()
    except Exception as exc:  # an untested vLLM: the governed scheduler refuses to start
        _log.warning("kvgov: vLLM plugin not installed: %s", exc)
        return
    _force_zeroing()
    _install_engine_hooks()
    if compat.needs_frontend_shim():
        _install_frontend_shim()


def check_registered() -> None:
    """Refuse to build a governed scheduler in a process where the plugin did not run.

    Raises:
        UnsupportedEngine: the zeroing flag is not forced or the engine hooks are
            missing (kvgov not installed in the engine's environment, or excluded
            with ``VLLM_PLUGINS``).
    """
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.kv_cache_interface import KVCacheConfig

    prop = KVCacheConfig.__dict__.get("needs_kv_cache_zeroing")
    forced = getattr(getattr(prop, "fget", None), _MARK, False)
    hooked = getattr(EngineCore.preprocess_add_request, _MARK, False)
    if not (forced and hooked):
        raise UnsupportedEngine(
            "this engine: kvgov's vLLM plugin did not run in the engine process, so freed "
            "KV blocks would not be zeroed in the workers",
            "install kvgov in the engine's environment (pip install 'kvgov[vllm]') so vLLM "
            "loads its vllm.general_plugins entry point, and keep 'kvgov' in VLLM_PLUGINS "
            "if you set it",
        )


def _force_zeroing() -> None:
    from vllm.v1.kv_cache_interface import KVCacheConfig

    prop = KVCacheConfig.__dict__.get("needs_kv_cache_zeroing")
    if getattr(getattr(prop, "fget", None), _MARK, False):
        return

    def needs_kv_cache_zeroing(self: Any) -> bool:
        """Forced on by kvgov: blocks that leave an owner are zeroed in the workers."""
        return True

    setattr(needs_kv_cache_zeroing, _MARK, True)
    KVCacheConfig.needs_kv_cache_zeroing = property(needs_kv_cache_zeroing)


def _install_engine_hooks() -> None:
    from vllm.v1.engine.core import EngineCore

    from .requests import deferred_block_hasher

    original = EngineCore.preprocess_add_request
    if getattr(original, _MARK, False):
        return

    def preprocess_add_request(self: Any, request: Any, *args: Any, **kwargs: Any) -> Any:
        hasher = self.request_block_hasher
        if (
            hasher is not None
            and hasher is not deferred_block_hasher
            and getattr(self.scheduler, "kvgov_defers_hashing", False)
        ):
            self.request_block_hasher = deferred_block_hasher
        return original(self, request, *args, **kwargs)

    def kvgov_call(self: Any, op: str, *args: Any) -> Any:
        """Run one of the governed scheduler's operations (purge_tenant, invalidate, ...)."""
        call = getattr(self.scheduler, "kvgov_call", None)
        if call is None:
            raise UnsupportedEngine(
                "this engine's scheduler",
                "start it with --scheduler-cls kvgov.govern.vllm.GovernedScheduler",
            )
        return call(op, *args)

    setattr(preprocess_add_request, _MARK, True)
    EngineCore.preprocess_add_request = preprocess_add_request
    EngineCore.kvgov_call = kvgov_call


def _install_frontend_shim() -> None:
    """vLLM 0.32, API process: a kvgov refusal becomes HTTP 403 with its reason."""
    from http import HTTPStatus

    from vllm.exceptions import GracefulHTTPError
    from vllm.v1.engine import FinishReason
    from vllm.v1.engine.output_processor import OutputProcessor

    original = OutputProcessor.process_outputs
    if getattr(original, _MARK, False):
        return

    def process_outputs(self: Any, engine_core_outputs: Any, *args: Any, **kwargs: Any) -> Any:
        keep = engine_core_outputs
        for out in engine_core_outputs:
            if (
                out.finish_reason == FinishReason.ERROR
                and isinstance(out.stop_reason, str)
                and out.stop_reason.startswith("kvgov:")
            ):
                state = self.request_states.get(out.request_id)
                if state is None or state.queue is None:  # LLM(...): the normal path reports it
                    continue
                state.queue.put(GracefulHTTPError(out.stop_reason, HTTPStatus.FORBIDDEN))
                self._finish_request(state)
                keep = [x for x in keep if x is not out]
        return original(self, keep, *args, **kwargs)

    setattr(process_outputs, _MARK, True)
    OutputProcessor.process_outputs = process_outputs
