"""Outcomes of decisions compared, counted and exemplified (replay and diff share this)."""

from __future__ import annotations

from typing import Any

import pytest

from kvgov.policy.client import PolicyClient
from kvgov.policy.embedded import EmbeddedEngine
from kvgov.policy.review import (
    CHANGE_KINDS,
    Change,
    Outcome,
    ReviewReport,
    compare,
    evaluate_outcome,
    recorded_outcome,
    who,
)
from tests.policy.samples import SCOPE

ADMISSION = "kvgov/admission/decision"
SHARING = "kvgov/sharing/decision"


def admitted(allow: bool = True, cache: bool = True, priority: int = 50) -> Outcome:
    return Outcome({"allow": allow, "cache": cache, "priority": priority}, "")


@pytest.mark.parametrize(
    ("before", "after", "kinds"),
    [
        (admitted(), admitted(), []),
        (admitted(), admitted(False, False, 0), ["admission_denied"]),
        (admitted(False, False, 0), admitted(), ["admission_allowed"]),
        (admitted(), admitted(cache=False), ["cache_changed"]),
        (admitted(), admitted(priority=20), ["priority_changed"]),
        (admitted(), admitted(cache=False, priority=20), ["cache_changed", "priority_changed"]),
        (admitted(False, False, 0), admitted(False, True, 9), []),
        (Outcome({"allow": True}, ""), admitted(priority=1), []),
    ],
)
def test_admission_changes(before: Outcome, after: Outcome, kinds: list[str]) -> None:
    """A flip says it all; cache and priority count only for requests admitted both
    times; a field the record lacks is not compared."""
    assert compare(ADMISSION, before, after) == kinds


def test_verdict_retention_and_group_changes() -> None:
    """Sharing and offload flips are lost / gained; a TTL or a group change is a change."""
    yes, no = Outcome({"allow": True}, ""), Outcome({"allow": False}, "")
    assert compare(SHARING, yes, no) == ["sharing_lost"]
    assert compare("kvgov/offload/decision", no, yes) == ["offload_gained"]
    ttl = [Outcome({"ttl_seconds": t}, "") for t in (3600, 3600.0, 60)]
    assert compare("kvgov/retention/decision", ttl[0], ttl[1]) == []
    assert compare("kvgov/retention/decision", ttl[0], ttl[2]) == ["retention_changed"]
    groups = [Outcome({"publish": None, "read": r}, "") for r in ([], ["docs"])]
    assert compare("kvgov/sharing/groups", groups[0], groups[1]) == ["groups_changed"]


def test_true_is_not_one() -> None:
    """JSON equality: a boolean never equals a number (Python's True == 1 does not apply)."""
    assert compare(ADMISSION, admitted(cache=True), Outcome({**admitted().fields, "cache": 1}, ""))


def test_recorded_outcome_reads_what_the_record_holds() -> None:
    """Fields are taken as recorded; a missing result is the rule's deny; an unknown rule
    is refused."""
    partial = recorded_outcome(ADMISSION, {"allow": True, "reason": "admitted"})
    assert partial == Outcome({"allow": True}, "admitted")
    assert recorded_outcome(SHARING, None) == Outcome({"allow": False}, "no result recorded")
    with pytest.raises(ValueError, match="not a reviewed rule"):
        recorded_outcome("kvgov/classifications", {})


def test_evaluate_outcome_reads_through_the_client() -> None:
    """Outcomes come from the client's fail-closed readers (a garbled input denies)."""
    client = PolicyClient(EmbeddedEngine(run_tests=False))
    good = evaluate_outcome(client, ADMISSION, {"scope": SCOPE, "tokens": 8, "priority": None})
    assert good.fields == {"allow": True, "cache": True, "priority": 50}
    bad = evaluate_outcome(client, ADMISSION, {"scope": "acme", "tokens": "x"})
    assert bad.fields == {"allow": False, "cache": False, "priority": 0}
    groups = evaluate_outcome(client, "kvgov/sharing/groups", {"scope": SCOPE})
    assert groups.fields == {"publish": None, "read": []}
    with pytest.raises(ValueError):
        evaluate_outcome(client, "kvgov/classifications", {})
    client.close()


def test_who_counts_sharing_under_the_requester_and_the_owners_label() -> None:
    """Sharing is counted under the tenant asking and the owner's label; others under the scope."""
    owner = {**SCOPE, "classification": "public"}
    assert who(SHARING, {"requester": {**owner, "tenant": "globex"}, "owner": owner}) == (
        "globex",
        "public",
    )
    assert who(ADMISSION, {"scope": SCOPE}) == ("acme", "internal")
    assert who(ADMISSION, {"scope": 7}) == ("", "")


def change(kind: str, tenant: str = "acme", **kw: Any) -> Change:
    return Change(kind, ADMISSION, tenant, "internal", {}, admitted(), admitted(False), **kw)


def test_report_counts_and_keeps_a_few_examples() -> None:
    """Counts by kind, tenant and label; at most max_examples examples per kind; JSON in
    kind order, then count descending."""
    report = ReviewReport(max_examples=2)
    for tenant in ("acme", "globex", "globex", "globex"):
        report.add(change("admission_denied", tenant))
    report.add(change("cache_changed"))
    assert report.changed == 5
    assert report.by_kind() == {"admission_denied": 4, "cache_changed": 1}
    assert len(report.examples["admission_denied"]) == 2
    data = report.to_dict()
    assert [(r["kind"], r["tenant"], r["count"]) for r in data["counts"]] == [
        ("admission_denied", "globex", 3),
        ("admission_denied", "acme", 1),
        ("cache_changed", "acme", 1),
    ]
    assert data["examples"]["cache_changed"][0]["before"] == {**admitted().fields, "reason": ""}
    assert set(data["by_kind"]) <= set(CHANGE_KINDS)
