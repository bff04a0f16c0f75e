"""What a policy change would change: outcomes of decisions, compared, counted, exemplified.

Used by ``kvgov policy replay`` (recorded decisions against a candidate bundle,
:mod:`kvgov.policy.replay`) and ``kvgov policy diff`` (two bundles on generated
inputs, :mod:`kvgov.policy.diff`). Both compare the **outcome** of a decision,
what the governor acts on, read through :class:`~kvgov.policy.client.PolicyClient`'s
fail-closed readers (a wrong-shaped answer is a deny, as in production), never
the wording of a reason:

=========================  ==========================  ============================
rule                       outcome compared            change kinds
=========================  ==========================  ============================
kvgov/admission/decision   allow, cache, priority      admission_denied,
                                                       admission_allowed,
                                                       cache_changed, priority_changed
kvgov/sharing/decision     allow                       sharing_lost, sharing_gained
kvgov/retention/decision   ttl_seconds                 retention_changed
kvgov/offload/decision     allow                       offload_lost, offload_gained
kvgov/sharing/groups       publish, read               groups_changed
=========================  ==========================  ============================

Cache and priority changes are reported only for requests admitted both before
and after (a flip says the rest). A field the record lacks is not compared.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from kvgov.policy.client import (
    ADMISSION_PATH,
    GROUPS_PATH,
    OFFLOAD_PATH,
    RETENTION_PATH,
    SHARING_PATH,
    PolicyClient,
)

__all__ = [
    "CHANGE_KINDS",
    "REVIEWED_PATHS",
    "Change",
    "Outcome",
    "ReviewReport",
    "compare",
    "evaluate_outcome",
    "recorded_outcome",
    "who",
]

#: Every kind of change, in report order.
CHANGE_KINDS: Final = (
    "admission_denied",
    "admission_allowed",
    "cache_changed",
    "priority_changed",
    "retention_changed",
    "sharing_lost",
    "sharing_gained",
    "offload_lost",
    "offload_gained",
    "groups_changed",
)
#: The rules whose outcomes are compared.
REVIEWED_PATHS: Final = (ADMISSION_PATH, SHARING_PATH, RETENTION_PATH, OFFLOAD_PATH, GROUPS_PATH)

# What a deny of each verdict rule looks like (fail closed), by path.
_DENIED: Final[Mapping[str, dict[str, Any]]] = {
    ADMISSION_PATH: {"allow": False, "cache": False, "priority": 0},
    SHARING_PATH: {"allow": False},
    OFFLOAD_PATH: {"allow": False},
    RETENTION_PATH: {"ttl_seconds": 0},
    GROUPS_PATH: {"publish": None, "read": []},
}
_FIELDS: Final[Mapping[str, tuple[str, ...]]] = {p: tuple(v) for p, v in _DENIED.items()}


@dataclass(frozen=True, slots=True)
class Outcome:
    """What one decision decided, as the governor acts on it.

    Attributes:
        fields: the compared fields of the rule (see the module docstring); a field
            a record lacks is absent.
        reason: the policy's reason, or the error, for the examples.
    """

    fields: Mapping[str, Any]
    reason: str


def _scope(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def evaluate_outcome(client: PolicyClient, path: str, input: Mapping[str, Any]) -> Outcome:
    """Evaluate one decision with a client's typed, fail-closed accessors.

    Args:
        client: the client over the bundle to ask.
        path: one of :data:`REVIEWED_PATHS`.
        input: the policy input, as the governor builds it for that rule.

    Returns:
        The outcome.

    Raises:
        ValueError: ``path`` is not a reviewed rule.
    """
    scope = _scope(input.get("scope"))
    if path == ADMISSION_PATH:
        a = client.admission(scope, input.get("tokens"), input.get("priority"))  # type: ignore[arg-type]
        return Outcome({"allow": a.allow, "cache": a.cache, "priority": a.priority}, a.reason)
    if path == SHARING_PATH:
        s = client.sharing(_scope(input.get("requester")), _scope(input.get("owner")))
        return Outcome({"allow": s.allow}, s.reason)
    if path == RETENTION_PATH:
        r = client.retention(scope)
        return Outcome({"ttl_seconds": r.ttl_seconds}, r.decision.reason)
    if path == OFFLOAD_PATH:
        o = client.offload(scope, input.get("tier"))  # type: ignore[arg-type]
        return Outcome({"allow": o.allow}, o.reason)
    if path == GROUPS_PATH:
        g = client.share_groups(scope)
        return Outcome({"publish": g.publish, "read": list(g.read)}, g.decision.reason)
    raise ValueError(f"{path!r} is not a reviewed rule: use one of {', '.join(REVIEWED_PATHS)}")


def recorded_outcome(path: str, result: Any) -> Outcome:
    """The outcome a recorded decision had.

    Args:
        path: one of :data:`REVIEWED_PATHS`.
        result: the recorded result (possibly holding only some fields).

    Returns:
        The outcome: a result that is not an object (an undefined rule) is the
        rule's deny; otherwise the fields the result holds.

    Raises:
        ValueError: ``path`` is not a reviewed rule.
    """
    if path not in _DENIED:
        raise ValueError(f"{path!r} is not a reviewed rule: use one of {', '.join(REVIEWED_PATHS)}")
    if not isinstance(result, Mapping):
        return Outcome(dict(_DENIED[path]), "no result recorded")
    fields = {k: result[k] for k in _FIELDS[path] if k in result}
    reason = result.get("reason")
    return Outcome(fields, reason if isinstance(reason, str) else "")


def _same(a: Any, b: Any) -> bool:
    """JSON equality (1 == 1.0; True is not 1)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    return bool(a == b)


