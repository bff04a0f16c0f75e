"""Prometheus metrics for everything in :meth:`GovernedKVCache.stats`.

Embed it in a serving stack's own registry::

    from prometheus_client import REGISTRY
    from kvgov.govern.metrics import CacheCollector

    REGISTRY.register(CacheCollector(cache))

The collector reads one ``stats()`` snapshot per scrape, so the numbers of one
scrape are consistent with each other. ``kvgov demo --metrics-port N`` serves
them on ``http://127.0.0.1:N/metrics`` while it runs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from .stats import CacheStats, OffloadSnapshot

__all__ = ["CacheCollector", "serve_metrics"]


class _HasStats(Protocol):
    def stats(self) -> CacheStats: ...


class CacheCollector:
    """A Prometheus collector over a governed cache's ``stats()``.

    Metric names (all prefixed ``kvgov_``; per-tenant ones carry a ``tenant`` label):
    ``requests_total``, ``queried_tokens_total``, ``hit_tokens_total``,
    ``prefill_tokens_avoided_total``, ``cross_tenant_reuses_total``,
    ``cross_tenant_denied_total``, ``denials_total{reason}``,
    ``evictions_total{reason}``, ``blocks_zeroized_total``,
    ``bytes_zeroized_total``, ``blocks{state}`` (per tenant: owned, cached),
    ``pool_blocks{state}`` (free, owned, cached, dirty), ``live_sequences``,
    ``orphans_recovered_total``, ``decision_cache_hits_total``,
    ``decision_cache_misses_total``, and with offload tiers
    ``blocks_offloaded_total``, ``blocks_restored_total``,
    ``offload_refusals_total`` (per tenant) and, per ``tier``:
    ``offload_capacity_bytes``, ``offload_stored_bytes``, ``offload_stored_blocks``,
    ``offload_available`` (gauges); ``offload_puts_total``,
    ``offload_put_bytes_total``, ``offload_hits_total``, ``offload_misses_total``,
    ``offload_evictions_total``, ``offload_expired_total``, ``offload_deleted_total``,
    ``offload_unavailable_total``, ``offload_decrypt_failures_total``,
    ``offload_refusals_by_reason_total{reason}``, ``offload_policy_denied_total``;
    ``offload_not_offloaded_total{reason}`` and ``offload_restore_errors_total``.

    Args:
        cache: anything with a ``stats()`` returning :class:`CacheStats`.
    """

    def __init__(self, cache: _HasStats) -> None:
        self._cache = cache

    def collect(self) -> Iterator[Metric]:
        """Yield one family per metric from a single stats snapshot."""
        s = self._cache.stats()
        scalar = {
            "requests": "sequences admitted",
            "queried_tokens": "prompt tokens of admitted sequences",
            "hit_tokens": "prompt tokens served from cache",
            "prefill_tokens_avoided": "prefill tokens the caller could skip",
            "cross_tenant_reuses": "reuses of another tenant's blocks granted by a share group",
            "cross_tenant_denied": "reuses of another tenant's blocks the sharing policy refused",
            "blocks_zeroized": "blocks zeroized",
            "bytes_zeroized": "bytes zeroized",
        }
        if s.offload is not None:
            scalar |= {
                "blocks_offloaded": "evicted blocks sealed into an offload tier",
                "blocks_restored": "blocks restored from an offload tier (hits)",
                "offload_refusals": "offloaded objects refused on restore (tamper, move, replay)",
            }
        for name, doc in scalar.items():
            family = CounterMetricFamily(f"kvgov_{name}", doc, labels=["tenant"])
            for tenant, t in s.tenants.items():
                family.add_metric([tenant], float(getattr(t, name)))
            yield family
        for name, doc in (
            ("denials", "admissions refused, by reason"),
            ("evictions", "blocks evicted, by reason"),
        ):
            family = CounterMetricFamily(f"kvgov_{name}", doc, labels=["tenant", "reason"])
            for tenant, t in s.tenants.items():
                for reason, count in getattr(t, name).items():
                    family.add_metric([tenant, reason], float(count))
            yield family
        blocks = GaugeMetricFamily(
            "kvgov_blocks", "a tenant's blocks by state", labels=["tenant", "state"]
        )
        for tenant, t in s.tenants.items():
            for state, count in t.blocks_by_state.items():
                blocks.add_metric([tenant, state], float(count))
        yield blocks
        pool = GaugeMetricFamily("kvgov_pool_blocks", "pool blocks by state", labels=["state"])
        for state, count in s.total.blocks_by_state.items():
            pool.add_metric([state], float(count))
        yield pool
        yield GaugeMetricFamily("kvgov_live_sequences", "live sequences", value=s.live_sequences)
        yield CounterMetricFamily(
            "kvgov_orphans_recovered", "orphans released by reconcile", value=s.orphans_recovered
        )
        yield CounterMetricFamily(
            "kvgov_decision_cache_hits", "policy decisions from cache", value=s.decision_cache_hits
        )
        yield CounterMetricFamily(
            "kvgov_decision_cache_misses",
            "policy decisions evaluated",
            value=s.decision_cache_misses,
        )
        if s.offload is not None:
            yield from _offload_families(s.offload)


#: Offload tier gauges (a shared tier's fill counts every worker) and counters (this worker).
_TIER_GAUGES = {
    "capacity_bytes": "bytes the tier may hold",
    "stored_bytes": "bytes the tier holds now",
    "stored_blocks": "objects the tier holds now",
    "available": "1 while the tier is used, 0 while it is skipped after a failure",
}
_TIER_COUNTERS = {
    "puts": "objects sealed into the tier",
    "put_bytes": "bytes sealed into the tier",
    "hits": "restores the tier served",
    "misses": "lookups the tier could not serve",
    "evictions": "objects the tier evicted (LRU) for this worker's puts",
    "expired": "objects deleted past their retention deadline",
    "deleted": "objects deleted by purge, invalidation or rotation",
    "unavailable": "operations the tier could not serve while down",
    "decrypt_failures": "objects that failed AES-GCM authentication",
}


def _offload_families(snap: OffloadSnapshot) -> Iterator[Metric]:
    """The per-tier offload metrics of one stats snapshot."""
    for name, doc in _TIER_GAUGES.items():
        gauge = GaugeMetricFamily(f"kvgov_offload_{name}", doc, labels=["tier"])
        for tier, t in snap.tiers.items():
            value = getattr(t, name)
            if value is not None:  # None: the tier could not be asked
                gauge.add_metric([tier], float(value))
        yield gauge
    for name, doc in _TIER_COUNTERS.items():
        counter = CounterMetricFamily(f"kvgov_offload_{name}", doc, labels=["tier"])
        for tier, t in snap.tiers.items():
            counter.add_metric([tier], float(getattr(t, name)))
        yield counter
    refusals = CounterMetricFamily(
        "kvgov_offload_refusals_by_reason",
        "objects refused on restore, by reason",
        labels=["tier", "reason"],
    )
    for tier, t in snap.tiers.items():
        for reason, count in t.refusals.items():
            refusals.add_metric([tier, reason], float(count))
    yield refusals
    denied = CounterMetricFamily(
        "kvgov_offload_policy_denied",
        "evicted blocks the offload policy kept from the tier",
        labels=["tier"],
    )
    for tier, count in snap.policy_denied.items():
        denied.add_metric([tier], float(count))
    yield denied
    kept = CounterMetricFamily(
        "kvgov_offload_not_offloaded",
        "evicted blocks kept from every tier by the governor, by reason",
        labels=["reason"],
    )
    for reason, count in snap.not_offloaded.items():
        kept.add_metric([reason], float(count))
    yield kept
    yield CounterMetricFamily(
        "kvgov_offload_restore_errors",
        "restores abandoned: an authentic object could not be used",
        value=snap.restore_errors,
    )


def serve_metrics(cache: _HasStats, port: int, addr: str = "127.0.0.1") -> Any:
    """Serve the cache's metrics over HTTP on a daemon thread.

    Args:
        cache: the governed cache.
        port: TCP port (0 picks a free one; read it from ``server.server_port``).
        addr: address to bind; loopback by default.

    Returns:
        The HTTP server; call ``shutdown()`` to stop it.
    """
    registry = CollectorRegistry()
    registry.register(CacheCollector(cache))
    server, _thread = start_http_server(port, addr=addr, registry=registry)
    return server
