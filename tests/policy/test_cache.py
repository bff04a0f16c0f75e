"""The decision cache: hits and misses, LRU bound, revision in the key, errors not cached."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from kvgov.policy.cache import CachedEngine
from kvgov.policy.embedded import EmbeddedEngine
from kvgov.policy.engine import Decision, failed_decision, make_decision

PATH = "kvgov/retention/decision"


class CountingEngine:
    """An engine answering {"n": k} for input {"n": k}, counting calls; can fail."""

    name = "counting"

    def __init__(self) -> None:
        self.calls = 0
        self.fail = False
        self.bundle_revision = "r1"

    def evaluate(self, path: str, input: Mapping[str, Any]) -> Decision:
        self.calls += 1
        if self.fail:
            return failed_decision(
                path, "down", bundle_revision=self.bundle_revision, engine=self.name, seconds=0.0
            )
        return make_decision(
            path, dict(input), bundle_revision=self.bundle_revision, engine=self.name, seconds=0.0
        )

    def close(self) -> None:
        pass


def test_hit_returns_the_original_decision_id() -> None:
    """A hit is marked cached and keeps the decision_id of the evaluation it came from."""
    inner = CountingEngine()
    c = CachedEngine(inner)
    first = c.evaluate(PATH, {"n": 1})
    second = c.evaluate(PATH, {"n": 1})
    assert not first.cached and second.cached
    assert second.decision_id == first.decision_id
    assert inner.calls == 1
    s = c.stats()
    assert (s.hits, s.misses, s.size) == (1, 1, 1)


def read_n(d: Decision) -> tuple[Any, bool]:
    """A view of a decision: its n and whether it was cached (a new tuple each call)."""
    return (d.result["n"] if d.result else None, d.cached)


def test_view_is_kept_with_the_cached_decision() -> None:
    """evaluate_as reads a miss afresh, then keeps the view of the stored decision."""
    inner = CountingEngine()
    c = CachedEngine(inner)
    miss = c.evaluate_as(PATH, {"n": 1}, read_n)
    first_hit = c.evaluate_as(PATH, {"n": 1}, read_n)
    second_hit = c.evaluate_as(PATH, {"n": 1}, read_n)
    assert miss == (1, False) and first_hit == (1, True)
    assert second_hit is first_hit
    assert inner.calls == 1 and c.stats().hits == 2


class InputBuilder:
    """Builds the input ``{"n": n}`` for CachedEngine.answer, counting the builds."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.builds = 0

    def __call__(self) -> dict[str, int]:
        self.builds += 1
        return {"n": self.n}


def test_answer_builds_the_input_only_on_a_miss_and_counts_each_call_once() -> None:
    """answer() calls build() on a miss only; a hit returns the kept value (or takes
    another view afresh) without building; each call counts one hit or one miss."""
    inner = CountingEngine()
    c = CachedEngine(inner)
    build = InputBuilder(1)
    miss = c.answer(PATH, "k", read_n, build)
    hit = c.answer(PATH, "k", read_n, build)
    assert miss == (1, False) and hit == (1, True)
    assert c.answer(PATH, "k", read_n, build) is hit
    assert c.answer(PATH, "k", lambda d: d.cached, build) is True  # another view, on the hit
    assert build.builds == 1 and inner.calls == 1
    assert c.stats().hits == 3 and c.stats().misses == 1
    c.answer("kvgov/offload/decision", "k", read_n, build)  # another rule: a miss
    assert build.builds == 2 and c.stats().misses == 2


def test_answer_misses_after_a_revision_change() -> None:
    """A value kept under the old bundle revision is not returned under the new one."""
    inner = CountingEngine()
    c = CachedEngine(inner)
    c.answer(PATH, "k", read_n, lambda: {"n": 1})
    kept = c.answer(PATH, "k", read_n, lambda: {"n": 1})
    inner.bundle_revision = "r2"
    fresh = c.answer(PATH, "k", read_n, lambda: {"n": 1})
    assert kept == (1, True) and fresh == (1, False) and inner.calls == 2


def test_answer_without_a_key_builds_once_per_call() -> None:
    """With no key the input is built to key it by JSON, and that same input is
    evaluated on the miss: one build per call, one evaluation in all."""
    inner = CountingEngine()
    c = CachedEngine(inner)
    build = InputBuilder(2)
    assert c.answer(PATH, None, read_n, build) == (2, False)
    assert c.answer(PATH, None, read_n, build) == (2, True)
    assert build.builds == 2 and inner.calls == 1


def test_another_view_is_taken_afresh() -> None:
    """A different view function is not answered with another view's kept value."""
    c = CachedEngine(CountingEngine())
    c.evaluate(PATH, {"n": 1})
    assert c.evaluate_as(PATH, {"n": 1}, read_n) == (1, True)
    assert (
        c.evaluate_as(PATH, {"n": 1}, lambda d: d.decision_id)
        == c.evaluate(PATH, {"n": 1}).decision_id
    )


def test_view_of_a_failed_decision_is_not_kept() -> None:
    """A failed decision is viewed but not cached, so the next call asks the engine."""
    inner = CountingEngine()
    inner.fail = True
    c = CachedEngine(inner)
    assert c.evaluate_as(PATH, {"n": 1}, lambda d: d.error) == "down"
    assert c.evaluate_as(PATH, {"n": 1}, lambda d: d.error) == "down"
    assert inner.calls == 2 and c.stats().size == 0


