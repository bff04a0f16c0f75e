"""``kvgov audit status``, ``kvgov audit quarantine list|replay`` and ``kvgov audit streams``.

``status`` and ``quarantine`` read the files a writer keeps next to its spool on this
host (:mod:`kvgov.audit.status`); run them where the workers run. ``streams`` signs
the list of streams an auditor expects (:mod:`kvgov.audit.expect`).
"""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.text import Text

from kvgov.audit.durability import marker_path
from kvgov.audit.expect import ExpectedStream, sign_expected_streams
from kvgov.audit.signing import load_public_key, load_signing_key
from kvgov.audit.spool import QuarantinedRecord, quarantine_path
from kvgov.audit.status import (
    StreamFiles,
    default_spool_dir,
    find_stream_files,
    replay_quarantine,
)
from kvgov.audit.store import mask_url, require_database
from kvgov.audit.verify import verify
from kvgov.cli.common import (
    Cell,
    allow_empty_option,
    default_url,
    emit_records,
    format_options,
    url_option,
)
from kvgov.cli.errors import EXIT_ENVIRONMENT, EXIT_EVIDENCE, CommandError
from kvgov.exceptions import AuditTrailEmpty, SigningKeyError

__all__ = ["quarantine_group", "status_cmd", "streams_cmd"]


def _when(us: int) -> str:
    return datetime.fromtimestamp(us / 1_000_000, tz=UTC).isoformat(timespec="seconds")


_spool_dir_option = click.option(
    "--spool-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Directory of the writers' spools [default: next to a SQLite database, "
    "else the working directory].",
)
_spool_option = click.option(
    "--spool",
    "spools",
    multiple=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="A spool file named otherwise (AuditLog spool_path=); repeatable.",
)


def _find(url: str | None, spool_dir: Path | None, spools: tuple[Path, ...]) -> list[StreamFiles]:
    """The stream files to report on; a directory or spool that is not there is an error
    (a mistyped path must not read as "nothing waits")."""
    target = url or default_url()
    if spool_dir is None and not spools:
        require_database(target)  # spools live next to it: a wrong path finds nothing
    directory = spool_dir if spool_dir is not None else default_spool_dir(target)
    if not directory.is_dir():
        raise CommandError.of(
            f"no spool directory {directory}; check --spool-dir, or the path of the "
            "SQLite database in the URL (spools are next to it)",
            EXIT_ENVIRONMENT,
        )
    missing = [
        str(p)
        for p in spools
        if not any(f.is_file() for f in (p, quarantine_path(p), marker_path(p)))
    ]
    if missing:
        raise CommandError.of(
            f"no spool file {', '.join(missing)}; check --spool", EXIT_ENVIRONMENT
        )
    return find_stream_files(directory, spools)


def _quarantined_json(q: QuarantinedRecord) -> dict[str, Any]:
    return {
        "kind": q.kind,
        "stream": q.stream,
        "seq": q.seq,
        "event_type": q.event_type,
        "refused": q.refused,
        "quarantined": _when(q.quarantined_us),
    }


def _status_json(f: StreamFiles) -> dict[str, Any]:
    m = f.marker
    return {
        "spool": str(f.base),
        "streams": list(f.streams),
        "spooled_events": f.spooled_events,
        "spooled_seqs": list(f.spooled_seqs) if f.spooled_seqs else None,
        "critical_spooled": [
            {"event_id": c.event_id, "type": c.type, "tenant": c.tenant, "time": _when(c.time_us)}
            for c in f.critical
        ],
        "quarantined": [_quarantined_json(q) for q in f.quarantined],
        "damaged_lines": f.damaged_lines,
        "writer": None
        if m is None
        else {
            "host": m.host,
            "pid": m.pid,
            "started": _when(m.started_us),
            "alive": f.marker_process_alive,
        },
    }


