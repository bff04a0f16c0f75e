"""PolicyClient: the typed, fail-closed accessors the govern layer calls.

Each accessor builds the input of one rule of the bundle, asks the (cached)
engine, and checks the shape of the answer. Anything unexpected (an engine error,
a timeout, an undefined rule, a result of the wrong shape) gives the most
restrictive answer: admission ``allow=False, cache=False``; sharing and offload
``allow=False``; share groups ``publish=None, read=()``; retention
``ttl_seconds=0``; classifications an empty set. A wrong-shaped result is reported
by replacing the decision with one that has ``allow=False`` and ``error`` set
(same ``decision_id``, so the audit record still points at the evaluation).

Cache keys: for scope-shaped inputs the client passes the cache a precomputed
key, the tuple of the scope's nine values in :data:`SCOPE_FIELDS` order, used only
when the scope has exactly those keys and every value is a ``str`` or ``None``
(so the tuple determines the scope exactly; ``True``/``1`` confusion cannot arise
because other types fall back to canonical JSON). See :mod:`kvgov.policy.cache`.

Typed answers: each accessor reads its decision with a module-level reader
(``_read_admission`` ...) through :meth:`CachedEngine.answer
<policy.cache.CachedEngine.answer>`, which keeps the typed answer with the
cached decision and builds the policy input only on a miss; a cache hit returns
that same answer object, unchecked again.
"""

from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from kvgov.defaults import DECISION_CACHE_SIZE, MAX_PRIORITY, MIN_PRIORITY, OPA_TIMEOUT_SECONDS
from kvgov.exceptions import PolicyError
from kvgov.policy.cache import CachedEngine, CacheStats
from kvgov.policy.embedded import EmbeddedEngine
from kvgov.policy.engine import Decision, PolicyEngine
from kvgov.policy.latency import LatencySnapshot
from kvgov.policy.reference import ReferenceEngine
from kvgov.schema import SCOPE_FIELDS

__all__ = [
    "ADMISSION_PATH",
    "CLASSIFICATIONS_PATH",
    "GROUPS_PATH",
    "OFFLOAD_PATH",
    "RETENTION_PATH",
    "SCOPE_FIELDS",
    "SHARING_PATH",
    "AdmissionDecision",
    "OffloadDecision",
    "PolicyClient",
    "RetentionDecision",
    "ShareGroups",
    "SharingDecision",
    "scope_key",
]

#: Rule paths of the bundle.
ADMISSION_PATH = "kvgov/admission/decision"
SHARING_PATH = "kvgov/sharing/decision"
GROUPS_PATH = "kvgov/sharing/groups"
RETENTION_PATH = "kvgov/retention/decision"
OFFLOAD_PATH = "kvgov/offload/decision"
CLASSIFICATIONS_PATH = "kvgov/classifications"
EVICTION_PATH = "kvgov/eviction/decision"

_scope_values = operator.itemgetter(*SCOPE_FIELDS)
_NUMBER = (int, float)
_KEY_TYPES = frozenset({str, type(None)})


def scope_key(scope: Mapping[str, Any]) -> tuple[str | None, ...] | None:
    """Return the exact cache key of a scope, or None when it has another shape.

    Args:
        scope: a scope mapping.

    Returns:
        The values in :data:`SCOPE_FIELDS` order when the scope has exactly those
        nine keys and every value is ``str`` or ``None``; else None (the cache then
        keys by canonical JSON).
    """
    if len(scope) != len(SCOPE_FIELDS):
        return None
    try:
        values: tuple[Any, ...] = _scope_values(scope)
    except (KeyError, TypeError):
        return None
    if not _KEY_TYPES.issuperset(map(type, values)):
        return None
    return values


@dataclass(frozen=True, slots=True)
class AdmissionDecision:
    """May a scope be cached, and at what eviction priority.

    Attributes:
        allow: admit the request.
        cache: keep its blocks cached after release (False: zeroize at release).
        priority: eviction priority (0-100; lower is evicted first).
        reason: the policy's reason.
        decision: the underlying decision (id, revision, error) for audit.
    """

    allow: bool
    cache: bool
    priority: int
    reason: str
    decision: Decision


