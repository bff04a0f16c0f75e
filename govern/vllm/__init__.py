"""kvgov's vLLM binding: the governor on vLLM's own prefix cache, driven by vLLM's scheduler.

Select the scheduler, and install kvgov in the engine's environment (its
general plugin must run in every vLLM process)::

    pip install 'kvgov[vllm]'
    vllm serve MODEL --scheduler-cls kvgov.govern.vllm.GovernedScheduler \\
        --additional-config '{"kvgov": {"audit_url": "postgresql+psycopg://..."}}'

or ``LLM(model, scheduler_cls="kvgov.govern.vllm.GovernedScheduler", ...)``.
A trusted front end sets each request's scope in ``extra_args`` and signs it
(:func:`sign_scope_token`). docs/vllm.md has the whole contract.

The modules that need vLLM (``scheduler``, ``binding``, ``pool``, ``manager``,
``fence``, ``plugin``, ``requests``) are imported on first use of their names,
so a front end imports ``sign_scope_token`` without vLLM installed.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from ..scope_resolver import SCOPE_KEYS, EngineScope, ScopeResolver
from ..scope_token import ScopeTokenVerifier, sign_scope_token
from .settings import BindingSettings

if TYPE_CHECKING:
    from .binding import VllmGovernance
    from .scheduler import GovernedAsyncScheduler, GovernedScheduler

#: Names that need vLLM, and their modules.
_LAZY = {
    "GovernedAsyncScheduler": ".scheduler",
    "GovernedScheduler": ".scheduler",
    "VllmGovernance": ".binding",
}

__all__ = [
    "SCOPE_KEYS",
    "BindingSettings",
    "EngineScope",
    "GovernedAsyncScheduler",
    "GovernedScheduler",
    "ScopeResolver",
    "ScopeTokenVerifier",
    "VllmGovernance",
    "sign_scope_token",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kvgov.govern.vllm' has no attribute {name!r}")
    value = getattr(import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