def test_key_order_does_not_matter() -> None:
    """Inputs equal as JSON objects share an entry, whatever their key order."""
    c = CachedEngine(CountingEngine())
    c.evaluate(PATH, {"a": 1, "b": 2})
    assert c.evaluate(PATH, {"b": 2, "a": 1}).cached


def test_true_and_one_are_different_inputs() -> None:
    """JSON keys keep true and 1 apart (Python's True == 1 must not alias them)."""
    c = CachedEngine(CountingEngine())
    c.evaluate(PATH, {"x": 1})
    assert not c.evaluate(PATH, {"x": True}).cached


def test_path_is_part_of_the_key() -> None:
    """The same input on another rule misses."""
    c = CachedEngine(CountingEngine())
    c.evaluate(PATH, {"n": 1})
    assert not c.evaluate("kvgov/offload/decision", {"n": 1}).cached


def test_lru_bound_evicts_least_recently_used() -> None:
    """With maxsize 2, the least recently used of three entries is evicted."""
    inner = CountingEngine()
    c = CachedEngine(inner, maxsize=2)
    c.evaluate(PATH, {"n": 1})
    c.evaluate(PATH, {"n": 2})
    c.evaluate(PATH, {"n": 1})  # 1 is now most recent
    c.evaluate(PATH, {"n": 3})  # evicts 2
    assert c.stats().size == 2
    assert c.evaluate(PATH, {"n": 1}).cached
    assert not c.evaluate(PATH, {"n": 2}).cached


def test_zero_maxsize_disables_caching() -> None:
    """maxsize 0 sends every call to the engine."""
    inner = CountingEngine()
    c = CachedEngine(inner, maxsize=0)
    c.evaluate(PATH, {"n": 1})
    assert not c.evaluate(PATH, {"n": 1}).cached and inner.calls == 2


def test_negative_maxsize_is_refused() -> None:
    """A negative bound raises ValueError."""
    with pytest.raises(ValueError):
        CachedEngine(CountingEngine(), maxsize=-1)


def test_errors_are_not_cached() -> None:
    """A fail-closed decision is not stored: the next call asks the engine again."""
    inner = CountingEngine()
    c = CachedEngine(inner)
    inner.fail = True
    assert c.evaluate(PATH, {"n": 1}).error == "down"
    inner.fail = False
    d = c.evaluate(PATH, {"n": 1})
    assert d.error is None and not d.cached and inner.calls == 2


def test_revision_change_misses() -> None:
    """A new bundle revision misses instead of serving the old decision."""
    inner = CountingEngine()
    c = CachedEngine(inner)
    c.evaluate(PATH, {"n": 1})
    inner.bundle_revision = "r2"
    d = c.evaluate(PATH, {"n": 1})
    assert not d.cached and d.bundle_revision == "r2"


def test_reload_misses(bundle_copy: Path, scope: dict[str, Any]) -> None:
    """After an embedded reload the cache misses and serves the new policy."""
    e = EmbeddedEngine(bundle_copy, run_tests=False)
    c = CachedEngine(e)
    assert c.evaluate(PATH, {"scope": scope}).result["ttl_seconds"] == 3600
    e.reload(policy_data={"kvgov": {"config": {"retention_seconds": {"internal": 1}}}})
    d = c.evaluate(PATH, {"scope": scope})
    assert not d.cached and d.result["ttl_seconds"] == 1


def test_caller_key_is_used() -> None:
    """A caller-supplied key replaces the canonical JSON key."""
    inner = CountingEngine()
    c = CachedEngine(inner)
    c.evaluate(PATH, {"n": 1}, key=("k",))
    assert c.evaluate(PATH, {"n": 1}, key=("k",)).cached
    assert not c.evaluate(PATH, {"n": 1}).cached


def test_non_json_input_is_passed_through_uncached() -> None:
    """An input that cannot be keyed goes to the engine and counts as a miss."""
    inner = CountingEngine()
    c = CachedEngine(inner)
    c.evaluate(PATH, {"n": object()})
    c.evaluate(PATH, {"n": object()})
    assert inner.calls == 2 and c.stats().size == 0 and c.stats().misses == 2


def test_clear_and_close() -> None:
    """clear drops entries, keeping counters; close clears and closes the engine."""
    c = CachedEngine(CountingEngine())
    c.evaluate(PATH, {"n": 1})
    c.clear()
    assert c.stats().size == 0 and c.stats().misses == 1
    c.close()


class TimedCountingEngine(CountingEngine):
    """A CountingEngine whose revision is trusted only for a while (as OPA server's)."""

    revision_ttl = 10.0

    def now(self) -> float:
        return 0.0


@pytest.mark.parametrize(
    ("make", "revision", "kept"),
    [
        (lambda e: CachedEngine(e), "r1", "r1"),
        (lambda e: CachedEngine(e, maxsize=0), "r1", None),  # caching off
        (lambda e: CachedEngine(e), "", None),
        (lambda e: CachedEngine(e), "unknown", None),
    ],
)
def test_kept_revision_is_the_one_decisions_are_kept_under(
    make: Any, revision: str, kept: str | None
) -> None:
    """What a caller may keep derived answers under: none where the cache keeps none."""
    from kvgov.policy.engine import UNKNOWN_REVISION

    inner = CountingEngine()
    inner.bundle_revision = UNKNOWN_REVISION if revision == "unknown" else revision
    assert make(inner).kept_revision() == kept


def test_no_kept_revision_where_decisions_expire() -> None:
    """An engine whose revision is trusted only for a while: nothing is kept past it."""
    timed = CachedEngine(TimedCountingEngine())
    assert timed.evaluate(PATH, {"n": 1}) is not None
    assert timed.kept_revision() is None
