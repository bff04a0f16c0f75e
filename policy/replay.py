"""Replaying recorded decisions against a candidate bundle (``kvgov policy replay``).

A policy review asks what a change would have done to real traffic. Replay takes
recorded decisions in OPA's decision-log shape (one JSON object per decision:
``decision_id``, ``path``, ``input``, ``result`` or ``error``, ``timestamp``),
which is what ``kvgov audit export --format opa-decision-log`` writes from the
audit trail and what an OPA server's decision logger writes, evaluates each
input on the candidate bundle through :class:`~kvgov.policy.client.PolicyClient`
(fail closed, as the governor reads decisions), and counts the decisions whose
outcome would change (see :mod:`kvgov.policy.review`).

Recorded engine errors (an entry with ``error``: the decision failed closed
because the engine failed, timed out or answered in the wrong shape) are not
compared: they say what the engine did, not what the policy decided, and a
transient one would fail every ``--fail-on-change`` gate. They are counted
among the skipped.

Exactness: the audit trail records every input a decision needs except token
ids, which no decision reads (admission reads the token count). Events written
before the trail recorded the requested priority replay with ``priority: null``,
and admissions recorded without ``ttl_seconds`` are not replayed for retention.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from kvgov.exceptions import PolicyError
from kvgov.policy.client import PolicyClient
from kvgov.policy.engine import normalize_path
from kvgov.policy.review import (
    REVIEWED_PATHS,
    Change,
    ReviewReport,
    compare,
    evaluate_outcome,
    recorded_outcome,
    who,
)

__all__ = ["read_decision_log", "replay"]


def read_decision_log(path: str | Path) -> Iterator[dict[str, Any]]:
    """Read a decision log: one JSON object per line (blank lines skipped).

    Args:
        path: the file.

    Yields:
        The entries, in file order.

    Raises:
        PolicyError: the file cannot be read, or a line is not a JSON object (the
            message names the line).
    """
    try:
        with Path(path).open(encoding="utf-8") as f:
            for number, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError as exc:
                    raise PolicyError(f"{path}:{number}: not JSON: {exc.msg}") from None
                if not isinstance(entry, dict):
                    raise PolicyError(f"{path}:{number}: a decision-log entry must be an object")
                yield entry
    except OSError as exc:
        raise PolicyError(f"cannot read decision log {path}: {exc.strerror or exc}") from None


def _path(entry: Mapping[str, Any]) -> str | None:
    raw = entry.get("path")
    if not isinstance(raw, str):
        return None
    try:
        return normalize_path(raw)
    except ValueError:
        return None


def replay(
    entries: Iterable[Mapping[str, Any]], candidate: PolicyClient, *, max_examples: int = 3
) -> ReviewReport:
    """Re-evaluate recorded decisions on a candidate and count what would change.

    Args:
        entries: decision-log entries (see the module docstring); entries of rules
            that are not reviewed, without an input object, or recording an engine
            error, are skipped and counted by reason.
        candidate: a client over the candidate bundle. Its decision cache makes
            repeated inputs cheap; size it to the trail.
        max_examples: changes kept as examples per kind.

    Returns:
        The report.
    """
    report = ReviewReport(max_examples=max_examples)
    for entry in entries:
        path = _path(entry)
        if path not in REVIEWED_PATHS:
            report.skipped[f"rule {entry.get('path')!r} is not reviewed"] += 1
            continue
        policy_input = entry.get("input")
        if not isinstance(policy_input, Mapping):
            report.skipped["no input recorded"] += 1
            continue
        if entry.get("error") not in (None, False):
            report.skipped["recorded an engine error (failed closed): not compared"] += 1
            continue
        before = recorded_outcome(path, entry.get("result"))
        after = evaluate_outcome(candidate, path, policy_input)
        report.evaluated += 1
        kinds = compare(path, before, after)
        if not kinds:
            continue
        tenant, classification = who(path, policy_input)
        decision_id, timestamp = entry.get("decision_id"), entry.get("timestamp")
        for kind in kinds:
            report.add(
                Change(
                    kind=kind,
                    path=path,
                    tenant=tenant,
                    classification=classification,
                    input=policy_input,
                    before=before,
                    after=after,
                    decision_id=decision_id if isinstance(decision_id, str) else None,
                    timestamp=timestamp if isinstance(timestamp, str) else None,
                )
            )
    return report