@dataclass(frozen=True, slots=True)
class _Verdict:
    """An allow / deny answer with the policy's reason (see the subclasses).

    Attributes:
        allow: the request is allowed.
        reason: the policy's reason.
        decision: the underlying decision.
    """

    allow: bool
    reason: str
    decision: Decision


@dataclass(frozen=True, slots=True)
class SharingDecision(_Verdict):
    """May a requester reuse blocks an owner cached.

    Attributes:
        allow: the requester may reuse the owner's blocks.
        reason: the policy's reason for allowing or refusing reuse.
        decision: the underlying decision (id, revision, error) for audit.
    """


@dataclass(frozen=True, slots=True)
class ShareGroups:
    """The share-group namespaces of a scope.

    Attributes:
        publish: the group whose namespace this scope's blocks are keyed in; None
            for the tenant's own namespace.
        read: the groups whose blocks this scope may look up.
        decision: the underlying decision.
    """

    publish: str | None
    read: tuple[str, ...]
    decision: Decision


@dataclass(frozen=True, slots=True)
class RetentionDecision:
    """How long an idle cached block of a scope may live.

    Attributes:
        ttl_seconds: seconds (0: evict as soon as it is released).
        decision: the underlying decision.
    """

    ttl_seconds: float
    decision: Decision


@dataclass(frozen=True, slots=True)
class OffloadDecision(_Verdict):
    """May a scope's blocks move to a slower tier.

    Attributes:
        allow: the blocks may be offloaded to the tier asked about.
        reason: the policy's reason, e.g. ``"internal data may be offloaded to host"``.
        decision: the underlying decision (id, revision, error) for audit.
    """


@dataclass(frozen=True, slots=True)
class CacheAmount:
    """A number of KV blocks, given as blocks or as a fraction of the pool.

    Attributes:
        blocks: the number of blocks, or None when given as a fraction.
        fraction: the fraction of the pool (0..1), or None when given as blocks.
    """

    blocks: int | None = None
    fraction: float | None = None

    def resolve(self, num_blocks: int) -> int:
        """The number of blocks in a pool of ``num_blocks`` (a fraction rounds down)."""
        if self.blocks is not None:
            return self.blocks
        return int((self.fraction or 0.0) * num_blocks)


@dataclass(frozen=True, slots=True)
class TenantEviction:
    """One tenant's eviction settings from the policy's data.

    Attributes:
        floor: cached blocks kept unless nothing else can be evicted, or None.
        cap: the most cached blocks the tenant keeps, or None.
        priority_duration: seconds after which a block's priority decays to the
            default, or None (never).
    """

    floor: CacheAmount | None
    cap: CacheAmount | None
    priority_duration: float | None


@dataclass(frozen=True, slots=True)
class EvictionSettings:
    """Every tenant's floor, cap and priority duration (``kvgov/eviction/decision``).

    Attributes:
        tenants: tenant -> its settings (only tenants with any set).
        errors: what is malformed in the policy's data; a governor refuses the
            settings when there is any.
        decision: the underlying decision.
    """

    tenants: Mapping[str, TenantEviction]
    errors: tuple[str, ...]
    decision: Decision


def _malformed(decision: Decision, what: str) -> Decision:
    """The same decision, denied, with the shape error as its error."""
    if decision.error is not None:
        return decision
    error = f"wrong-shaped result from {decision.path}: {what}"
    if decision.result is None:
        error = f"undefined result from {decision.path}"
    return dataclasses.replace(decision, allow=False, error=error, reason=f"policy error: {error}")


def _is_int(x: Any) -> bool:
    return type(x) is int or (type(x) is float and x.is_integer())


# The readers: each turns one rule's decision into its typed answer, or into the
# fail-closed answer when the decision failed or has the wrong shape. They are
# module-level so CachedEngine.answer can keep their answers (it matches a
# reader by identity).


def _verdict_result(d: Decision) -> dict[str, Any] | None:
    """The result when ``d`` did not fail and its result has ``allow: bool, reason: str``."""
    r = d.result
    if (
        d.error is None
        and type(r) is dict
        and type(r.get("allow")) is bool
        and type(r.get("reason")) is str
    ):
        return r
    return None


