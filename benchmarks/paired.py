"""Statistics of paired measurements, shared by the side-by-side benchmarks.

A *pair* is one measurement of a baseline and one of the contender, taken back
to back. On a shared machine whose speed drifts, a slow spell slows both halves
of a pair and cancels in their ratio; it does not cancel between medians taken
over different moments. So ratios are taken pair by pair, then summarized.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["RatioStats", "ratio_stats"]


@dataclass(frozen=True, slots=True)
class RatioStats:
    """The per-pair ratios contender / baseline: their median and quartiles."""

    median: float
    p25: float
    p75: float


def ratio_stats(pairs: Iterable[tuple[float, float]]) -> RatioStats:
    """Summarize ``(baseline, contender)`` pairs by their ratios ``contender / baseline``.

    Args:
        pairs: at least one pair of positive measurements.

    Returns:
        The median, p25 and p75 of the per-pair ratios (all three the one ratio when
        there is a single pair).
    """
    ratios = sorted(c / b for b, c in pairs)
    q = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return RatioStats(statistics.median(ratios), q[0], q[2])
