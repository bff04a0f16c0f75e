"""``kvgov audit ...`` (verification, compliance queries, spool status); ``kvgov db ...``
lives in :mod:`kvgov.cli.db`.

Every command takes ``--url`` (default: ``$KVGOV_AUDIT_URL``, else
``kvgov.defaults.AUDIT_URL``). Commands that print records take ``--format
text|json|jsonl|csv`` (``--json`` / ``--csv`` for short); ``text`` is a table on a
terminal and whole tab-separated values otherwise (:mod:`kvgov.cli.common`).
They only read: a SQLite file that does not exist is an error, never created; a
trail with no events is an error unless ``--allow-empty``. Errors are one line
saying what to do, and the exit status says what kind of failure it is
(:mod:`kvgov.cli.errors`): 1 evidence (``verify`` found tampering, an empty
trail), 2 usage, 3 environment (the database is unreachable or missing, lacks the
schema or a permission).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO, TypeVar

import click
from rich.console import Console
from rich.text import Text

from kvgov.audit.expect import load_expected_streams
from kvgov.audit.export import decision_log, write_decision_log
from kvgov.audit.queries import RECORD_FIELDS, AuditQueries, AuditRecord
from kvgov.audit.signing import generate_key_files, key_id, load_public_key
from kvgov.audit.store import (
    mask_url,
)
from kvgov.audit.verify import VerifyReport, verify
from kvgov.cli.audit_ops import quarantine_group, status_cmd, streams_cmd
from kvgov.cli.common import (
    allow_empty_option,
    default_url,
    emit_records,
    format_options,
    print_table,
    url_option,
)
from kvgov.cli.db import MIGRATION_STREAM, db_group
from kvgov.cli.errors import (
    EXIT_EVIDENCE,
    ErrorsToExitCodes,
)
from kvgov.defaults import VERIFY_MAX_UNSIGNED_EVENTS, VERIFY_MAX_UNSIGNED_SECONDS
from kvgov.exceptions import AuditTrailEmpty

__all__ = ["MIGRATION_STREAM", "audit_group", "db_group"]

_T = TypeVar("_T")


_default_url = default_url
_url_option = url_option


def _output_options(f: Callable[..., Any]) -> Callable[..., Any]:
    return _url_option(format_options(allow_empty_option(f)))


def _parse_time(_ctx: Any, _param: Any, value: str | None) -> datetime | None:
    if value is None:
        return None
    try:
        dt = datetime.fromisoformat(value)
    except ValueError as exc:
        raise click.BadParameter(f"{value!r} is not an ISO 8601 date/time") from exc
    return dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)


_since = click.option(
    "--since", callback=_parse_time, help="Inclusive lower bound, ISO 8601 (UTC if no zone)."
)
_until = click.option(
    "--until", callback=_parse_time, help="Exclusive upper bound, ISO 8601 (UTC if no zone)."
)


def _emit(records: Sequence[AuditRecord], columns: Sequence[str], title: str, fmt: str) -> None:
    dicts = [r.to_dict() for r in records]

    def cells(i: int) -> list[str]:
        d, r = dicts[i], records[i]
        out = []
        for c in columns:
            if c == "blocks":
                v: Any = len(r.block_ids)
            elif c in d:
                v = d[c]
            else:
                v = r.details.get(c)
            if isinstance(v, (dict, list)):
                v = json.dumps(v, sort_keys=True)
            out.append("" if v is None else str(v))
        return out

    emit_records(
        fmt,
        dicts,
        f"{title} ({len(records)})",
        columns,
        cells,
        csv_fields=RECORD_FIELDS,
        csv_row=lambda i: records[i].csv_row(),
    )


def _query(url: str | None, ask: Callable[[AuditQueries], _T], allow_empty: bool) -> _T:
    """Ask the queries on ``url`` (or the default); a trail with no event is an error
    unless ``allow_empty`` (a wrong URL must not look like a quiet week)."""
    target = url or _default_url()
    with AuditQueries(target) as q:
        if not allow_empty and q.is_empty():
            raise AuditTrailEmpty(mask_url(target))
        return ask(q)


@click.group("audit", cls=ErrorsToExitCodes)
def audit_group() -> None:
    """Verify the audit trail, run compliance queries, inspect spools and quarantines."""


audit_group.add_command(status_cmd)
audit_group.add_command(quarantine_group)
audit_group.add_command(streams_cmd)


@audit_group.command("verify")
@_url_option
@click.option(
    "--public-key",
    "public_keys",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Trusted checkpoint public key (PEM); repeatable. Without it, checkpoints are "
    "checked against self-recorded keys and reported as untrusted.",
)
@click.option(
    "--require-checkpoints",
    is_flag=True,
    help="Fail a stream that no signed checkpoint covers, or that ends more than "
    "--max-unsigned-events events or --max-unsigned-seconds after its last one.",
)
@click.option(
    "--max-unsigned-events",
    type=click.IntRange(min=0),
    default=VERIFY_MAX_UNSIGNED_EVENTS,
    show_default=True,
    help="With --require-checkpoints: most events after a stream's last signed checkpoint.",
)
@click.option(
    "--max-unsigned-seconds",
    type=click.FloatRange(min=0),
    default=VERIFY_MAX_UNSIGNED_SECONDS,
    show_default=True,
    help="With --require-checkpoints: most seconds of event time after it.",
)
@click.option(
    "--expect-streams",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="A signed list of the streams that must exist (`kvgov audit streams`); its "
    "signer must be a --public-key.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
@allow_empty_option
def verify_cmd(
    url: str | None,
    public_keys: tuple[Path, ...],
    require_checkpoints: bool,
    max_unsigned_events: int,
    max_unsigned_seconds: float,
    expect_streams: Path | None,
    as_json: bool,
    no_progress: bool,
    allow_empty: bool,
) -> None:
    """Recompute every hash chain and check every signed checkpoint (exit 1 on failure).

    A trail with no events fails too (exit 1) unless --allow-empty.
    """
    keys = [load_public_key(p) for p in public_keys] if public_keys else None
    expected = None
    if expect_streams is not None:
        if not keys:
            raise click.UsageError(
                "--expect-streams needs --public-key with the key that signed the list"
            )
        expected = load_expected_streams(expect_streams, {key_id(k): k for k in keys})
    report = verify(
        url or _default_url(),
        keys,
        progress=not (no_progress or as_json),
        require_checkpoints=require_checkpoints,
        max_unsigned_events=max_unsigned_events,
        max_unsigned_seconds=max_unsigned_seconds,
        expected=expected,
    )
    if report.events == 0 and not allow_empty:
        raise AuditTrailEmpty(mask_url(url or _default_url()))
    if as_json:
        click.echo(json.dumps(_report_json(report), indent=2))
    else:
        _print_report(report)
    if not report.ok:
        sys.exit(EXIT_EVIDENCE)


def _report_json(report: VerifyReport) -> dict[str, Any]:
    return {
        "ok": report.ok,
        "events": report.events,
        "checkpoints": report.checkpoints,
        "untrusted_checkpoints": report.untrusted_checkpoints,
        "trusted_keys": list(report.trusted_keys),
        "seconds": report.seconds,
        "streams": [
            {
                "stream": s.stream,
                "ok": s.ok,
                "events": s.events,
                "last_seq": s.last_seq,
                "head_hash": s.head_hash,
                "checkpoints": s.checkpoints,
                "last_checkpoint_seq": s.last_checkpoint_seq,
                "untrusted_checkpoints": s.untrusted_checkpoints,
                "problems": [
                    {"seq": p.seq, "kind": p.kind, "message": p.message} for p in s.problems
                ],
            }
            for s in report.streams
        ],
    }


def _print_report(report: VerifyReport) -> None:
    console = Console(soft_wrap=True)  # whole lines in a pipe, too
    print_table(
        f"audit verification: {report.events} events",
        ("stream", "events", "last seq", "checkpoints", "status", "first bad event"),
        [
            (
                s.stream,
                str(s.events),
                str(s.last_seq),
                str(s.checkpoints),
                Text.from_markup("[green]ok[/]" if s.ok else "[red]FAILED[/]"),
                "" if s.first_bad is None else
                f"seq {s.first_bad.seq}: {s.first_bad.kind}: {s.first_bad.message}",
            )
            for s in report.streams
        ],
    )  # fmt: skip
    if report.untrusted_checkpoints:
        console.print(
            f"[yellow]{report.untrusted_checkpoints} checkpoint(s) are signed by keys the "
            "writers recorded themselves (untrusted); pass --public-key to trust a key.[/]"
        )
    console.print(
        f"{'[green]OK[/]' if report.ok else '[red]FAILED[/]'}: {report.events} events, "
        f"{report.checkpoints} checkpoints in {report.seconds:.2f} s"
    )


@audit_group.command("reuse")
@click.option("--tenant", required=True, help="Owner tenant of the reused blocks.")
@_since
@_until
@_output_options
def reuse_cmd(
    tenant: str,
    since: datetime | None,
    until: datetime | None,
    url: str | None,
    fmt: str,
    allow_empty: bool,
) -> None:
    """Every reuse of TENANT's cached blocks: by which tenant, under which decision."""
    rows = _query(url, lambda q: q.reuse(tenant, since, until), allow_empty)
    cols = ("time", "type", "tenant", "requester_tenant", "sequence_id", "blocks",
            "reused_tokens", "decision_id", "policy_revision")  # fmt: skip
    _emit(rows, cols, f"reuse of {tenant}'s blocks", fmt)


