"""Latency histograms with fixed buckets, for the Prometheus collectors.

A :class:`LatencyHistogram` counts observations per bucket under a lock (about
0.3 us an observation); :meth:`LatencyHistogram.snapshot` gives the cumulative
counts Prometheus wants. The decision cache keeps one per rule path for the
engine's evaluations (:meth:`kvgov.policy.cache.CachedEngine.latency`), the
governed cache one per admission outcome; ``kvgov.govern.metrics`` exports them.
"""

from __future__ import annotations

import threading
from bisect import bisect_left
from dataclasses import dataclass
from itertools import pairwise

__all__ = ["LATENCY_BUCKETS", "LatencyHistogram", "LatencySnapshot"]

#: Upper bounds (seconds, inclusive) of the buckets: 10 us to 2.5 s. An uncached
#: decision takes 18-450 us, a cached one about 2 us, an admission tens of us to ms.
LATENCY_BUCKETS: tuple[float, ...] = (
    0.00001,
    0.000025,
    0.00005,
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
)


@dataclass(frozen=True, slots=True)
class LatencySnapshot:
    """A histogram at one moment.

    Attributes:
        bounds: the buckets' upper bounds in seconds (``+Inf`` is implied).
        cumulative: observations at or below each bound, then the total (for ``+Inf``).
        sum: the sum of the observations, in seconds.
    """

    bounds: tuple[float, ...]
    cumulative: tuple[int, ...]
    sum: float

    @property
    def count(self) -> int:
        """How many observations."""
        return self.cumulative[-1]


class LatencyHistogram:
    """Durations counted into fixed buckets; thread-safe.

    Args:
        bounds: increasing upper bounds in seconds.

    Raises:
        ValueError: the bounds are empty or not increasing.
    """

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS) -> None:
        if not bounds or any(b >= c for b, c in pairwise(bounds)):
            raise ValueError(f"bucket bounds must be increasing, got {bounds!r}")
        self._bounds = bounds
        self._counts = [0] * (len(bounds) + 1)
        self._sum = 0.0
        self._lock = threading.Lock()

    def observe(self, seconds: float) -> None:
        """Count one duration (in the first bucket whose bound is at or above it)."""
        i = bisect_left(self._bounds, seconds)
        with self._lock:
            self._counts[i] += 1
            self._sum += seconds

    def snapshot(self) -> LatencySnapshot:
        """The cumulative counts and the sum, read together.

        Returns:
            The snapshot.
        """
        with self._lock:
            counts = list(self._counts)
            total = self._sum
        cumulative: list[int] = []
        running = 0
        for c in counts:
            running += c
            cumulative.append(running)
        return LatencySnapshot(self._bounds, tuple(cumulative), total)
