"""``kvgov policy replay``: recorded decisions against a candidate bundle.

The command reads the audit trail and a policy bundle, so it is mounted on the
``kvgov policy`` group by :mod:`kvgov.cli.main` (the group's own module,
:mod:`kvgov.cli.policy`, holds the review helpers it shares); the comparison itself is
:func:`kvgov.policy.replay.replay`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from kvgov.audit.export import decision_log
from kvgov.audit.queries import AuditQueries
from kvgov.cli.policy import (
    finish_review,
    open_policy_engine,
    print_review,
    read_policy_data,
    review_console,
    review_options,
)
from kvgov.defaults import AUDIT_URL_ENV
from kvgov.exceptions import KVGovError, PolicyError
from kvgov.policy.client import PolicyClient
from kvgov.policy.replay import read_decision_log, replay

__all__ = ["replay_command"]


def _parse_time(_ctx: Any, _param: Any, value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        when = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not an ISO 8601 date/time") from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


def _in_window(entry: dict[str, Any], since: datetime | None, until: datetime | None) -> bool:
    if since is None and until is None:
        return True
    try:
        when = _parse_time(None, None, entry.get("timestamp"))
    except click.BadParameter:
        return False
    return when is not None and (since is None or when >= since) and (until is None or when < until)


def _involves(entry: dict[str, Any], tenant: str | None) -> bool:
    if tenant is None:
        return True
    policy_input = entry.get("input")
    if not isinstance(policy_input, dict):
        return False
    scopes = [policy_input.get(k) for k in ("scope", "requester", "owner")]
    return any(isinstance(s, dict) and s.get("tenant") == tenant for s in scopes)


def _file_entries(
    path: Path, since: datetime | None, until: datetime | None, tenant: str | None
) -> Iterator[dict[str, Any]]:
    for entry in read_decision_log(path):
        if _in_window(entry, since, until) and _involves(entry, tenant):
            yield entry


def _trail_entries(
    url: str, since: datetime | None, until: datetime | None, tenant: str | None
) -> Iterator[dict[str, Any]]:
    """The recorded decisions of the audit trail at ``url``."""
    with AuditQueries(url) as queries:
        yield from decision_log(queries, since=since, until=until, tenant=tenant)


@click.command("replay")
@click.option(
    "--candidate",
    required=True,
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="The candidate bundle directory.",
)
@click.option(
    "--url",
    default=None,
    metavar="URL",
    help="The audit database whose recorded decisions are replayed [default: $KVGOV_AUDIT_URL].",
)
@click.option(
    "--decision-log",
    "log_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Replay a decision log instead (JSON lines: kvgov audit export --format "
    "opa-decision-log, or an OPA server's decision logs).",
)
@click.option(
    "--since", callback=_parse_time, help="Inclusive lower bound, ISO 8601 (UTC if no zone)."
)
@click.option(
    "--until", callback=_parse_time, help="Exclusive upper bound, ISO 8601 (UTC if no zone)."
)
@click.option("--tenant", default=None, help="Only decisions where this tenant asks or owns.")
@review_options
def replay_command(
    candidate: Path,
    url: str | None,
    log_file: Path | None,
    since: datetime | None,
    until: datetime | None,
    tenant: str | None,
    engine: str,
    data_file: Path | None,
    as_json: bool,
    examples: int,
    fail_on_change: bool,
) -> None:
    """Re-evaluate the decisions recorded in the audit trail against a candidate bundle
    and print what would change, by tenant and classification, with examples."""
    entries: Iterator[dict[str, Any]]
    if log_file is not None:
        if url is not None:
            raise click.UsageError("give --url or --decision-log, not both")
        entries = _file_entries(log_file, since, until, tenant)
    else:
        trail = url or os.environ.get(AUDIT_URL_ENV)
        if not trail:
            raise click.UsageError(f"give --url (or set ${AUDIT_URL_ENV}) or --decision-log")
        entries = _trail_entries(trail, since, until, tenant)
    engine_ = open_policy_engine(candidate, read_policy_data(data_file), engine)
    client = PolicyClient(engine_)
    try:
        report = replay(entries, client, max_examples=examples)
    except PolicyError as exc:
        click.echo(f"cannot read the decisions: {exc}", err=True)
        raise click.exceptions.Exit(2) from None
    except Exception as exc:
        if isinstance(exc, KVGovError) or type(exc).__module__.startswith("sqlalchemy"):
            click.echo(f"cannot read the audit trail: {exc}", err=True)
            raise click.exceptions.Exit(3) from None
        raise
    finally:
        client.close()
    revision = engine_.bundle_revision
    if as_json:
        click.echo(json.dumps({"candidate_revision": revision, **report.to_dict()}, indent=2))
    else:
        source = str(log_file) if log_file is not None else "the audit trail"
        print_review(review_console(), report, f"{source} replayed on {revision}")
    finish_review(report, fail_on_change)
