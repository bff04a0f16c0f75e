"""A clock tests move by hand."""

from __future__ import annotations

#: Where a FakeClock starts (a plausible Unix time).
START = 1_700_000_000.0


class FakeClock:
    """A clock tests move by hand: deadlines and retention are exact, nothing sleeps."""

    def __init__(self, start: float = START) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