@audit_group.command("erasure")
@click.option("--tenant", default=None, help="The erased tenant.")
@click.option(
    "--order",
    "order_id",
    default=None,
    help="A fleet order (`kvgov fleet purge`): one line per engine, with its evidence.",
)
@_output_options
def erasure_cmd(
    tenant: str | None, order_id: str | None, url: str | None, fmt: str, allow_empty: bool
) -> None:
    """The erasure evidence of TENANT (when, blocks, bytes zeroized, verification), or of
    a fleet ORDER (each engine: its result and its evidence event)."""
    if (tenant is None) == (order_id is None):
        raise click.UsageError("give exactly one of --tenant and --order")
    if order_id is not None:
        from kvgov.cli.fleet import print_order_evidence

        print_order_evidence(url or _default_url(), order_id, fmt)
        return
    erased = str(tenant)
    rows = _query(url, lambda q: q.erasure(erased), allow_empty)
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r.details if k not in keys]
    _emit(rows, ("time", "event_id", "blocks", *keys), f"erasure of {erased}", fmt)


@audit_group.command("denials")
@click.option("--tenant", default=None, help="Only denials where this tenant owned or asked.")
@_since
@_until
@_output_options
def denials_cmd(
    tenant: str | None,
    since: datetime | None,
    until: datetime | None,
    url: str | None,
    fmt: str,
    allow_empty: bool,
) -> None:
    """Policy denials, share denials and policy errors (which fail closed)."""
    rows = _query(url, lambda q: q.denials(tenant, since, until), allow_empty)
    cols = ("time", "type", "tenant", "requester_tenant", "sequence_id", "decision_id",
            "policy_revision", "reason")  # fmt: skip
    _emit(rows, cols, "denials", fmt)


