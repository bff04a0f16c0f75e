"""Prometheus metrics for everything in :meth:`GovernedKVCache.stats`.

Embed it in a serving stack's own registry::

    from prometheus_client import REGISTRY
    from kvgov.govern.metrics import CacheCollector

    REGISTRY.register(CacheCollector(cache))

The collector reads one ``stats()`` snapshot per scrape, so the numbers of one
scrape are consistent with each other. ``kvgov demo --metrics-port N`` serves
them on ``http://127.0.0.1:N/metrics`` while it runs.

Names follow Prometheus' conventions: ``kvgov_`` first, the unit last
(``_seconds``, ``_bytes``, ``_ratio``, or what is counted: ``_blocks``,
``_tokens``), and ``_total`` on every counter. :data:`CACHE_METRICS` lists each
family once (name, type, labels, meaning); docs/operations.md lists the same,
and tests/govern/test_metrics.py holds the two and a scrape to each other.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NamedTuple, Protocol

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)

from kvgov.audit.metrics import AuditCollector
from kvgov.policy.latency import LatencySnapshot

from .stats import CacheStats, OffloadSnapshot

__all__ = ["CACHE_METRICS", "CacheCollector", "MetricInfo", "serve_metrics"]


class MetricInfo(NamedTuple):
    """One metric family as exposed (a counter's samples carry ``_total``)."""

    name: str
    type: str  # "counter", "gauge" or "histogram"
    labels: tuple[str, ...]
    help: str


def _m(name: str, kind: str, labels: str, doc: str) -> MetricInfo:
    return MetricInfo(name, kind, tuple(labels.split()), doc)


# Per tenant: family name -> (the TenantStats field, help).
_TENANT_COUNTERS = {
    "kvgov_requests_total": ("requests", "sequences admitted"),
    "kvgov_queried_tokens_total": ("queried_tokens", "prompt tokens of admitted sequences"),
    "kvgov_hit_tokens_total": ("hit_tokens", "prompt tokens served from cache"),
    "kvgov_avoided_prefill_tokens_total": (
        "prefill_tokens_avoided",
        "prefill tokens the caller could skip",
    ),
    "kvgov_cross_tenant_reuses_total": (
        "cross_tenant_reuses",
        "reuses of another tenant's blocks granted by a share group",
    ),
    "kvgov_cross_tenant_denials_total": (
        "cross_tenant_denied",
        "reuses of another tenant's blocks the sharing policy refused",
    ),
    "kvgov_zeroized_blocks_total": ("blocks_zeroized", "blocks zeroized"),
    "kvgov_zeroized_bytes_total": ("bytes_zeroized", "bytes zeroized"),
}
_TENANT_OFFLOAD_COUNTERS = {
    "kvgov_offloaded_blocks_total": (
        "blocks_offloaded",
        "evicted blocks sealed into an offload tier",
    ),
    "kvgov_restored_blocks_total": (
        "blocks_restored",
        "blocks restored from an offload tier (hits)",
    ),
    "kvgov_offload_refusals_total": (
        "offload_refusals",
        "offloaded objects refused on restore (tamper, move, replay)",
    ),
}
# Per tenant and reason.
_TENANT_REASONS = {
    "kvgov_admission_denials_total": ("denials", "admissions refused, by reason"),
    "kvgov_evicted_blocks_total": ("evictions", "blocks evicted, by reason"),
}
# Offload tier gauges (a shared tier's fill counts every worker) and counters (this worker).
_TIER_GAUGES = {
    "kvgov_offload_capacity_bytes": ("capacity_bytes", "bytes the tier may hold"),
    "kvgov_offload_stored_bytes": ("stored_bytes", "bytes the tier holds now"),
    "kvgov_offload_stored_objects": ("stored_blocks", "objects the tier holds now"),
    "kvgov_offload_available": (
        "available",
        "1 while the tier is used, 0 while it is skipped after a failure",
    ),
}
_TIER_COUNTERS = {
    "kvgov_offload_puts_total": ("puts", "objects sealed into the tier"),
    "kvgov_offload_put_bytes_total": ("put_bytes", "bytes sealed into the tier"),
    "kvgov_offload_hits_total": ("hits", "restores the tier served"),
    "kvgov_offload_misses_total": ("misses", "lookups the tier could not serve"),
    "kvgov_offload_evictions_total": (
        "evictions",
        "objects the tier evicted (LRU) for this worker's puts",
    ),
    "kvgov_offload_expired_total": ("expired", "objects deleted past their retention deadline"),
    "kvgov_offload_deleted_total": (
        "deleted",
        "objects deleted by purge, invalidation or rotation",
    ),
    "kvgov_offload_unavailable_total": (
        "unavailable",
        "operations the tier could not serve while down",
    ),
    "kvgov_offload_decrypt_failures_total": (
        "decrypt_failures",
        "objects that failed AES-GCM authentication",
    ),
}

#: Every family the collector exports; the ``kvgov_offload*``, ``*_offloaded_*`` and
#: ``*_restored_*`` ones only for a cache with offload tiers.
CACHE_METRICS: tuple[MetricInfo, ...] = (
    *(_m(n, "counter", "tenant", d) for n, (_f, d) in _TENANT_COUNTERS.items()),
    *(_m(n, "counter", "tenant reason", d) for n, (_f, d) in _TENANT_REASONS.items()),
    _m("kvgov_tenant_blocks", "gauge", "tenant state", "a tenant's blocks by state"),
    _m("kvgov_cached_blocks", "gauge", "tenant", "a tenant's CACHED blocks"),
    _m(
        "kvgov_cache_floor_utilisation_ratio",
        "gauge",
        "tenant",
        "a tenant's CACHED blocks over its floor, 0 to 1 (tenants with a floor)",
    ),
    _m(
        "kvgov_cache_cap_utilisation_ratio",
        "gauge",
        "tenant",
        "a tenant's CACHED blocks over its cap (tenants with a cap)",
    ),
    _m("kvgov_pool_blocks", "gauge", "state", "pool blocks by state"),
    _m(
        "kvgov_pool_usage_ratio",
        "gauge",
        "",
        "share of the pool's blocks not free (owned, cached or dirty), 0 to 1",
    ),
    _m("kvgov_live_sequences", "gauge", "", "live sequences"),
    _m("kvgov_recovered_orphans_total", "counter", "", "orphans released by reconcile"),
    _m("kvgov_decision_cache_hits_total", "counter", "", "policy decisions from cache"),
    _m("kvgov_decision_cache_misses_total", "counter", "", "policy decisions evaluated"),
    _m(
        "kvgov_admission_duration_seconds",
        "histogram",
        "outcome",
        "time admit() took, by outcome (admitted, denied, error)",
    ),
    _m(
        "kvgov_policy_evaluation_duration_seconds",
        "histogram",
        "rule",
        "time the policy engine took per rule path (decisions the cache did not serve)",
    ),
    *(_m(n, "counter", "tenant", d) for n, (_f, d) in _TENANT_OFFLOAD_COUNTERS.items()),
    *(_m(n, "gauge", "tier", d) for n, (_f, d) in _TIER_GAUGES.items()),
    *(_m(n, "counter", "tier", d) for n, (_f, d) in _TIER_COUNTERS.items()),
    _m(
        "kvgov_offload_refusals_by_reason_total",
        "counter",
        "tier reason",
        "objects refused on restore, by reason",
    ),
    _m(
        "kvgov_offload_policy_denials_total",
        "counter",
        "tier",
        "evicted blocks the offload policy kept from the tier",
    ),
    _m(
        "kvgov_offload_not_offloaded_blocks_total",
        "counter",
        "reason",
        "evicted blocks kept from every tier by the governor, by reason",
    ),
    _m(
        "kvgov_offload_restore_errors_total",
        "counter",
        "",
        "restores abandoned: an authentic object could not be used",
    ),
)
_HELP = {m.name: m.help for m in CACHE_METRICS}


def _counter(name: str, labels: list[str] | None = None, value: float | None = None) -> Any:
    # prometheus_client appends _total to a counter's samples itself
    return CounterMetricFamily(name.removesuffix("_total"), _HELP[name], labels=labels, value=value)


def _histogram(name: str, label: str, series: Mapping[str, LatencySnapshot]) -> Metric:
    family = HistogramMetricFamily(name, _HELP[name], labels=[label])
    for value, snap in series.items():
        buckets = [(repr(b), float(c)) for b, c in zip(snap.bounds, snap.cumulative, strict=False)]
        buckets.append(("+Inf", float(snap.count)))
        family.add_metric([value], buckets, sum_value=snap.sum)
    return family


class _HasStats(Protocol):
    def stats(self) -> CacheStats: ...


class CacheCollector:
    """A Prometheus collector over a governed cache's ``stats()``.

    Exports the families of :data:`CACHE_METRICS` (docs/operations.md lists them).

    Args:
        cache: anything with a ``stats()`` returning :class:`CacheStats`.
    """

    def __init__(self, cache: _HasStats) -> None:
        self._cache = cache

    def collect(self) -> Iterator[Metric]:
        """Yield one family per metric from a single stats snapshot."""
        s = self._cache.stats()
        scalar = dict(_TENANT_COUNTERS)
        if s.offload is not None:
            scalar |= _TENANT_OFFLOAD_COUNTERS
        for name, (field, _doc) in scalar.items():
            family = _counter(name, ["tenant"])
            for tenant, t in s.tenants.items():
                family.add_metric([tenant], float(getattr(t, field)))
            yield family
        for name, (field, _doc) in _TENANT_REASONS.items():
            family = _counter(name, ["tenant", "reason"])
            for tenant, t in s.tenants.items():
                for reason, count in getattr(t, field).items():
                    family.add_metric([tenant, reason], float(count))
            yield family
        blocks = GaugeMetricFamily(
            "kvgov_tenant_blocks", _HELP["kvgov_tenant_blocks"], labels=["tenant", "state"]
        )
        for tenant, t in s.tenants.items():
            for state, count in t.blocks_by_state.items():
                blocks.add_metric([tenant, state], float(count))
        yield blocks
        yield from _quota_families(s)
        states = s.total.blocks_by_state
        pool = GaugeMetricFamily("kvgov_pool_blocks", _HELP["kvgov_pool_blocks"], labels=["state"])
        for state, count in states.items():
            pool.add_metric([state], float(count))
        yield pool
        used = s.num_blocks - states.get("free", 0)
        yield GaugeMetricFamily(
            "kvgov_pool_usage_ratio",
            _HELP["kvgov_pool_usage_ratio"],
            value=used / s.num_blocks if s.num_blocks else 0.0,
        )
        yield GaugeMetricFamily(
            "kvgov_live_sequences", _HELP["kvgov_live_sequences"], value=s.live_sequences
        )
        yield _counter("kvgov_recovered_orphans_total", value=s.orphans_recovered)
        yield _counter("kvgov_decision_cache_hits_total", value=s.decision_cache_hits)
        yield _counter("kvgov_decision_cache_misses_total", value=s.decision_cache_misses)
        yield _histogram("kvgov_admission_duration_seconds", "outcome", s.admission_latency)
        yield _histogram("kvgov_policy_evaluation_duration_seconds", "rule", s.policy_latency)
        if s.offload is not None:
            yield from _offload_families(s.offload)


def _quota_families(s: CacheStats) -> Iterator[Metric]:
    """kvgov_cached_blocks per tenant, and each floor's and cap's utilisation."""
    cached = {t: ts.blocks_by_state.get("cached", 0) for t, ts in s.tenants.items()}
    family = GaugeMetricFamily(
        "kvgov_cached_blocks", _HELP["kvgov_cached_blocks"], labels=["tenant"]
    )
    for tenant, n in cached.items():
        family.add_metric([tenant], float(n))
    yield family
    floor = GaugeMetricFamily(
        "kvgov_cache_floor_utilisation_ratio",
        _HELP["kvgov_cache_floor_utilisation_ratio"],
        labels=["tenant"],
    )
    cap = GaugeMetricFamily(
        "kvgov_cache_cap_utilisation_ratio",
        _HELP["kvgov_cache_cap_utilisation_ratio"],
        labels=["tenant"],
    )
    for tenant, q in s.quotas.items():
        n = cached.get(tenant, 0)
        if q.floor:
            floor.add_metric([tenant], min(1.0, n / q.floor))
        if q.cap is not None:
            cap.add_metric([tenant], n / q.cap if q.cap else 1.0)
    yield floor
    yield cap


def _offload_families(snap: OffloadSnapshot) -> Iterator[Metric]:
    """The per-tier offload metrics of one stats snapshot."""
    for name, (field, doc) in _TIER_GAUGES.items():
        gauge = GaugeMetricFamily(name, doc, labels=["tier"])
        for tier, t in snap.tiers.items():
            value = getattr(t, field)
            if value is not None:  # None: the tier could not be asked
                gauge.add_metric([tier], float(value))
        yield gauge
    for name, (field, _doc) in _TIER_COUNTERS.items():
        counter = _counter(name, ["tier"])
        for tier, t in snap.tiers.items():
            counter.add_metric([tier], float(getattr(t, field)))
        yield counter
    refusals = _counter("kvgov_offload_refusals_by_reason_total", ["tier", "reason"])
    for tier, t in snap.tiers.items():
        for reason, count in t.refusals.items():
            refusals.add_metric([tier, reason], float(count))
    yield refusals
    denied = _counter("kvgov_offload_policy_denials_total", ["tier"])
    for tier, count in snap.policy_denied.items():
        denied.add_metric([tier], float(count))
    yield denied
    kept = _counter("kvgov_offload_not_offloaded_blocks_total", ["reason"])
    for reason, count in snap.not_offloaded.items():
        kept.add_metric([reason], float(count))
    yield kept
    yield _counter("kvgov_offload_restore_errors_total", value=snap.restore_errors)


def serve_metrics(cache: _HasStats, port: int, addr: str = "127.0.0.1") -> Any:
    """Serve the cache's metrics, and its audit log's, over HTTP on a daemon thread.

    Args:
        cache: the governed cache.
        port: TCP port (0 picks a free one; read it from ``server.server_port``).
        addr: address to bind; loopback by default.

    Returns:
        The HTTP server; call ``shutdown()`` to stop it.
    """
    registry = CollectorRegistry()
    registry.register(CacheCollector(cache))
    audit = getattr(cache, "audit", None)
    if audit is not None:  # a GovernedKVCache: its AuditLog too
        registry.register(AuditCollector(audit))
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    return server
