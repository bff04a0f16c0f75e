"""``kvgov audit ...`` (verification, compliance queries, spool status) and ``kvgov db ...``.

Every command takes ``--url`` (default: ``$KVGOV_AUDIT_URL``, else
``kvgov.defaults.AUDIT_URL``). Query commands print a rich table, or ``--json`` (a
JSON array) or ``--csv``. Errors are one line saying what to do, and the exit status
says what kind of failure it is (:mod:`kvgov.audit.cli_errors`): 1 evidence (``verify``
found tampering), 2 usage, 3 environment (the database is unreachable, lacks the
schema or a permission).
"""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO, TypeVar

import click
from rich.console import Console
from rich.table import Table

from kvgov.audit.cli_common import default_url, url_option
from kvgov.audit.cli_errors import EXIT_EVIDENCE, ErrorsToExitCodes
from kvgov.audit.cli_ops import quarantine_group, status_cmd, streams_cmd
from kvgov.audit.expect import load_expected_streams
from kvgov.audit.export import decision_log, write_decision_log
from kvgov.audit.queries import RECORD_FIELDS, AuditQueries, AuditRecord
from kvgov.audit.signing import generate_key_files, key_id, load_public_key
from kvgov.audit.store import current_revision, downgrade, head_revision, mask_url, upgrade
from kvgov.audit.verify import VerifyReport, verify
from kvgov.defaults import VERIFY_MAX_UNSIGNED_EVENTS, VERIFY_MAX_UNSIGNED_SECONDS

__all__ = ["audit_group", "db_group"]

_T = TypeVar("_T")


_default_url = default_url
_url_option = url_option


def _output_options(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option("--csv", "as_csv", is_flag=True, help="Print CSV.")(f)
    f = click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")(f)
    return _url_option(f)


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


def _emit(
    records: Sequence[AuditRecord],
    columns: Sequence[str],
    title: str,
    as_json: bool,
    as_csv: bool,
) -> None:
    if as_json:
        click.echo(json.dumps([r.to_dict() for r in records], indent=2, sort_keys=False))
        return
    if as_csv:
        w = csv.writer(sys.stdout)
        w.writerow(RECORD_FIELDS)
        w.writerows(r.csv_row() for r in records)
        return
    table = Table(title=f"{title} ({len(records)})")
    for c in columns:
        table.add_column(c)
    for r in records:
        d = r.to_dict()
        cells = []
        for c in columns:
            if c == "blocks":
                v: Any = len(r.block_ids)
            elif c in d:
                v = d[c]
            else:
                v = r.details.get(c)
            if isinstance(v, (dict, list)):
                v = json.dumps(v, sort_keys=True)
            cells.append("" if v is None else str(v))
        table.add_row(*cells)
    Console().print(table)


def _query(url: str | None, ask: Callable[[AuditQueries], _T]) -> _T:
    """Ask the queries on ``url`` (or the default)."""
    with AuditQueries(url or _default_url()) as q:
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
def verify_cmd(
    url: str | None,
    public_keys: tuple[Path, ...],
    require_checkpoints: bool,
    max_unsigned_events: int,
    max_unsigned_seconds: float,
    expect_streams: Path | None,
    as_json: bool,
    no_progress: bool,
) -> None:
    """Recompute every hash chain and check every signed checkpoint (exit 1 on failure)."""
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
    console = Console()
    table = Table(title=f"audit verification: {report.events} events")
    for c in ("stream", "events", "last seq", "checkpoints", "status", "first bad event"):
        table.add_column(c)
    for s in report.streams:
        fb = s.first_bad
        table.add_row(
            s.stream,
            str(s.events),
            str(s.last_seq),
            str(s.checkpoints),
            "[green]ok[/]" if s.ok else "[red]FAILED[/]",
            "" if fb is None else f"seq {fb.seq}: {fb.kind}: {fb.message}",
        )
    console.print(table)
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
    as_json: bool,
    as_csv: bool,
) -> None:
    """Every reuse of TENANT's cached blocks: by which tenant, under which decision."""
    rows = _query(url, lambda q: q.reuse(tenant, since, until))
    cols = ("time", "type", "tenant", "requester_tenant", "sequence_id", "blocks",
            "reused_tokens", "decision_id", "policy_revision")  # fmt: skip
    _emit(rows, cols, f"reuse of {tenant}'s blocks", as_json, as_csv)


@audit_group.command("erasure")
@click.option("--tenant", required=True, help="The erased tenant.")
@_output_options
def erasure_cmd(tenant: str, url: str | None, as_json: bool, as_csv: bool) -> None:
    """The erasure evidence of TENANT: when, blocks, bytes zeroized, verification."""
    rows = _query(url, lambda q: q.erasure(tenant))
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r.details if k not in keys]
    _emit(rows, ("time", "event_id", "blocks", *keys), f"erasure of {tenant}", as_json, as_csv)


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
    as_json: bool,
    as_csv: bool,
) -> None:
    """Policy denials, share denials and policy errors (which fail closed)."""
    rows = _query(url, lambda q: q.denials(tenant, since, until))
    cols = ("time", "type", "tenant", "requester_tenant", "sequence_id", "decision_id",
            "policy_revision", "reason")  # fmt: skip
    _emit(rows, cols, "denials", as_json, as_csv)


