"""Prometheus metrics of an :class:`~kvgov.audit.AuditLog`: queue, spool, quarantine, memory.

Register it next to the cache's collector::

    from prometheus_client import REGISTRY
    from kvgov.audit.metrics import AuditCollector

    REGISTRY.register(AuditCollector(cache.audit))

Each scrape reads one :meth:`AuditLog.stats` snapshot. Alert on
``kvgov_audit_quarantined_records_total`` increasing (the database refused
records: the trail in the database has a hole until ``kvgov audit quarantine
replay``), on ``kvgov_audit_critical_spooled_events > 0`` for long (erasure
evidence only on this host), and on ``kvgov_audit_unavailable == 1`` (nothing can
be audited: operations refuse). :data:`AUDIT_METRICS` lists every family;
docs/operations.md lists the same (tests/govern/test_metrics.py checks).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from kvgov.audit.durability import AuditStats

__all__ = ["AUDIT_METRICS", "AuditCollector", "AuditMetricInfo"]


class AuditMetricInfo(NamedTuple):
    """One metric family as exposed (a counter's samples carry ``_total``)."""

    name: str
    type: str  # "counter" or "gauge"
    labels: tuple[str, ...]
    help: str


_GAUGES = {
    "kvgov_audit_in_memory_events": "events recorded but neither stored nor spooled "
    "(what kill -9 would lose now)",
    "kvgov_audit_queue_depth": "events waiting in the writer's queue",
    "kvgov_audit_spool_events": "events in the spool waiting for the database",
    "kvgov_audit_spool_bytes": "size of the spool file",
    "kvgov_audit_critical_spooled_events": "critical events whose evidence is only in the spool",
    "kvgov_audit_database_failing": "1 while the audit database fails",
    "kvgov_audit_unavailable": "1 while neither database nor spool can be written",
}
_COUNTERS = {
    "kvgov_audit_spooled_events_total": "events written to the spool",
    "kvgov_audit_quarantined_records_total": "records the database refused, kept in the quarantine",
    "kvgov_audit_damaged_spool_lines_total": "spool lines that did not parse, "
    "moved to the quarantine",
}

#: Every family the collector exports, each labelled by ``stream``.
AUDIT_METRICS: tuple[AuditMetricInfo, ...] = (
    *(AuditMetricInfo(n, "gauge", ("stream",), d) for n, d in _GAUGES.items()),
    *(AuditMetricInfo(n, "counter", ("stream",), d) for n, d in _COUNTERS.items()),
)


class _HasStats(Protocol):
    def stats(self) -> AuditStats: ...


class AuditCollector:
    """A Prometheus collector over one audit log's ``stats()``.

    Exports the families of :data:`AUDIT_METRICS`, labelled by ``stream``.

    Args:
        log: an :class:`~kvgov.audit.AuditLog` (anything with ``stats()``).
    """

    def __init__(self, log: _HasStats) -> None:
        self._log = log

    def collect(self) -> Iterator[Metric]:
        """Yield one family per metric from a single stats snapshot."""
        s = self._log.stats()
        gauges = {
            "kvgov_audit_in_memory_events": s.in_memory,
            "kvgov_audit_queue_depth": s.queue_depth,
            "kvgov_audit_spool_events": s.spooled,
            "kvgov_audit_spool_bytes": s.spool_bytes,
            "kvgov_audit_critical_spooled_events": len(s.critical_spooled),
            "kvgov_audit_database_failing": int(bool(s.database_error)),
            "kvgov_audit_unavailable": int(bool(s.unavailable)),
        }
        for name, value in gauges.items():
            g = GaugeMetricFamily(name, _GAUGES[name], labels=["stream"])
            g.add_metric([s.stream], value)
            yield g
        counters = {
            "kvgov_audit_spooled_events_total": s.spooled_total,
            "kvgov_audit_quarantined_records_total": s.quarantined,
            "kvgov_audit_damaged_spool_lines_total": s.damaged_lines,
        }
        for name, value in counters.items():
            # prometheus_client appends _total to a counter's samples itself
            c = CounterMetricFamily(name.removesuffix("_total"), _COUNTERS[name], labels=["stream"])
            c.add_metric([s.stream], value)
            yield c
