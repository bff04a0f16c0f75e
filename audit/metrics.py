"""Prometheus metrics of an :class:`~kvgov.audit.AuditLog`: spool, quarantine, memory.

Register it next to the cache's collector::

    from prometheus_client import REGISTRY
    from kvgov.audit.metrics import AuditCollector

    REGISTRY.register(AuditCollector(cache.audit))

Each scrape reads one :meth:`AuditLog.stats` snapshot. Alert on
``kvgov_audit_quarantined_total`` increasing (the database refused records: the
trail in the database has a hole until ``kvgov audit quarantine replay``), on
``kvgov_audit_critical_spooled > 0`` for long (erasure evidence only on this host),
and on ``kvgov_audit_unavailable == 1`` (nothing can be audited: operations refuse).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from kvgov.audit.durability import AuditStats

__all__ = ["AuditCollector"]


class _HasStats(Protocol):
    def stats(self) -> AuditStats: ...


class AuditCollector:
    """A Prometheus collector over one audit log's ``stats()``.

    Metric names (label ``stream``): ``kvgov_audit_events_in_memory`` (recorded, not
    yet stored or spooled: what ``kill -9`` would lose), ``kvgov_audit_events_spooled``
    (waiting in the spool), ``kvgov_audit_events_spooled_total``,
    ``kvgov_audit_critical_spooled`` (critical events whose evidence is only
    spooled), ``kvgov_audit_quarantined_total``, ``kvgov_audit_damaged_lines_total``,
    ``kvgov_audit_database_failing`` and ``kvgov_audit_unavailable`` (0 or 1).

    Args:
        log: an :class:`~kvgov.audit.AuditLog` (anything with ``stats()``).
    """

    def __init__(self, log: _HasStats) -> None:
        self._log = log

    def collect(self) -> Iterator[Metric]:
        """Yield one family per metric from a single stats snapshot."""
        s = self._log.stats()
        gauges = {
            "events_in_memory": ("events recorded but neither stored nor spooled", s.in_memory),
            "events_spooled": ("events in the spool waiting for the database", s.spooled),
            "critical_spooled": (
                "critical events whose evidence is only in the spool",
                len(s.critical_spooled),
            ),
            "database_failing": ("1 while the audit database fails", int(bool(s.database_error))),
            "unavailable": (
                "1 while neither database nor spool can be written",
                int(bool(s.unavailable)),
            ),
        }
        for name, (doc, value) in gauges.items():
            g = GaugeMetricFamily(f"kvgov_audit_{name}", doc, labels=["stream"])
            g.add_metric([s.stream], value)
            yield g
        counters = {
            "events_spooled": ("events written to the spool", s.spooled_total),
            "quarantined": ("records the database refused, kept in the quarantine", s.quarantined),
            "damaged_lines": (
                "spool lines that did not parse, moved to the quarantine",
                s.damaged_lines,
            ),
        }
        for name, (doc, value) in counters.items():
            c = CounterMetricFamily(f"kvgov_audit_{name}", doc, labels=["stream"])
            c.add_metric([s.stream], value)
            yield c