def _read_admission(d: Decision) -> AdmissionDecision:
    r = _verdict_result(d)
    if (
        r is not None
        and type(r.get("cache")) is bool
        and _is_int(r.get("priority"))
        and MIN_PRIORITY <= r["priority"] <= MAX_PRIORITY
    ):
        allow = r["allow"]
        return AdmissionDecision(
            allow=allow,
            cache=allow and r["cache"],
            priority=int(r["priority"]),
            reason=r["reason"],
            decision=d,
        )
    d = _malformed(d, "expected {allow: bool, cache: bool, priority: int 0-100, reason: str}")
    return AdmissionDecision(allow=False, cache=False, priority=0, reason=d.reason, decision=d)


_V = TypeVar("_V", bound=_Verdict)


def _read_verdict(kind: type[_V], d: Decision) -> _V:
    """Read an {allow, reason} result, or deny with the shape error."""
    r = _verdict_result(d)
    if r is not None:
        return kind(allow=r["allow"], reason=r["reason"], decision=d)
    d = _malformed(d, "expected {allow: bool, reason: str}")
    return kind(allow=False, reason=d.reason, decision=d)


_read_sharing = partial(_read_verdict, SharingDecision)
_read_offload = partial(_read_verdict, OffloadDecision)


def _read_groups(d: Decision) -> ShareGroups:
    r = d.result
    if d.error is None and type(r) is dict:
        publish, read = r.get("publish", ()), r.get("read")
        if (
            (publish is None or type(publish) is str)
            and type(read) is list
            and all(type(g) is str for g in read)
        ):
            return ShareGroups(publish=publish, read=tuple(read), decision=d)
    d = _malformed(d, "expected {publish: str | null, read: [str]}")
    return ShareGroups(publish=None, read=(), decision=d)


def _read_retention(d: Decision) -> RetentionDecision:
    r = d.result
    if d.error is None and type(r) is dict:
        ttl: Any = r.get("ttl_seconds")
        if type(ttl) in _NUMBER and math.isfinite(ttl) and ttl >= 0:
            return RetentionDecision(ttl_seconds=ttl, decision=d)
    d = _malformed(d, "expected {ttl_seconds: number >= 0}")
    return RetentionDecision(ttl_seconds=0, decision=d)


def _read_amount(q: Any) -> CacheAmount | None:
    """``{"blocks": n}`` or ``{"fraction": f}`` as a CacheAmount; None for null."""
    if q is None:
        return None
    if type(q) is dict and len(q) == 1:
        n: Any = q.get("blocks")
        if _is_int(n) and n >= 0:
            return CacheAmount(blocks=int(n))
        f = q.get("fraction")
        if isinstance(f, int | float) and not isinstance(f, bool) and 0 <= f <= 1:
            return CacheAmount(fraction=float(f))
    raise ValueError(f"not a cache amount: {q!r}")


def _read_eviction(d: Decision) -> EvictionSettings:
    r = d.result
    if d.error is None and type(r) is dict and type(r.get("tenants")) is dict:
        errors = r.get("errors")
        if type(errors) is list and errors and all(type(e) is str for e in errors):
            # the operator's data is malformed: say what, read nothing
            return EvictionSettings(tenants={}, errors=tuple(sorted(errors)), decision=d)
        if type(errors) is list and not errors:
            try:
                tenants: dict[str, TenantEviction] = {}
                for t, cfg in r["tenants"].items():
                    s = cfg["priority_duration"]
                    if s is not None and (type(s) not in (int, float) or not 0 < s < math.inf):
                        raise ValueError(f"not a duration: {s!r}")
                    tenants[t] = TenantEviction(
                        floor=_read_amount(cfg["floor"]),
                        cap=_read_amount(cfg["cap"]),
                        priority_duration=None if s is None else float(s),
                    )
                return EvictionSettings(tenants=tenants, errors=tuple(sorted(errors)), decision=d)
            except (KeyError, TypeError, ValueError) as exc:
                d = _malformed(d, f"expected {{tenants, errors}}: {exc}")
    d = _malformed(d, "expected {tenants: {tenant: {floor, cap, priority_duration}}, errors}")
    return EvictionSettings(tenants={}, errors=(d.error or "malformed",), decision=d)


