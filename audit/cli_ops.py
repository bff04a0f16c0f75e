"""``kvgov audit status``, ``kvgov audit quarantine list|replay`` and ``kvgov audit streams``.

``status`` and ``quarantine`` read the files a writer keeps next to its spool on this
host (:mod:`kvgov.audit.status`); run them where the workers run. ``streams`` signs
the list of streams an auditor expects (:mod:`kvgov.audit.expect`).
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from kvgov.audit.cli_common import default_url, url_option
from kvgov.audit.cli_errors import EXIT_EVIDENCE, CommandError
from kvgov.audit.expect import ExpectedStream, sign_expected_streams
from kvgov.audit.signing import load_public_key, load_signing_key
from kvgov.audit.spool import QuarantinedRecord, quarantine_path
from kvgov.audit.status import (
    StreamFiles,
    default_spool_dir,
    find_stream_files,
    replay_quarantine,
)
from kvgov.audit.verify import verify
from kvgov.exceptions import SigningKeyError

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
    directory = spool_dir if spool_dir is not None else default_spool_dir(url or default_url())
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
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def status_cmd(
    url: str | None, spool_dir: Path | None, spools: tuple[Path, ...], as_json: bool
) -> None:
    """What waits on this host: spooled events, critical ones listed (erasures whose
    evidence is only spooled), quarantined records, writers that died."""
    found = _find(url, spool_dir, spools)
    if as_json:
        click.echo(json.dumps([_status_json(f) for f in found], indent=2))
        return
    console = Console()
    table = Table(title=f"audit spools ({len(found)})")
    for col in ("spool", "stream", "spooled", "critical spooled", "quarantined", "writer"):
        table.add_column(col)
    for f in found:
        m = f.marker
        writer = (
            ""
            if m is None
            else f"pid {m.pid}"
            + (" [red](died: events may be lost)[/]" if f.marker_process_alive is False else "")
        )
        table.add_row(
            str(f.base),
            ", ".join(f.streams),
            str(f.spooled_events),
            str(len(f.critical)),
            str(len(f.quarantined) + f.damaged_lines),
            writer,
        )
    console.print(table)
    critical = [c for f in found for c in f.critical]
    if critical:
        console.print("[yellow]critical events whose evidence is only spooled:[/]")
        for c in critical:
            console.print(f"  {c.event_id}  {c.type}  tenant={c.tenant}  {_when(c.time_us)}")
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
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def quarantine_list_cmd(
    url: str | None, spool_dir: Path | None, spools: tuple[Path, ...], as_json: bool
) -> None:
    """Every quarantined record not yet replayed, with the database's reason."""
    items = [q for f in _find(url, spool_dir, spools) for q in f.quarantined]
    if as_json:
        click.echo(json.dumps([_quarantined_json(q) for q in items], indent=2))
        return
    table = Table(title=f"quarantined records ({len(items)})")
    for col in ("stream", "seq", "kind", "type", "quarantined", "refused because"):
        table.add_column(col)
    for q in items:
        table.add_row(
            q.stream, str(q.seq), q.kind, q.event_type or "", _when(q.quarantined_us), q.refused
        )
    Console().print(table)


@quarantine_group.command("replay")
@url_option
@_spool_dir_option
@_spool_option
def quarantine_replay_cmd(
    url: str | None, spool_dir: Path | None, spools: tuple[Path, ...]
) -> None:
    """Store quarantined records again after their cause was fixed (exit 1 if any remain)."""
    target = url or default_url()
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
def streams_cmd(
    url: str | None, key_path: Path, public_keys: tuple[Path, ...], output: Path | None
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
