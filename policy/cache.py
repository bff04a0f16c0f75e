"""The decision cache: a bounded LRU of decisions in front of any engine.

Key: ``(rule path, input key, bundle revision)``. The input key is either

* the **canonical JSON** of the input (RFC 8785, :mod:`kvgov.canonical`; computed
  here, about 5 µs for a scope-shaped input), or
* a **caller-supplied key** (``evaluate(path, input, key=...)``): any hashable value
  that determines the input exactly. :class:`~kvgov.policy.client.PolicyClient` passes
  the tuple of a scope's nine field values (each checked to be ``str`` or ``None``,
  in a fixed field order) plus the other input fields, which costs under 1 µs;
  that is how a cached decision through the client stays within about 1.5 µs on a
  quiet machine (benchmarks/bench_policy.py). A caller
  key must never be shared by two different inputs of the same rule: the key
  is trusted, not checked against the input.

Validity: a cached decision is served only while the engine's revision is the one
it was stored under, so the cache is exactly as sound as the revision covers what
a decision reads. The in-process engines' revision is a hash of every module and
of the merged data (:mod:`kvgov.policy.bundle`): a reload of either misses. The
OPA server engine's is a digest of the server's policies and data, re-read every
``revision_ttl`` seconds (:mod:`kvgov.policy.opa_server`); since a decision there
may be newer than the revision it is tagged with, such an engine (a
:class:`~kvgov.policy.engine.TimedRevision`) also has each entry expire
``revision_ttl`` after the lookup that stored it, on the engine's clock. Nothing
is stored or served under an empty revision or
:data:`~kvgov.policy.engine.UNKNOWN_REVISION`: every such call asks the engine.
Only decisions without an error are cached: a fail-closed decision (engine error,
timeout, unreadable answer) is never stored, so the next call asks the engine
again. Undefined rules (a deny from the policy itself) are cached like any answer.

A hit returns the stored decision: it carries the **original** ``decision_id``
(so audit can link a cached decision to the evaluation that made it) and
``cached=True``.

Views: :meth:`CachedEngine.evaluate_as` returns ``view(decision)`` instead, and
keeps the value with the cached decision, so a hit returns the value the view
gave the first time instead of reading and checking the decision again.
:class:`~kvgov.policy.client.PolicyClient` reads every typed answer this way, through
:meth:`CachedEngine.answer`, which builds the policy input only on a miss: a
hit is one lookup, with no input built and no memo of typed answers beside it.
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from kvgov.defaults import DECISION_CACHE_SIZE
from kvgov.policy.bundle import canonical_json
from kvgov.policy.engine import UNKNOWN_REVISION, Decision, PolicyEngine, TimedRevision
from kvgov.policy.latency import LatencyHistogram, LatencySnapshot

__all__ = ["CacheStats", "CachedEngine"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class CacheStats:
    """Counters of one decision cache.

    Attributes:
        hits: lookups served from the cache.
        misses: lookups that went to the engine.
        size: decisions held now.
        maxsize: the LRU bound.
    """

    hits: int
    misses: int
    size: int
    maxsize: int


class _Entry:
    """One cached decision and the last view taken of it.

    Why a mutable entry rather than the bare decision: a view is computed on a
    hit, after the entry was stored, and kept beside it without a second lookup.
    """

    __slots__ = ("decision", "expires", "view")

    def __init__(self, decision: Decision, expires: float) -> None:
        # The stored decision (cached=True); written once, at insert.
        self.decision = decision
        # When it stops being served, on a TimedRevision engine's clock (inf: never).
        self.expires = expires
        # (view function, its value for decision); replaced whole by one assignment,
        # so a reader never pairs a function with another function's value.
        self.view: tuple[Callable[[Decision], Any], Any] | None = None


class CachedEngine:
    """A :class:`~kvgov.policy.engine.PolicyEngine` that caches another one's decisions.

    Thread-safe: one lock guards the LRU (held for the lookup and the insert, not
    while the engine evaluates; two threads missing the same key both evaluate,
    and the later insert wins).

    Args:
        engine: the engine to cache; when it is a
            :class:`~kvgov.policy.engine.TimedRevision` (the OPA server engine), each
            decision is kept at most its ``revision_ttl`` seconds.
        maxsize: decisions kept (least recently used evicted first); 0 disables
            caching (every call goes to the engine and counts as a miss).

    Raises:
        ValueError: ``maxsize`` is negative.
    """

    def __init__(self, engine: PolicyEngine, maxsize: int = DECISION_CACHE_SIZE) -> None:
        if maxsize < 0:
            raise ValueError(f"maxsize must be >= 0, got {maxsize}")
        self._engine = engine
        self._maxsize = maxsize
        # An engine whose revision is trusted for a while: entries expire on its clock.
        self._timed: TimedRevision | None = engine if isinstance(engine, TimedRevision) else None
        # Kept rather than cachetools.LRUCache: its hit is Python code (__getitem__ and a
        # move in a second OrderedDict), 0.68 us under this lock against 0.40 us for
        # OrderedDict.get + move_to_end, both C; a cached decision has 2 us in all
        # (benchmarks/bench_policy.py). Nothing else of cachetools is needed here (the
        # lock, the revision in the key and the kept views are this class's own).
        self._lru: OrderedDict[tuple[str, Hashable, str], _Entry] = OrderedDict()
        self._lock = threading.Lock()
        self._hits = 0
        self._misses = 0
        #: How long the engine took per rule path (misses only: a hit is not evaluated).
        self._latency: dict[str, LatencyHistogram] = {}
        self.name: str = engine.name

    @property
    def engine(self) -> PolicyEngine:
        """The engine behind the cache."""
        return self._engine

    @property
    def bundle_revision(self) -> str:
        """The engine's bundle revision."""
        return self._engine.bundle_revision

    def kept_revision(self) -> str | None:
        """The revision whose decisions this cache keeps until the revision changes, or
        None when it keeps none that long (caching off, an unknown revision, or an engine
        whose decisions expire: :class:`~kvgov.policy.engine.TimedRevision`).

        What a caller may keep an answer derived from cached decisions under: it is as
        fresh as the decisions themselves while the revision is this one.
        """
        revision = self._engine.bundle_revision
        if self._timed is not None or not self._maxsize or not revision:
            return None
        return None if revision == UNKNOWN_REVISION else revision

    def evaluate(
        self, path: str, input: Mapping[str, Any], *, key: Hashable | None = None
    ) -> Decision:
        """Return the cached decision for this rule, input and revision, or evaluate.

        Args:
            path: the rule (use one spelling per rule: the path is part of the key).
            input: the policy input.
            key: a hashable value determining ``input`` exactly (see the module
                docstring); None to key by canonical JSON of ``input``.

        Returns:
            The decision; ``cached=True`` when served from the cache.
        """
        return self._lookup(path, key, lambda: input)[1]

    def evaluate_as(
        self,
        path: str,
        input: Mapping[str, Any],
        view: Callable[[Decision], T],
        *,
        key: Hashable | None = None,
    ) -> T:
        """Return ``view(decision)`` for the decision :meth:`evaluate` would return.

        The value is kept with the cached decision: later hits return that same
        value without calling ``view`` again (until another view is taken of the
        entry). So ``view`` must be a pure function of the decision, and the same
        object at every call (a module-level function, not a bound method or a
        lambda made per call): the kept value is matched by the function's
        identity.

        Args:
            path: the rule.
            input: the policy input.
            view: reads the decision, e.g. into a typed answer.
            key: as for :meth:`evaluate`.

        Returns:
            The view's value.
        """
        return self.answer(path, key, view, lambda: input)

    def answer(
        self,
        path: str,
        key: Hashable | None,
        view: Callable[[Decision], T],
        build: Callable[[], Mapping[str, Any]],
    ) -> T:
        """:meth:`evaluate_as` with the input built only when it is needed.

        ``build()`` makes the policy input; it is called on a miss (and first,
        to key by canonical JSON, when ``key`` is None), never on a hit, so a
        caller with a key pays nothing for an input the cache already answered.

        Args:
            path: the rule.
            key: as for :meth:`evaluate`.
            view: as for :meth:`evaluate_as`.
            build: returns the policy input.

        Returns:
            The view's value.
        """
        entry, decision = self._lookup(path, key, build)
        if entry is None:
            return view(decision)
        kept = entry.view
        if kept is not None and kept[0] is view:
            value: T = kept[1]
            return value
        value = view(decision)
        entry.view = (view, value)
        return value

    def _lookup(
        self, path: str, key: Hashable | None, build: Callable[[], Mapping[str, Any]]
    ) -> tuple[_Entry | None, Decision]:
        """The hit entry and its decision, or (None, the engine's decision) on a miss."""
        if key is None:
            input = build()
            try:
                key = canonical_json(input)
            except (TypeError, ValueError):
                # Not JSON: the engine will fail closed on it; nothing to cache.
                with self._lock:
                    self._misses += 1
                return None, self._evaluate(path, input)
            build = lambda: input  # noqa: E731 - built once, reused on the miss below
        revision = self._engine.bundle_revision
        if not revision or revision == UNKNOWN_REVISION:
            # Nothing tells what the decision is computed from: never cache it.
            with self._lock:
                self._misses += 1
            return None, self._evaluate(path, build())
        timed = self._timed
        now = timed.now() if timed is not None else 0.0
        full = (path, key, revision)
        lru = self._lru
        with self._lock:
            hit = lru.get(full)
            if hit is not None:
                if timed is None or now < hit.expires:
                    lru.move_to_end(full)
                    self._hits += 1
                    return hit, hit.decision
                del lru[full]
            self._misses += 1
        decision = self._evaluate(path, build())
        decided = decision.bundle_revision
        if decision.error is None and self._maxsize > 0 and decided and decided != UNKNOWN_REVISION:
            expires = now + timed.revision_ttl if timed is not None else math.inf
            entry = _Entry(dataclasses.replace(decision, cached=True), expires)
            # Key by the revision that actually decided (it may have moved on).
            full = (path, key, decided)
            with self._lock:
                lru[full] = entry
                lru.move_to_end(full)
                while len(lru) > self._maxsize:
                    lru.popitem(last=False)
        return None, decision

    def _evaluate(self, path: str, input: Mapping[str, Any]) -> Decision:
        """Ask the engine, timing it into the rule's latency histogram."""
        start = time.perf_counter()
        decision = self._engine.evaluate(path, input)
        elapsed = time.perf_counter() - start
        histogram = self._latency.get(path)
        if histogram is None:
            with self._lock:
                histogram = self._latency.setdefault(path, LatencyHistogram())
        histogram.observe(elapsed)
        return decision

    def latency(self) -> dict[str, LatencySnapshot]:
        """How long the engine's evaluations took, per rule path (cache hits excluded).

        Returns:
            A snapshot per rule path evaluated so far.
        """
        with self._lock:
            histograms = dict(self._latency)
        return {path: h.snapshot() for path, h in sorted(histograms.items())}

    def stats(self) -> CacheStats:
        """Return the hit and miss counters and the size.

        Returns:
            A snapshot.
        """
        with self._lock:
            return CacheStats(
                hits=self._hits, misses=self._misses, size=len(self._lru), maxsize=self._maxsize
            )

    def clear(self) -> None:
        """Drop every cached decision (counters are kept)."""
        with self._lock:
            self._lru.clear()

    def close(self) -> None:
        """Drop the cache and close the engine."""
        self.clear()
        self._engine.close()