def _read_classifications(d: Decision) -> frozenset[str]:
    r = d.result
    if d.error is None and type(r) is list and all(type(c) is str for c in r):
        return frozenset(r)
    return frozenset()


class PolicyClient:
    """Typed, fail-closed policy decisions for the govern layer.

    Args:
        engine: the engine; a :class:`~kvgov.policy.cache.CachedEngine` is used as is,
            any other engine is wrapped in one of ``cache_size`` decisions.
        cache_size: decisions cached when wrapping (0: no cache).
    """

    def __init__(self, engine: PolicyEngine, *, cache_size: int = DECISION_CACHE_SIZE) -> None:
        if isinstance(engine, CachedEngine):
            self._cached = engine
        else:
            self._cached = CachedEngine(engine, cache_size)

    @classmethod
    def create(
        cls,
        policy_dir: str | Path | None = None,
        policy_data: Mapping[str, Any] | None = None,
        engine: str | PolicyEngine = "embedded",
        *,
        cache_size: int = DECISION_CACHE_SIZE,
        run_tests: bool = True,
        opa_url: str | None = None,
        opa_token: str | None = None,
        opa_timeout: float = OPA_TIMEOUT_SECONDS,
    ) -> PolicyClient:
        """Build a client over the embedded engine, OPA in-process, an OPA server, or an engine.

        Args:
            policy_dir: bundle directory for the embedded or reference engine
                (None: bundled).
            policy_data: data deep-merged over data.json (embedded or reference engine).
            engine: ``"embedded"`` (regorus, the default), ``"reference"`` (OPA itself,
                in-process, about 120 µs per uncached decision: see
                :mod:`kvgov.policy.reference`), ``"opa-server"`` (needs ``opa_url``),
                or an engine.
            cache_size: decisions cached (0: none).
            run_tests: run the bundle's tests before activating it (embedded: on
                regorus; reference: on OPA).
            opa_url: the OPA server URL, e.g. ``http://127.0.0.1:8181``.
            opa_token: bearer token for the OPA server.
            opa_timeout: seconds the OPA server has per decision.

        Returns:
            The client.

        Raises:
            PolicyLoadError: the bundle does not load (embedded or reference engine).
            PolicyTestFailure: a bundle test failed (embedded or reference engine).
            PolicyError: an unknown engine name, ``opa-server`` without a URL, or
                ``reference`` without OPA's bindings installed.
        """
        inner: PolicyEngine
        if engine == "embedded":
            inner = EmbeddedEngine(policy_dir, policy_data, run_tests=run_tests)
        elif engine == "reference":
            inner = ReferenceEngine(policy_dir, policy_data, run_tests=run_tests)
        elif engine == "opa-server":
            if opa_url is None:
                raise PolicyError("engine='opa-server' needs opa_url, e.g. http://127.0.0.1:8181")
            from kvgov.policy.opa_server import OpaServerEngine

            inner = OpaServerEngine(opa_url, token=opa_token, timeout=opa_timeout)
        elif isinstance(engine, str):
            raise PolicyError(
                f"unknown engine {engine!r}: use 'embedded', 'reference' or 'opa-server'"
            )
        else:
            inner = engine
        return cls(inner, cache_size=cache_size)

    @property
    def engine(self) -> CachedEngine:
        """The cached engine decisions go through."""
        return self._cached

    @property
    def bundle_revision(self) -> str:
        """The active bundle's revision."""
        return self._cached.bundle_revision

    def cache_stats(self) -> CacheStats:
        """Return the decision cache's hits, misses and size."""
        return self._cached.stats()

    def evaluation_latency(self) -> dict[str, LatencySnapshot]:
        """How long the engine took per rule path, for evaluations the cache did not serve.

        Returns:
            A latency histogram snapshot per rule path.
        """
        return self._cached.latency()

    def admission(
        self, scope: Mapping[str, Any], tokens: int, priority: int | None
    ) -> AdmissionDecision:
        """Decide whether a request's KV state may be cached.

        Args:
            scope: the request's scope.
            tokens: tokens in the request.
            priority: requested eviction priority, or None for the policy's.

        Returns:
            The decision; fails closed (allow and cache False) on any error.
        """
        sk = scope_key(scope)
        key = None
        if sk is not None and type(tokens) is int and (priority is None or type(priority) is int):
            key = (sk, tokens, priority)
        return self._cached.answer(
            ADMISSION_PATH,
            key,
            _read_admission,
            lambda: {"scope": scope, "tokens": tokens, "priority": priority},
        )

    def sharing(self, requester: Mapping[str, Any], owner: Mapping[str, Any]) -> SharingDecision:
        """Decide whether ``requester`` may reuse blocks ``owner`` cached.

        Args:
            requester: the scope asking.
            owner: the scope that cached the blocks.

        Returns:
            The decision; fails closed (allow False) on any error.
        """
        rk, ok = scope_key(requester), scope_key(owner)
        key = (rk, ok) if rk is not None and ok is not None else None
        return self._cached.answer(
            SHARING_PATH, key, _read_sharing, lambda: {"requester": requester, "owner": owner}
        )

    def offload(self, scope: Mapping[str, Any], tier: str) -> OffloadDecision:
        """Decide whether a scope's blocks may move to ``tier``.

        Args:
            scope: the blocks' scope.
            tier: the target tier's name (``"host"``, ``"disk"``, ``"redis"``: the names
                of the offload store's tiers, see docs/offload.md).

        Returns:
            The decision; fails closed (allow False) on any error.
        """
        sk = scope_key(scope)
        key = (sk, tier) if sk is not None and type(tier) is str else None
        return self._cached.answer(
            OFFLOAD_PATH, key, _read_offload, lambda: {"scope": scope, "tier": tier}
        )

    def share_groups(self, scope: Mapping[str, Any]) -> ShareGroups:
        """Return the share-group namespaces a scope publishes in and reads from.

        Args:
            scope: the scope.

        Returns:
            The groups; fails closed (publish None, read empty) on any error.
        """
        return self._cached.answer(
            GROUPS_PATH, scope_key(scope), _read_groups, lambda: {"scope": scope}
        )

    def retention(self, scope: Mapping[str, Any]) -> RetentionDecision:
        """Return how long an idle cached block of a scope may live.

        Args:
            scope: the scope.

        Returns:
            The TTL; fails closed (0 seconds) on any error.
        """
        return self._cached.answer(
            RETENTION_PATH, scope_key(scope), _read_retention, lambda: {"scope": scope}
        )

    def classifications(self) -> frozenset[str]:
        """Return the classification labels the policy knows.

        Returns:
            The labels; an empty set on any error (every label is then unknown).
        """
        return self._cached.answer(CLASSIFICATIONS_PATH, (), _read_classifications, dict)

    def eviction(self) -> EvictionSettings:
        """Return every tenant's cache floor, cap and priority duration.

        Returns:
            The settings; on any error, none and the error in ``errors`` (a governor
            then refuses them and keeps what it had).
        """
        return self._cached.answer(EVICTION_PATH, (), _read_eviction, dict)

    def reload(
        self, policy_dir: str | Path | None = None, policy_data: Mapping[str, Any] | None = None
    ) -> str:
        """Reload the in-process engine's bundle atomically (see EmbeddedEngine.reload).

        Args:
            policy_dir: new bundle directory; None keeps the current one.
            policy_data: new data over data.json; None keeps the current data.

        Returns:
            The new revision.

        Raises:
            PolicyLoadError: the new bundle does not load; the old one stays active.
            PolicyTestFailure: its tests fail; the old one stays active.
            PolicyError: the engine cannot reload (an OPA server reloads itself).
        """
        inner = self._cached.engine
        if not isinstance(inner, EmbeddedEngine | ReferenceEngine):
            raise PolicyError(
                f"the {inner.name} engine cannot reload here; load bundles into the server"
            )
        return inner.reload(policy_dir, policy_data)

    def close(self) -> None:
        """Close the cache and the engine."""
        self._cached.close()
