"""Which vLLM KV connector kvgov governs, and how: :func:`classify`, :class:`ConnectorGovernance`.

A KV connector loads KV from outside the engine's pool (host memory, disk, a
store shared by many servers). Whose KV it loads depends on what it keys by:

=================  ===========================================================
``block_hashes``   the connector keys external KV by ``request.block_hashes``
                   (vLLM's ``OffloadingConnector``, kvgov's
                   ``GovernedKVConnector``). Under the governed scheduler those
                   hashes are kvgov's keyed chain in the request's namespace, so
                   the connector is scoped as it is: it is governed in place, its
                   external hits audited (``offload_restore``: owner = the scope
                   whose chain it is, requester), the blocks a load fills owned by
                   the request like any other it was given.
``cache_salt``     the connector keys by token ids and honours ``cache_salt``
                   (LMCache's adapters): the request's salt is replaced by a digest
                   of its keyed namespace (and the client's salt), so the client's
                   salt never reaches the connector and two scopes never share a
                   salt.
=================  ===========================================================

Every other connector is refused at start, by its class, with the reason (a
connector keyed by token ids alone shares KV across tenants). An operator may
vouch for a third-party connector with the ``connector_kinds`` setting
(``{"package.module.ClassName": "block_hashes"}``): the class then is governed
as that kind. Classes are named by module and qualified name, so a connector
registered under a built-in's name from another module is not mistaken for it.
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from kvgov.audit import AuditEvent, EventType
from kvgov.exceptions import BindingConfigError, UnsupportedEngine

from . import fence

if TYPE_CHECKING:
    from .binding import VllmGovernance
    from .request_state import RequestGovernance

__all__ = [
    "GOVERNED",
    "REFUSED",
    "ConnectorGovernance",
    "ConnectorKind",
    "class_path",
    "classify",
    "connector_salt",
]

_V1 = "vllm.distributed.kv_transfer.kv_connector.v1."


class ConnectorKind(enum.StrEnum):
    """How a governed connector is scoped (see the module docstring)."""

    BLOCK_HASHES = "block_hashes"
    CACHE_SALT = "cache_salt"


#: Connector classes governed out of the box, by ``module.QualifiedName``.
GOVERNED: Mapping[str, ConnectorKind] = {
    _V1 + "offloading_connector.OffloadingConnector": ConnectorKind.BLOCK_HASHES,
    "kvgov.govern.vllm.kv_connector.GovernedKVConnector": ConnectorKind.BLOCK_HASHES,
    _V1 + "lmcache_connector.LMCacheConnectorV1": ConnectorKind.CACHE_SALT,
    _V1 + "lmcache_mp_connector.LMCacheMPConnector": ConnectorKind.CACHE_SALT,
}

#: Why a known connector is refused, by class name (the reason in the refusal).
REFUSED: Mapping[str, str] = {
    "ExampleConnector": "it keys KV by a hash of the token ids alone and ignores cache_salt",
    "ExampleHiddenStatesConnector": "it keys hidden states by token ids alone",
    "DecodeBenchConnector": "it fills KV with synthetic data for benchmarks",
    "NixlConnector": "it transfers KV between engines by request, outside the scoped keys",
    "NixlPullConnector": "it transfers KV between engines by request, outside the scoped keys",
    "NixlPushConnector": "it transfers KV between engines by request, outside the scoped keys",
    "MooncakeConnector": "it transfers KV between engines by request, outside the scoped keys",
    "MoRIIOConnector": "it transfers KV between engines by request, outside the scoped keys",
    "MultiConnector": "its member connectors are not classified one by one",
    "HiSparseConnector": "its host pages are keyed outside kvgov's scoped chain",
}

_OTHER = "kvgov does not know what it keys external KV by (declare it in connector_kinds)"


def class_path(connector: Any) -> str:
    """``module.QualifiedName`` of a connector object's class."""
    cls = type(connector)
    return f"{cls.__module__}.{cls.__qualname__}"


