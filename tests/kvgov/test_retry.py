"""Backoff: when a failed resource is tried again (tenacity's waits, a hand-moved clock)."""

from __future__ import annotations

import random

import pytest

from kvgov.retry import Backoff


class Clock:
    """Monotonic seconds moved by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture()
def no_jitter(monkeypatch: pytest.MonkeyPatch) -> None:
    """tenacity draws its jitter from random.uniform: pin it to the low end."""
    monkeypatch.setattr(random, "uniform", lambda a, b: a)


@pytest.fixture()
def full_jitter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pin tenacity's jitter to the high end."""
    monkeypatch.setattr(random, "uniform", lambda a, b: b)


def test_waits_double_from_initial_up_to_the_maximum(no_jitter: None) -> None:
    """Without jitter the n-th failure in a row waits initial * 2**(n-1), capped."""
    backoff = Backoff(1.0, 30.0, clock=Clock())
    assert [backoff.failed() for _ in range(7)] == [1, 2, 4, 8, 16, 30, 30]


def test_jitter_adds_at_most_half_the_wait(full_jitter: None) -> None:
    """With the most jitter each wait is 1.5 times the plain one, also at the cap."""
    backoff = Backoff(1.0, 30.0, clock=Clock())
    assert [backoff.failed() for _ in range(7)] == [1.5, 3, 6, 12, 24, 45, 45]


def test_random_jitter_stays_within_its_bounds() -> None:
    """Drawn for real, every wait lies between the plain wait and 1.5 times it."""
    for _ in range(50):
        backoff = Backoff(2.0, 10.0, clock=Clock())
        for plain in (2, 4, 8, 10, 10):
            assert plain <= backoff.failed() <= 1.5 * plain


def test_the_resource_is_skipped_until_its_retry_time(no_jitter: None) -> None:
    """ready() is False until the clock reaches the retry time, then True."""
    clock = Clock()
    backoff = Backoff(5.0, 60.0, clock=clock)
    assert backoff.ready() and backoff.failures == 0
    backoff.failed()
    assert backoff.retry_at == 105.0
    clock.now = 104.9
    assert not backoff.ready()
    clock.now = 105.0
    assert backoff.ready() and backoff.ready(now=105.0) and not backoff.ready(now=104.0)


def test_a_success_starts_the_count_over(no_jitter: None) -> None:
    """After succeeded() the next failure waits initial again."""
    backoff = Backoff(1.0, 30.0, clock=Clock())
    backoff.failed(), backoff.failed(), backoff.failed()
    backoff.succeeded()
    assert backoff.failures == 0 and backoff.ready()
    assert backoff.failed() == 1


def test_retry_now_allows_one_try_and_keeps_the_count(no_jitter: None) -> None:
    """A flush tries at once; if that fails too, the wait keeps growing."""
    backoff = Backoff(1.0, 30.0, clock=Clock())
    backoff.failed(), backoff.failed()
    backoff.retry_now()
    assert backoff.ready()
    assert backoff.failed() == 4


def test_zero_initial_means_always_ready() -> None:
    """retry_seconds=0 (tests, a spool-only setup) never skips the resource."""
    backoff = Backoff(0.0, 30.0, clock=Clock())
    assert backoff.failed() == 0 and backoff.ready()


def test_a_maximum_below_initial_is_raised_to_it(no_jitter: None) -> None:
    """retry_seconds=3600 with a 30 s cap waits 3600 s, never less than asked."""
    backoff = Backoff(3600.0, 30.0, clock=Clock())
    assert backoff.failed() == 3600 and backoff.failed() == 3600


@pytest.mark.parametrize("initial", [-1.0, float("inf"), float("nan")])
def test_a_negative_or_infinite_initial_wait_is_refused(initial: float) -> None:
    """A wait that is not a finite number of seconds >= 0 raises ValueError."""
    with pytest.raises(ValueError, match="initial"):
        Backoff(initial, 30.0)
