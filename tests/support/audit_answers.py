"""The audit CLI's answers, parsed, without the names of stored rows: for tests that replay
one workload under two event layouts and compare every compliance command's output."""

from __future__ import annotations

import csv
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from click.testing import CliRunner

from kvgov.cli.audit import audit_group

#: Fields that name a stored row (one row fewer shifts every later one), not a fact.
ROW_NAMES = ("event_id", "seq", "hash")


def cli(url: str, *args: str) -> str:
    """``kvgov audit ARGS --url URL``'s output; the command must succeed."""
    result = CliRunner().invoke(audit_group, [*args, "--url", url])
    assert result.exit_code == 0, result.output
    return result.output


def export(url: str, fmt: str, path: Path) -> str:
    """``kvgov audit export`` in ``fmt`` to ``path``; the file's text."""
    cli(url, "export", "--format", fmt, "--output", str(path))
    return path.read_text(encoding="utf-8")


def unnamed(value: Any) -> Any:
    """``value`` (parsed JSON) without the names of stored rows and measured durations
    (a zeroization's ``seconds``), in JSON details and in a CSV's details text alike."""
    if isinstance(value, list):
        return [unnamed(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {k: unnamed(v) for k, v in value.items() if k not in ROW_NAMES}
    labels = out.get("labels")
    if isinstance(labels, dict):  # the OPA decision log names its event
        out["labels"] = {k: v for k, v in labels.items() if k != "kvgov_event"}
    details = out.get("details")
    zeroization = out.get("type") == "zeroization"
    if isinstance(details, str) and details.startswith("{"):  # csv: JSON text
        parsed = unnamed(json.loads(details))
        if zeroization:
            parsed.pop("seconds", None)
        out["details"] = json.dumps(parsed, sort_keys=True)
    elif isinstance(details, dict):
        parsed = unnamed(details)
        if zeroization:
            parsed.pop("seconds", None)
        out["details"] = parsed
    result = out.get("result")
    if isinstance(result, dict):  # the OPA decision log's event
        out["result"] = unnamed(result)
    return out


def commands(
    url: str, tmp_path: Path, tenants: Sequence[str], window: tuple[str, str], prefix: str = ""
) -> dict[str, Any]:
    """Every ``kvgov audit`` compliance command's output on the trail at ``url``, parsed,
    :func:`unnamed`, keyed by ``prefix`` and the command's arguments.

    The commands: ``denials``; ``events`` whole, with ``--limit``, by type, in the time
    ``window`` (``--since``, ``--until``) and per tenant; ``reuse``, ``erasure`` and
    ``denials`` per tenant of ``tenants``; ``decisions`` per policy revision the trail
    names; ``events --count-by`` every field; every export format (``tmp_path`` holds the
    files).
    """
    out: dict[str, Any] = {}
    queries: list[list[str]] = [
        ["denials"],
        ["events"],
        ["events", "--limit", "7"],
        ["events", "--type", "reuse", "--limit", "3"],
        ["events", "--type", "admission", "--limit", "4"],
        ["events", "--since", window[0], "--until", window[1]],
    ]
    for tenant in tenants:
        queries += [["reuse", "--tenant", tenant], ["erasure", "--tenant", tenant]]
        queries += [["denials", "--tenant", tenant], ["events", "--tenant", tenant]]
    for kind in ("admission", "reuse", "cross_tenant_reuse", "policy_denied", "zeroization"):
        queries.append(["events", "--type", kind])
    revisions = {r["policy_revision"] for r in json.loads(cli(url, "events", "--json"))}
    for rev in sorted(r for r in revisions if r):
        queries.append(["decisions", "--policy-revision", rev])
    for q in queries:
        out[prefix + " ".join(q)] = unnamed(json.loads(cli(url, *q, "--json")))
    for by in ("type", "tenant", "requester_tenant", "stream", "policy_revision"):
        out[f"{prefix}count-by {by}"] = json.loads(cli(url, "events", "--count-by", by, "--json"))
    out[f"{prefix}export jsonl"] = [
        unnamed(json.loads(line))
        for line in export(url, "jsonl", tmp_path / "x.jsonl").splitlines()
    ]
    out[f"{prefix}export json"] = unnamed(json.loads(export(url, "json", tmp_path / "x.json")))
    rows = list(csv.DictReader(io.StringIO(export(url, "csv", tmp_path / "x.csv"))))
    out[f"{prefix}export csv"] = unnamed(rows)
    out[f"{prefix}export opa-decision-log"] = [
        unnamed(json.loads(line))
        for line in export(url, "opa-decision-log", tmp_path / "x.log").splitlines()
    ]
    return out
