"""The retention sweeper thread of the governed cache."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from kvgov.exceptions import PoolClosed

if TYPE_CHECKING:
    from .cache import GovernedKVCache

__all__ = ["Sweeper"]


class Sweeper(threading.Thread):
    """Daemon thread calling ``sweep`` every interval until stopped."""

    def __init__(self, cache: GovernedKVCache, interval: float) -> None:
        super().__init__(name="kvgov-retention-sweeper", daemon=True)
        self._cache = cache
        self._interval = interval
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.wait(self._interval):
            try:
                self._cache.sweep()
            except PoolClosed:
                return

    def stop(self) -> None:
        self._stop_event.set()
        if self is not threading.current_thread():
            self.join(timeout=5)
