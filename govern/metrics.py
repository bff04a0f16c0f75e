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

from .stats import CacheStats

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
    ``decision_cache_misses_total``.

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
