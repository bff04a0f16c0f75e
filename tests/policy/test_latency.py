"""LatencyHistogram: bucket placement (upper bounds inclusive), cumulative counts, the sum."""

from __future__ import annotations

import threading

import pytest

from kvgov.policy.latency import LATENCY_BUCKETS, LatencyHistogram


def test_observations_land_in_the_first_bucket_at_or_above_them() -> None:
    """A value equal to a bound counts in that bound's bucket; above the last, only in +Inf."""
    h = LatencyHistogram((0.001, 0.01, 0.1))
    for v in (0.0005, 0.001, 0.002, 0.01, 0.5):
        h.observe(v)
    snap = h.snapshot()
    assert snap.bounds == (0.001, 0.01, 0.1)
    assert snap.cumulative == (2, 4, 4, 5)
    assert snap.count == 5
    assert snap.sum == pytest.approx(0.5135)


def test_concurrent_observations_are_all_counted() -> None:
    """Four threads observing at once lose no observation."""
    h = LatencyHistogram()
    threads = [
        threading.Thread(target=lambda: [h.observe(1e-4) for _ in range(5_000)]) for _ in range(4)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert h.snapshot().count == 20_000
    assert h.snapshot().cumulative[LATENCY_BUCKETS.index(0.0001)] == 20_000


@pytest.mark.parametrize("bounds", [(), (0.1, 0.1), (0.2, 0.1)])
def test_bounds_must_increase(bounds: tuple[float, ...]) -> None:
    """Empty or non-increasing bounds are refused."""
    with pytest.raises(ValueError, match="increasing"):
        LatencyHistogram(bounds)