def compare(path: str, before: Outcome, after: Outcome) -> list[str]:
    """The kinds of change from ``before`` to ``after`` (empty: the same outcome).

    Args:
        path: the rule both outcomes are of.
        before: the recorded (or old bundle's) outcome.
        after: the candidate (or new bundle's) outcome.

    Returns:
        Change kinds, in :data:`CHANGE_KINDS` order.
    """
    b, a = before.fields, after.fields
    kinds: list[str] = []

    def differs(key: str) -> bool:
        return key in b and key in a and not _same(b[key], a[key])

    if path == ADMISSION_PATH:
        if differs("allow"):
            kinds.append("admission_denied" if b["allow"] else "admission_allowed")
        elif b.get("allow") is True:
            if differs("cache"):
                kinds.append("cache_changed")
            if differs("priority"):
                kinds.append("priority_changed")
    elif path == RETENTION_PATH:
        if differs("ttl_seconds"):
            kinds.append("retention_changed")
    elif path in (SHARING_PATH, OFFLOAD_PATH):
        prefix = "sharing" if path == SHARING_PATH else "offload"
        if differs("allow"):
            kinds.append(f"{prefix}_lost" if b["allow"] else f"{prefix}_gained")
    elif path == GROUPS_PATH and (differs("publish") or differs("read")):
        kinds.append("groups_changed")
    return kinds