@audit_group.command("decisions")
@click.option("--policy-revision", required=True, help="Policy bundle revision.")
@_output_options
def decisions_cmd(policy_revision: str, url: str | None, fmt: str, allow_empty: bool) -> None:
    """Every event decided under one policy bundle revision."""
    rows = _query(url, lambda q: q.decisions(policy_revision), allow_empty)
    cols = ("time", "type", "tenant", "requester_tenant", "sequence_id", "decision_id")
    _emit(rows, cols, f"decisions under {policy_revision}", fmt)


@audit_group.command("events")
@click.option("--type", "type_", default=None, help="Event type.")
@click.option("--tenant", default=None, help="Owner tenant.")
@_since
@_until
@click.option("--limit", type=int, default=None, help="At most this many events.")
@click.option(
    "--count-by",
    type=click.Choice(["type", "tenant", "requester_tenant", "stream", "policy_revision"]),
    default=None,
    help="Print counts grouped by this column instead of events.",
)
@_output_options
def events_cmd(
    type_: str | None,
    tenant: str | None,
    since: datetime | None,
    until: datetime | None,
    limit: int | None,
    count_by: str | None,
    url: str | None,
    fmt: str,
    allow_empty: bool,
) -> None:
    """Any events, filtered by type / tenant / time; or counts with --count-by."""
    if count_by is not None:
        counts = _query(url, lambda q: q.counts(count_by, tenant), allow_empty)
        ordered = sorted(counts.items())
        if fmt == "json":
            click.echo(json.dumps(counts, indent=2, sort_keys=True))
        else:
            emit_records(
                fmt,
                [{count_by: k, "count": n} for k, n in ordered],
                f"events by {count_by}",
                (count_by, "count"),
                lambda i: (ordered[i][0], str(ordered[i][1])),
            )
        return
    rows = _query(url, lambda q: q.events(type_, tenant, since, until, limit), allow_empty)
    cols = ("time", "event_id", "type", "tenant", "requester_tenant", "sequence_id",
            "blocks", "token_count", "decision_id")  # fmt: skip
    _emit(rows, cols, "events", fmt)


