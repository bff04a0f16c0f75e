"""The load both audit fault suites put on a trail while they break what is under it."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field

from kvgov.audit import AuditEvent, AuditLog, EventType
from kvgov.exceptions import AuditUnavailable


def seq(event_id: str) -> int:
    """An event id's sequence number in its stream (``stream:seq``)."""
    return int(event_id.rsplit(":", 1)[1])


@dataclass
class Load:
    """Records events on a thread: ordinary ones, and an erasure (critical) every 25th.

    ``bound`` is the longest ``stop`` waits for the thread: a caller that stalls on the
    trail longer fails the case."""

    log: AuditLog
    bound: float = 10.0
    ordinary: list[str] = field(default_factory=list)
    critical: list[str] = field(default_factory=list)
    refused: int = 0
    slowest_critical: float = 0.0
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(self.bound)
        assert not self._thread.is_alive(), "a caller stalled on the audit trail"

    def _run(self) -> None:
        i = 0
        while not self._stop.is_set():
            i += 1
            if i % 25 == 0:
                t0 = time.monotonic()
                try:
                    self.critical.append(
                        self.log.record(AuditEvent(EventType.ERASURE, tenant=f"t{i}"))
                    )
                except AuditUnavailable:
                    self.refused += 1  # the cache refuses the act; nothing is acknowledged
                self.slowest_critical = max(self.slowest_critical, time.monotonic() - t0)
            else:
                self.ordinary.append(
                    self.log.record(AuditEvent(EventType.ADMISSION, tenant="acme"))
                )
            time.sleep(0.001)