@dataclass(frozen=True, slots=True)
class Change:
    """One decision whose outcome would change.

    Attributes:
        kind: one of :data:`CHANGE_KINDS`.
        path: the rule.
        tenant: the tenant asking (the requester, for sharing); ``""`` if unknown.
        classification: the scope's (the owner's, for sharing) label; ``""`` if unknown.
        input: the policy input.
        before: the recorded (or old bundle's) outcome.
        after: the candidate's (or new bundle's) outcome.
        decision_id: the recorded decision's id (replay); None for generated inputs.
        timestamp: when it was recorded (replay), ISO 8601; None for generated inputs.
    """

    kind: str
    path: str
    tenant: str
    classification: str
    input: Mapping[str, Any]
    before: Outcome
    after: Outcome
    decision_id: str | None = None
    timestamp: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The change as JSON-able data.

        Returns:
            ``kind, path, tenant, classification, decision_id, timestamp, input,
            before, after`` (each outcome as its fields plus ``reason``).
        """
        return {
            "kind": self.kind,
            "path": self.path,
            "tenant": self.tenant,
            "classification": self.classification,
            "decision_id": self.decision_id,
            "timestamp": self.timestamp,
            "input": dict(self.input),
            "before": {**self.before.fields, "reason": self.before.reason},
            "after": {**self.after.fields, "reason": self.after.reason},
        }


def _label(value: Any) -> str:
    return value if isinstance(value, str) else ""


def who(path: str, input: Mapping[str, Any]) -> tuple[str, str]:
    """The tenant and classification a decision is counted under.

    Args:
        path: the rule.
        input: its policy input.

    Returns:
        ``(tenant, classification)``: the requester's tenant and the owner's label
        for sharing, the scope's otherwise; ``""`` where absent or not a string.
    """
    if path == SHARING_PATH:
        requester, owner = _scope(input.get("requester")), _scope(input.get("owner"))
        return _label(requester.get("tenant")), _label(owner.get("classification"))
    scope = _scope(input.get("scope"))
    return _label(scope.get("tenant")), _label(scope.get("classification"))


@dataclass(slots=True)
class ReviewReport:
    """Counts and examples of the changes a policy change would make (built by adding).

    Attributes:
        evaluated: decisions compared.
        skipped: decisions that could not be compared (an unknown rule, no input),
            by reason.
        counts: changes by ``(kind, tenant, classification)``.
        examples: the first ``max_examples`` changes of each kind.
        max_examples: examples kept per kind.
    """

    evaluated: int = 0
    skipped: Counter[str] = field(default_factory=Counter)
    counts: Counter[tuple[str, str, str]] = field(default_factory=Counter)
    examples: dict[str, list[Change]] = field(default_factory=dict)
    max_examples: int = 3

    @property
    def changed(self) -> int:
        """Changes counted (a decision with two kinds of change counts twice)."""
        return sum(self.counts.values())

    def add(self, change: Change) -> None:
        """Count one change, and keep it as an example while its kind has room.

        Args:
            change: the change.
        """
        self.counts[(change.kind, change.tenant, change.classification)] += 1
        kept = self.examples.setdefault(change.kind, [])
        if len(kept) < self.max_examples:
            kept.append(change)

    def by_kind(self) -> dict[str, int]:
        """Changes per kind, in :data:`CHANGE_KINDS` order, kinds with none left out.

        Returns:
            ``{kind: count}``.
        """
        totals: Counter[str] = Counter()
        for (kind, _, _), n in self.counts.items():
            totals[kind] += n
        return {k: totals[k] for k in CHANGE_KINDS if totals[k]}

    def to_dict(self) -> dict[str, Any]:
        """The report as JSON-able data.

        Returns:
            ``evaluated, changed, skipped, by_kind, counts`` (a list of ``{kind,
            tenant, classification, count}`` sorted by kind order, then count
            descending) and ``examples`` (``{kind: [change]}``).
        """
        order = {k: i for i, k in enumerate(CHANGE_KINDS)}
        rows = sorted(self.counts.items(), key=lambda kv: (order[kv[0][0]], -kv[1], kv[0][1:]))
        return {
            "evaluated": self.evaluated,
            "changed": self.changed,
            "skipped": dict(sorted(self.skipped.items())),
            "by_kind": self.by_kind(),
            "counts": [
                {"kind": k, "tenant": t, "classification": c, "count": n} for (k, t, c), n in rows
            ],
            "examples": {
                k: [c.to_dict() for c in self.examples[k]]
                for k in CHANGE_KINDS
                if k in self.examples
            },
        }
