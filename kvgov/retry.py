"""When a failed resource is tried again: exponential backoff with jitter, from tenacity.

The audit writer (a database that failed) and the offload store (a tier that failed)
do not retry in a loop: while the resource is down they carry on without it (events
go to the spool, blocks to the other tiers) and skip it until its retry time. So
tenacity's ``Retrying`` loop, which sleeps between attempts, does not fit; its wait
strategies do, and :class:`Backoff` asks them for each wait::

    wait(n) = min(initial * 2**(n-1), maximum)          # tenacity.wait_exponential
            + uniform(0, min(initial * 2**(n-1), maximum) / 2)   # wait_random_exponential

after the n-th failure in a row: at least ``initial`` seconds (a fixed floor, as the
fixed interval had), doubling up to ``maximum``, plus up to half as much again at
random, so that a fleet of workers that lost the database together does not come
back to it in step. A success starts the count over.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import tenacity

__all__ = ["Backoff"]


class Backoff:
    """The retry time of one failed resource (see the module docstring).

    Not locked: each user changes it from one thread, or under its own lock.

    Args:
        initial: seconds before the first retry (at least); must be >= 0.
        maximum: the largest wait before jitter; raised to ``initial`` if smaller.
        clock: monotonic seconds.

    Raises:
        ValueError: ``initial`` is negative or not finite.
    """

    __slots__ = ("_clock", "_retry_at", "_state", "_wait", "failures", "initial", "maximum")

    def __init__(
        self, initial: float, maximum: float, *, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if not 0 <= initial < float("inf"):
            raise ValueError(f"initial must be a finite number of seconds >= 0, got {initial}")
        self.initial = float(initial)
        self.maximum = max(float(maximum), self.initial)
        self._clock = clock
        self._wait = tenacity.wait_exponential(
            multiplier=self.initial, max=self.maximum
        ) + tenacity.wait_random_exponential(multiplier=self.initial / 2, max=self.maximum / 2)
        # tenacity's strategies read a call state's attempt_number; one is reused
        self._state = tenacity.RetryCallState(tenacity.Retrying(), None, (), {})
        #: Failures in a row (0 while the resource is healthy).
        self.failures = 0
        self._retry_at = 0.0

    @property
    def retry_at(self) -> float:
        """The clock reading from which the resource may be tried (0 when healthy)."""
        return self._retry_at

    def ready(self, now: float | None = None) -> bool:
        """Whether the resource may be tried now.

        Args:
            now: the clock reading; None reads the clock.
        """
        return (self._clock() if now is None else now) >= self._retry_at

    def failed(self) -> float:
        """Count a failure and set the retry time; returns the wait chosen, in seconds."""
        self.failures += 1
        self._state.attempt_number = self.failures
        wait = float(self._wait(self._state))
        self._retry_at = self._clock() + wait
        return wait

    def succeeded(self) -> None:
        """The resource answered: the next failure waits ``initial`` again."""
        self.failures = 0
        self._retry_at = 0.0

    def retry_now(self) -> None:
        """Allow one try at once (a flush, a close); a failure still waits longer than the last."""
        self._retry_at = 0.0