@audit_group.command("export")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["jsonl", "json", "csv", "opa-decision-log"]),
    default="jsonl",
    show_default=True,
    help="jsonl (one object a line), json (one array), csv: every event; "
    "opa-decision-log: the policy decisions, one OPA decision-log JSON object per line "
    "(see kvgov.audit.export).",
)
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), default=None)
@_url_option
@allow_empty_option
def export_cmd(fmt: str, output: Path | None, url: str | None, allow_empty: bool) -> None:
    """Export every event (never tokens or text: none are stored), or the decisions."""

    def write(q: AuditQueries, out: TextIO) -> int:
        if fmt == "opa-decision-log":
            return write_decision_log(out, decision_log(q))
        return q.export(out, fmt)

    def export(q: AuditQueries) -> int:
        if output is None:
            return write(q, sys.stdout)
        with output.open("w", encoding="utf-8", newline="") as f:
            return write(q, f)

    n = _query(url, export, allow_empty)
    click.echo(f"exported {n} {'decisions' if fmt == 'opa-decision-log' else 'events'}", err=True)


@audit_group.command("checkpoints")
@click.option("--stream", default=None, help="All checkpoints of this stream.")
@_output_options
def checkpoints_cmd(stream: str | None, url: str | None, fmt: str, allow_empty: bool) -> None:
    """The latest signed checkpoint per stream: keep a copy outside the database."""
    cps = _query(url, lambda q: q.checkpoints(stream), allow_empty)
    columns = ("stream", "seq", "chain_hash", "key_id", "time")
    dicts = [c.to_dict() for c in cps]
    emit_records(
        fmt, dicts, "checkpoints", columns, lambda i: [str(dicts[i][c]) for c in columns],
        csv_fields=(*columns, "signature"),
        csv_row=lambda i: [dicts[i][c] for c in (*columns, "signature")],
    )  # fmt: skip


@audit_group.command("keygen")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--force",
    is_flag=True,
    help="Replace existing key files (keep the old .pub to verify what the old key signed).",
)
def keygen_cmd(path: Path, force: bool) -> None:
    """Generate an Ed25519 checkpoint key: PATH and PATH.pub (mode 0600).

    Missing folders are created with mode 0700; an existing key file is never
    overwritten without --force.
    """
    files = generate_key_files(path, force=force)
    click.echo(f"private key: {files.private}\npublic key:  {files.public}\nkey id: {files.key_id}")
