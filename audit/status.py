"""What waits on this host's disk: spooled events, quarantined records, run markers.

``kvgov audit status`` and ``kvgov audit quarantine`` read the files writers keep next
to their spool (see :mod:`kvgov.audit.spool` and :mod:`kvgov.audit.durability`)::

    <name>.spool.jsonl       events waiting for the database (replayed by the writer)
    <name>.quarantine.jsonl  records the database refused (replayed by an operator)
    <name>.run.json          a writer has (or had, if it died) the stream open

A spooled *critical* event (an erasure, a denial) is evidence that exists only on
this host until the spool is replayed: status lists each one.
"""

from __future__ import annotations

import os
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from sqlalchemy.engine import URL

from kvgov.audit.durability import RunMarker, marker_path
from kvgov.audit.events import CRITICAL_EVENT_TYPES
from kvgov.audit.models import EVENT_INSERT_COLUMNS
from kvgov.audit.persist import Record, store_records
from kvgov.audit.spool import Quarantine, QuarantinedRecord, Spool, quarantine_path
from kvgov.audit.store import normalize_url, open_engine

__all__ = [
    "QuarantineReplay",
    "SpooledEvent",
    "StreamFiles",
    "default_spool_dir",
    "find_stream_files",
    "replay_quarantine",
]

_SUFFIXES: Final = (".spool.jsonl", ".quarantine.jsonl", ".run.json")
_TENANT: Final = EVENT_INSERT_COLUMNS.index("tenant")
_TYPE: Final = EVENT_INSERT_COLUMNS.index("type")
_TIME: Final = EVENT_INSERT_COLUMNS.index("time_us")


@dataclass(frozen=True, slots=True)
class SpooledEvent:
    """A critical event whose evidence is only in a spool file.

    Attributes:
        event_id: ``"<stream>:<seq>"``.
        type: the event type.
        tenant: the tenant, if any.
        time_us: when it was recorded (microseconds since the epoch, UTC).
    """

    event_id: str
    type: str
    tenant: str | None
    time_us: int


@dataclass(frozen=True, slots=True)
class StreamFiles:
    """One stream's files on this host, and what they hold.

    Attributes:
        base: the spool path the files derive from.
        streams: the stream ids found in them.
        spooled_events: events waiting in the spool.
        spooled_seqs: (first, last) spooled ``seq``, or None.
        critical: spooled critical events (evidence only on this host).
        quarantined: outstanding quarantined records.
        damaged_lines: spool lines that do not parse (a replay moves them to quarantine).
        marker: the run marker, when a writer has the stream open or died with it open.
        marker_process_alive: whether the marker's process still runs on this host
            (None when the marker names another host or no process).
    """

    base: Path
    streams: tuple[str, ...]
    spooled_events: int
    spooled_seqs: tuple[int, int] | None
    critical: tuple[SpooledEvent, ...]
    quarantined: tuple[QuarantinedRecord, ...]
    damaged_lines: int
    marker: RunMarker | None
    marker_process_alive: bool | None = field(default=None)


def default_spool_dir(url: str | URL) -> Path:
    """Where writers put spools by default: next to a SQLite file, else the working directory.

    Args:
        url: the audit database URL.

    Returns:
        The directory.
    """
    u = normalize_url(url)
    if u.get_backend_name() == "sqlite" and u.database not in (None, "", ":memory:"):
        return Path(str(u.database)).parent
    return Path.cwd()


def _base_of(path: Path) -> Path | None:
    for suffix in _SUFFIXES:
        if path.name.endswith(suffix):
            return path.with_name(path.name[: -len(suffix)] + ".spool.jsonl")
    return None


def _alive(marker: RunMarker) -> bool | None:
    if not marker.pid or marker.host != socket.gethostname():
        return None
    try:
        os.kill(marker.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stream_files(base: Path) -> StreamFiles:
    contents = Spool(base).read()
    quarantined = tuple(Quarantine(quarantine_path(base)).outstanding())
    marker = RunMarker.read(marker_path(base))
    streams = {str(r[0]) for r in contents.events} | {q.stream for q in quarantined}
    if marker is not None and marker.stream:
        streams.add(marker.stream)
    seqs = [int(r[1]) for r in contents.events]
    critical = tuple(
        SpooledEvent(f"{r[0]}:{r[1]}", str(r[_TYPE]), r[_TENANT], int(r[_TIME]))
        for r in contents.events
        if r[_TYPE] in CRITICAL_EVENT_TYPES
    )
    return StreamFiles(
        base=base,
        streams=tuple(sorted(streams)),
        spooled_events=len(contents.events),
        spooled_seqs=(min(seqs), max(seqs)) if seqs else None,
        critical=critical,
        quarantined=quarantined,
        damaged_lines=len(contents.damaged),
        marker=marker,
        marker_process_alive=_alive(marker) if marker is not None else None,
    )


def find_stream_files(
    directory: Path | None = None, spools: Sequence[Path] = ()
) -> list[StreamFiles]:
    """Find and read the spool, quarantine and marker files of every stream.

    Args:
        directory: a directory to scan for ``*.spool.jsonl``, ``*.quarantine.jsonl``
            and ``*.run.json`` files.
        spools: spool paths given explicitly (any name; their quarantine and marker
            are found next to them).

    Returns:
        One entry per spool base, sorted by path.
    """
    # one entry per file however it was named (a spool given by its absolute path and
    # found again in the scanned directory is one stream), as it was first named
    bases = {path.absolute(): path for path in spools}
    if directory is not None and directory.is_dir():
        for entry in directory.iterdir():
            base = _base_of(entry)
            if base is not None:
                bases.setdefault(base.absolute(), base)
    return [_stream_files(b) for b in sorted(bases.values())]


@dataclass(frozen=True, slots=True)
class QuarantineReplay:
    """What ``kvgov audit quarantine replay`` did with one quarantine file.

    Attributes:
        path: the quarantine file.
        stored: records now in the database (resolved in the file).
        refused: records the database still refuses, with its reason.
    """

    path: Path
    stored: tuple[QuarantinedRecord, ...]
    refused: tuple[QuarantinedRecord, ...]


def replay_quarantine(
    url: str | URL, quarantines: Iterable[Path], now_us: int
) -> list[QuarantineReplay]:
    """Try every outstanding quarantined record again (after the cause was fixed).

    A record the database already holds, byte for byte, counts as stored. Records it
    still refuses stay quarantined; damaged spool lines cannot be replayed and stay.

    Args:
        url: the audit database URL.
        quarantines: quarantine files.
        now_us: the time to stamp ``resolved`` lines with.

    Returns:
        One result per file.

    Raises:
        Exception: the database is unreachable (nothing is resolved).
    """
    engine = open_engine(url, auto_upgrade=False)
    results = []
    try:
        for path in quarantines:
            q = Quarantine(path)
            items = [i for i in q.outstanding() if i.kind != "damaged"]
            refused_ids: set[int] = set()
            for stream in sorted({i.stream for i in items}):
                mine = [i for i in items if i.stream == stream]
                records: list[Record] = [i.record for i in mine]
                refused_ids |= {id(r.record) for r in store_records(engine, stream, None, records)}
            stored = tuple(i for i in items if id(i.record) not in refused_ids)
            q.resolve(stored, now_us)
            left = tuple(i for i in q.outstanding())
            results.append(QuarantineReplay(path, stored, left))
    finally:
        engine.dispose()
    return results
