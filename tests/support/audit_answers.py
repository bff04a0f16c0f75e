"""The audit CLI's answers, parsed, without the names of stored rows: for tests that replay
one workload under two event layouts and compare every compliance command's output."""

from __future__ import annotations

import json
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