@audit_group.command("decisions")
@click.option("--policy-revision", required=True, help="Policy bundle revision.")
@_output_options
def decisions_cmd(policy_revision: str, url: str | None, as_json: bool, as_csv: bool) -> None:
    """Every event decided under one policy bundle revision."""
    rows = _query(url, lambda q: q.decisions(policy_revision))
    cols = ("time", "type", "tenant", "requester_tenant", "sequence_id", "decision_id")
    _emit(rows, cols, f"decisions under {policy_revision}", as_json, as_csv)


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
    as_json: bool,
    as_csv: bool,
) -> None:
    """Any events, filtered by type / tenant / time; or counts with --count-by."""
    if count_by is not None:
        counts = _query(url, lambda q: q.counts(count_by, tenant))
        if as_json:
            click.echo(json.dumps(counts, indent=2, sort_keys=True))
        elif as_csv:
            w = csv.writer(sys.stdout)
            w.writerow([count_by, "count"])
            w.writerows(sorted(counts.items()))
        else:
            table = Table(title=f"events by {count_by}")
            table.add_column(count_by)
            table.add_column("count", justify="right")
            for k, n in sorted(counts.items()):
                table.add_row(k, str(n))
            Console().print(table)
        return
    rows = _query(url, lambda q: q.events(type_, tenant, since, until, limit))
    cols = ("time", "event_id", "type", "tenant", "requester_tenant", "sequence_id",
            "blocks", "token_count", "decision_id")  # fmt: skip
    _emit(rows, cols, "events", as_json, as_csv)


@audit_group.command("export")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["jsonl", "csv", "opa-decision-log"]),
    default="jsonl",
    help="jsonl, csv: every event; opa-decision-log: the policy decisions, one OPA "
    "decision-log JSON object per line (see kvgov.audit.export).",
)
@click.option("--output", type=click.Path(dir_okay=False, path_type=Path), default=None)
@_url_option
def export_cmd(fmt: str, output: Path | None, url: str | None) -> None:
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

    n = _query(url, export)
    click.echo(f"exported {n} {'decisions' if fmt == 'opa-decision-log' else 'events'}", err=True)


@audit_group.command("checkpoints")
@click.option("--stream", default=None, help="All checkpoints of this stream.")
@click.option("--json", "as_json", is_flag=True, help="Print a JSON array.")
@_url_option
def checkpoints_cmd(stream: str | None, as_json: bool, url: str | None) -> None:
    """The latest signed checkpoint per stream: keep a copy outside the database."""
    cps = _query(url, lambda q: q.checkpoints(stream))
    if as_json:
        click.echo(json.dumps([c.to_dict() for c in cps], indent=2))
        return
    table = Table(title="checkpoints")
    for c in ("stream", "seq", "chain hash", "key id", "time"):
        table.add_column(c)
    for cp in cps:
        table.add_row(cp.stream, str(cp.seq), cp.chain_hash, cp.key_id, cp.time.isoformat())
    Console().print(table)


@audit_group.command("keygen")
@click.argument("path", type=click.Path(dir_okay=False, path_type=Path))
def keygen_cmd(path: Path) -> None:
    """Generate an Ed25519 checkpoint key: PATH (0600) and PATH.pub."""
    files = generate_key_files(path)
    click.echo(f"private key: {files.private}\npublic key:  {files.public}\nkey id: {files.key_id}")


# --------------------------------------------------------------------------- db


@click.group("db", cls=ErrorsToExitCodes)
def db_group() -> None:
    """Manage the audit database schema (Alembic migrations)."""


def _db_url(url_arg: str | None, url_opt: str | None) -> str:
    return url_arg or url_opt or _default_url()


def _migrate(
    run: Callable[..., str], url_arg: str | None, url: str | None, revision: str, sql: bool
) -> None:
    """Run ``upgrade`` or ``downgrade``; print the SQL (offline) or the revision reached."""
    target = _db_url(url_arg, url)
    out = run(target, revision, sql=sql)
    if sql:
        click.echo(out)
    else:
        click.echo(f"{mask_url(target)} is at {current_revision(target) or 'base'}")


@db_group.command("upgrade")
@click.argument("url_arg", metavar="[URL]", required=False)
@_url_option
@click.option("--revision", default="head", show_default=True)
@click.option("--sql", is_flag=True, help="Print the SQL instead of running it (offline).")
def upgrade_cmd(url_arg: str | None, url: str | None, revision: str, sql: bool) -> None:
    """Upgrade the audit schema to the head revision."""
    _migrate(upgrade, url_arg, url, revision, sql)


@db_group.command("downgrade")
@click.argument("url_arg", metavar="[URL]", required=False)
@_url_option
@click.option("--revision", default="-1", show_default=True, help="Target; base drops all.")
@click.option("--sql", is_flag=True, help="Print the SQL (needs --revision FROM:TO).")
def downgrade_cmd(url_arg: str | None, url: str | None, revision: str, sql: bool) -> None:
    """Downgrade the audit schema (downgrading to base deletes the audit trail)."""
    _migrate(downgrade, url_arg, url, revision, sql)


@db_group.command("current")
@click.argument("url_arg", metavar="[URL]", required=False)
@_url_option
def current_cmd(url_arg: str | None, url: str | None) -> None:
    """Print the database's schema revision and the one this kvgov needs."""
    target = _db_url(url_arg, url)
    cur = current_revision(target)
    head = head_revision()
    state = "up to date" if cur == head else "run `kvgov db upgrade`"
    click.echo(f"{mask_url(target)}: current {cur or 'none'}, head {head} ({state})")