def classify(connector: Any, declared: Mapping[str, Any] | None = None) -> ConnectorKind:
    """The kind a connector is governed as, or a refusal naming it.

    Args:
        connector: the scheduler-side connector object vLLM built.
        declared: the ``connector_kinds`` setting (class path -> kind), or None.

    Raises:
        BindingConfigError: ``declared`` names a kind that does not exist.
        UnsupportedEngine: a connector kvgov does not govern (the message names its
            class and why).
    """
    path = class_path(connector)
    for name, kind in (declared or {}).items():
        if kind not in set(ConnectorKind):
            raise BindingConfigError(
                f"connector_kinds[{name!r}]", kind, f"one of {[k.value for k in ConnectorKind]}"
            )
    if declared and path in declared:
        return ConnectorKind(declared[path])
    if path in GOVERNED:
        return GOVERNED[path]
    name = type(connector).__name__
    why = REFUSED.get(name, _OTHER) if path.startswith(_V1) else _OTHER
    raise UnsupportedEngine(
        f"the KV connector {path} ({why})",
        "use a connector that keys by request.block_hashes (OffloadingConnector, "
        "kvgov.govern.vllm.kv_connector.GovernedKVConnector) or honours cache_salt (LMCache)",
    )


def connector_salt(state: RequestGovernance, client_salt: str | None) -> str:
    """The salt a ``cache_salt`` connector sees: a digest of the keyed namespace and client salt.

    The namespace root is derived from kvgov's secret, so the salt reveals neither
    tenant nor scope; two scopes never get one salt, and a client cannot choose it.
    """
    h = hashlib.sha256(b"kvgov.vllm.connector-salt\x00")
    h.update(len(state.root).to_bytes(4, "big"))
    h.update(state.root)
    h.update((client_salt or "").encode("utf-8", "surrogatepass"))
    return h.hexdigest()


class ConnectorGovernance:
    """The governance of the scheduler's connector: salts and the audit of external hits.

    Built by :meth:`attach` on the governed scheduler; wraps the connector's
    ``get_num_new_matched_tokens`` (the one call through which external KV enters
    a request) on the instance, so vLLM's own calls go through it.
    """

    def __init__(self, binding: VllmGovernance, connector: Any, kind: ConnectorKind) -> None:
        self.binding = binding
        self.connector = connector
        self.kind = kind
        self.name = class_path(connector)
        #: external hit tokens audited, per tenant (metrics)
        self.hit_tokens: dict[str, int] = {}
        inner: Callable[..., Any] = connector.get_num_new_matched_tokens

        def get_num_new_matched_tokens(request: Any, num_computed_tokens: int) -> Any:
            result = inner(request, num_computed_tokens)
            self._audit_hit(request, result)
            return result

        connector.get_num_new_matched_tokens = get_num_new_matched_tokens
        bind = getattr(connector, "kvgov_bind", None)
        if callable(bind) and kind is ConnectorKind.BLOCK_HASHES and self.name in GOVERNED:
            bind(binding)  # kvgov's own connector: erasure reaches its tier

    @classmethod
    def attach(
        cls, binding: VllmGovernance, connector: Any, declared: Mapping[str, Any] | None
    ) -> ConnectorGovernance:
        """Classify the connector (refusing it by name) and govern it.

        Raises:
            UnsupportedEngine: a connector kvgov does not govern.
            BindingConfigError: a malformed ``connector_kinds``.
        """
        return cls(binding, connector, classify(connector, declared))

    def admitted(self, request: Any) -> None:
        """A request was admitted: a ``cache_salt`` connector gets the namespace's salt.

        The block hashes are made again with it, so every block of the request,
        prompt and decode, chains from one salt.
        """
        state: RequestGovernance | None = fence.governance_of(request)
        if self.kind is not ConnectorKind.CACHE_SALT or state is None:
            return
        request.cache_salt = connector_salt(state, request.cache_salt)
        if fence.block_hasher(request) is not None:
            request.block_hashes.clear()
            request.update_block_hashes()

    def _audit_hit(self, request: Any, result: Any) -> None:
        """Audit the external tokens the connector offers (owner: the scope whose chain it is)."""
        tokens = result[0] if isinstance(result, tuple) and result else None
        state: RequestGovernance | None = fence.governance_of(request)
        if not tokens or state is None:
            return  # None: the connector defers; 0: nothing external
        tenant = state.scope.tenant
        self.hit_tokens[tenant] = self.hit_tokens.get(tenant, 0) + int(tokens)
        self.binding.gov.audit.record(
            AuditEvent(
                type=EventType.OFFLOAD_RESTORE,
                **{**state.view.fields, "requester_tenant": tenant},
                sequence_id=state.seq_id,
                reused_tokens=int(tokens),
                details={"connector": self.name, "kind": str(self.kind)},
            )
        )