@click.command("status")
@url_option
@_spool_dir_option
@_spool_option
@format_options
def status_cmd(url: str | None, spool_dir: Path | None, spools: tuple[Path, ...], fmt: str) -> None:
    """What waits on this host: spooled events, critical ones listed (erasures whose
    evidence is only spooled), quarantined records, writers that died."""
    found = _find(url, spool_dir, spools)

    def cells(i: int) -> list[Cell]:
        f = found[i]
        m = f.marker
        writer = "" if m is None else f"pid {m.pid}"
        if m is not None and f.marker_process_alive is False:
            writer += " [red](died: events may be lost)[/]"
        return [
            str(f.base),
            ", ".join(f.streams),
            str(f.spooled_events),
            str(len(f.critical)),
            str(len(f.quarantined) + f.damaged_lines),
            Text.from_markup(writer),
        ]

    columns = ("spool", "stream", "spooled", "critical spooled", "quarantined", "writer")
    emit_records(
        fmt, [_status_json(f) for f in found], f"audit spools ({len(found)})", columns, cells
    )
    if fmt != "text":
        return
    # notes: on the terminal under the table; in a pipe on stderr, off the parsed lines
    console = Console(stderr=not sys.stdout.isatty(), soft_wrap=True)
    critical = [c for f in found for c in f.critical]
    if critical:
        console.print("[yellow]critical events whose evidence is only spooled:[/]")
        for c in critical:
            console.print(
                f"  {c.event_id}  {c.type}  tenant={c.tenant}  {_when(c.time_us)}", markup=False
            )
    if any(f.quarantined or f.damaged_lines for f in found):
        console.print(
            "[red]records the database refused are quarantined:[/] see `kvgov audit "
            "quarantine list`; fix the cause, then `kvgov audit quarantine replay`"
        )


@click.group("quarantine")
def quarantine_group() -> None:
    """Records the audit database refused, kept on this host: list them, replay them."""


@quarantine_group.command("list")
@url_option
@_spool_dir_option
@_spool_option
@format_options
def quarantine_list_cmd(
    url: str | None, spool_dir: Path | None, spools: tuple[Path, ...], fmt: str
) -> None:
    """Every quarantined record not yet replayed, with the database's reason."""
    items = [q for f in _find(url, spool_dir, spools) for q in f.quarantined]
    columns = ("stream", "seq", "kind", "type", "quarantined", "refused because")
    emit_records(
        fmt,
        [_quarantined_json(q) for q in items],
        f"quarantined records ({len(items)})",
        columns,
        lambda i: [
            items[i].stream,
            str(items[i].seq),
            items[i].kind,
            items[i].event_type or "",
            _when(items[i].quarantined_us),
            items[i].refused,
        ],
    )


@quarantine_group.command("replay")
@url_option
@_spool_dir_option
@_spool_option
def quarantine_replay_cmd(
    url: str | None, spool_dir: Path | None, spools: tuple[Path, ...]
) -> None:
    """Store quarantined records again after their cause was fixed (exit 1 if any remain)."""
    target = url or default_url()
    require_database(target)
    files = [quarantine_path(f.base) for f in _find(url, spool_dir, spools) if f.quarantined]
    results = replay_quarantine(target, files, round(time.time() * 1_000_000))
    left = 0
    for r in results:
        left += len(r.refused)
        click.echo(f"{r.path}: {len(r.stored)} stored, {len(r.refused)} still quarantined")
        for q in r.refused[:10]:
            click.echo(f"  {q.stream}:{q.seq} ({q.kind}): {q.refused}")
    if left:
        raise CommandError.of(
            f"{left} record(s) are still refused; the store is missing them until the cause "
            "is fixed (see `kvgov audit quarantine list`)",
            EXIT_EVIDENCE,
        )


@click.command("streams")
@url_option
@click.option(
    "--key",
    "key_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="The auditor's Ed25519 private key (`kvgov audit keygen`), not the writers' key.",
)
@click.option(
    "--public-key",
    "public_keys",
    multiple=True,
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Trusted checkpoint public key for the verification run first; repeatable.",
)
@click.option(
    "--output", type=click.Path(dir_okay=False, path_type=Path), default=None, help="File."
)
@allow_empty_option
def streams_cmd(
    url: str | None,
    key_path: Path,
    public_keys: tuple[Path, ...],
    output: Path | None,
    allow_empty: bool,
) -> None:
    """Verify the database, then sign the list of its streams and their heads.

    Keep the list where the database's users cannot write, and pass it to
    `kvgov audit verify --expect-streams` with the key's public half.
    """
    key = load_signing_key(key_path)
    if key is None:  # pragma: no cover - a path always loads or raises
        raise SigningKeyError(f"no key at {key_path}")
    keys = [load_public_key(p) for p in public_keys] if public_keys else None
    report = verify(url or default_url(), keys)
    if report.events == 0 and not allow_empty:
        raise AuditTrailEmpty(mask_url(url or default_url()))
    if not report.ok:
        raise CommandError.of(
            "the database does not verify; investigate (`kvgov audit verify`) before "
            "signing a list of its streams",
            EXIT_EVIDENCE,
        )
    streams = [ExpectedStream(s.stream, s.last_seq, s.head_hash) for s in report.streams]
    text = sign_expected_streams(streams, key, round(time.time() * 1_000_000))
    if output is None:
        click.echo(text, nl=False)
    else:
        output.write_text(text, encoding="utf-8")
        click.echo(f"signed {len(streams)} stream(s) with key {key.key_id}: {output}", err=True)
