"""The retention sweeper thread of the governed cache."""

from __future__ import annotations

import math
import threading
from typing import Protocol

from kvgov import defaults
from kvgov.exceptions import InvalidArgument, PoolClosed

from .logs import get_logger

__all__ = ["Sweeper", "check_interval"]

_log = get_logger()


class _Sweepable(Protocol):
    def sweep(self) -> int: ...


class Sweeper(threading.Thread):
    """Daemon thread calling ``sweep`` every interval until stopped."""

    def __init__(self, cache: _Sweepable, interval: float) -> None:
        super().__init__(name="kvgov-retention-sweeper", daemon=True)
        self._cache = cache
        self._interval = interval
        self._stop_event = threading.Event()
        #: Sweeps that raised (the thread keeps going).
        self.failures = 0

    def run(self) -> None:
        while not self._stop_event.wait(self._interval):
            try:
                self._cache.sweep()
            except PoolClosed:
                return
            except Exception as exc:
                # The next interval retries; the error is logged (and an audit outage
                # is visible on the audit log itself). A dead sweeper would let every
                # deadline pass silently.
                self.failures += 1
                _log.warning("retention_sweep_failed", error=str(exc), failures=self.failures)

    def stop(self) -> None:
        self._stop_event.set()
        if self is not threading.current_thread():
            self.join(timeout=5)


def check_interval(interval: object) -> float:
    """The sweep interval: a finite number of seconds, at least ``MIN_SWEEP_INTERVAL``.

    Raises:
        InvalidArgument: it is not (NaN, infinity, zero or less would spin or stop
            the sweeper).
    """
    if (
        not isinstance(interval, int | float)
        or isinstance(interval, bool)
        or not math.isfinite(interval)
        or interval < defaults.MIN_SWEEP_INTERVAL
    ):
        raise InvalidArgument(
            "interval",
            interval,
            f"a finite number of seconds, at least {defaults.MIN_SWEEP_INTERVAL}",
        )
    return float(interval)
