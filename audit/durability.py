"""Where an event's evidence is: :class:`Recorded`, :class:`AuditStats`, and the run marker.

``AuditLog.record_durable`` returns a :class:`Recorded` that says whether the event
is in the audit database (``evidence == "stored"``) or only on this host's disk, in
the spool (or, if the database refused it, the quarantine) (``"spooled"``), because
the database did not answer within the critical-event deadline or is down. A caller
that reports an act (an erasure) puts ``evidence`` in its report; ``kvgov audit
status`` lists spooled critical events until they are replayed.

The **run marker** (``<name>.run.json`` next to the spool) exists while an
``AuditLog`` of that stream is open and is removed by a clean ``close()``. A writer
that finds one at start knows the previous writer of the stream stopped without
closing (``kill -9``, a crash, a power cut) and may have lost events it had only in
memory, and records an ``audit_gap`` event naming the last sequence number that
reached the store.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import secrets
import socket
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from kvgov.audit.events import AuditEvent, EventType
from kvgov.exceptions import InvalidAuditEvent

if TYPE_CHECKING:
    from kvgov.audit.persist import Refusal

__all__ = [
    "AuditStats",
    "Evidence",
    "Recorded",
    "RunMarker",
    "derive_stream_id",
    "gap_event",
    "marker_path",
    "positive_seconds",
    "quarantine_gap_event",
]

#: Where an event's evidence is: in the database, or only on this host's disk.
Evidence = Literal["stored", "spooled"]


@dataclass(frozen=True, slots=True)
class Recorded:
    """What :meth:`kvgov.audit.AuditLog.record_durable` achieved for one event.

    Attributes:
        event_id: the event id, ``"<stream>:<seq>"``.
        evidence: ``"stored"`` when the event is in the audit database when the call
            returns; ``"spooled"`` when it is only in the local spool (or quarantine)
            file, fsync-ed, to be replayed into the database when it answers again.
        reason: why it is only spooled (None when stored).
    """

    event_id: str
    evidence: Evidence
    reason: str | None = None

    @property
    def stored(self) -> bool:
        """Whether the event is in the database."""
        return self.evidence == "stored"


@dataclass(frozen=True, slots=True)
class Deferred:
    """An event appended to the chain whose durability the caller has not waited for.

    Attributes:
        event_id: the event id, ``"<stream>:<seq>"``.
        wait: blocks until the event is durable (at most the log's critical deadline)
            and returns its :class:`Recorded`; raises ``AuditUnavailable`` if neither
            the database nor the spool can be written.
    """

    event_id: str
    wait: Callable[[], Recorded]


@dataclass(frozen=True, slots=True)
class AuditStats:
    """A snapshot of one ``AuditLog``'s write state, for metrics and ``status``.

    Attributes:
        stream: the stream id.
        recorded: the highest sequence number handed out so far.
        stored_seq: every event up to this ``seq`` is in the database (or quarantined).
        durable_seq: every event up to this ``seq`` is in the database or on disk.
        spooled: events in the spool file waiting for the database.
        spooled_total: events written to the spool since this log started.
        quarantined: records the database refused, kept in the quarantine file, since
            this log started.
        damaged_lines: spool lines that did not parse, moved to the quarantine.
        critical_spooled: ids of critical events whose evidence is only spooled.
        database_error: the last database error, while the database is failing.
        unavailable: why neither database nor spool can be written, or None.
        queue_depth: events waiting in the writer's queue (not yet in a batch).
        spool_bytes: the size of the spool file in bytes (0 when there is none).
    """

    stream: str
    recorded: int
    stored_seq: int
    durable_seq: int
    spooled: int
    spooled_total: int
    quarantined: int
    damaged_lines: int
    critical_spooled: tuple[str, ...]
    database_error: str | None
    unavailable: str | None
    queue_depth: int = 0
    spool_bytes: int = 0

    @property
    def in_memory(self) -> int:
        """Events recorded but neither stored nor spooled: what ``kill -9`` would lose."""
        return max(0, self.recorded - self.durable_seq)


def positive_seconds(name: str, value: float) -> float:
    """Check a duration argument of ``AuditLog``.

    Args:
        name: the argument.
        value: its value.

    Returns:
        The value as a float.

    Raises:
        InvalidAuditEvent: it is not a finite number above zero (naming the argument).
    """
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise InvalidAuditEvent(name, f"must be a positive number of seconds, got {value!r}")
    if not math.isfinite(value):
        raise InvalidAuditEvent(name, f"must be finite, got {value!r}")
    return float(value)


def derive_stream_id() -> str:
    """A stream id for a writer given none: ``<hostname>-<pid>-<8 hex>``.

    Returns:
        The id (unique per process start, so a restart is a new stream).
    """
    host = socket.gethostname() or "host"
    return f"{host[:64]}-{os.getpid()}-{secrets.token_hex(4)}"


def marker_path(spool_path: Path) -> Path:
    """Where the run marker of a spool lives: ``x.spool.jsonl`` -> ``x.run.json``.

    Args:
        spool_path: the spool file.

    Returns:
        The marker file next to it.
    """
    name = spool_path.name
    if name.endswith(".spool.jsonl"):
        return spool_path.with_name(name[: -len(".spool.jsonl")] + ".run.json")
    return spool_path.with_name(name + ".run.json")


@dataclass(frozen=True, slots=True)
class RunMarker:
    """The run marker's content: who has (or had) the stream open.

    Attributes:
        stream: the stream id.
        database: the audit database (URL, password hidden): a marker left for one
            database says nothing about another.
        host: the host name.
        pid: the process id.
        started_us: when the writer started (microseconds since the epoch, UTC).
    """

    stream: str
    database: str
    host: str
    pid: int
    started_us: int

    @classmethod
    def read(cls, path: Path) -> RunMarker | None:
        """Read a marker; one that does not parse (cut short) counts, with unknown fields.

        Args:
            path: the marker file.

        Returns:
            The marker, or None when there is none (or its directory cannot be read,
            and then the writer cannot leave one either).
        """
        try:
            text = path.read_text(encoding="utf-8")
        except OSError:
            return None
        try:
            d: dict[str, Any] = json.loads(text)
            return cls(
                str(d["stream"]), str(d["database"]), str(d["host"]), int(d["pid"]),
                int(d["started_us"]),
            )  # fmt: skip
        except (ValueError, KeyError, TypeError):
            return cls("", "", "", 0, 0)  # a marker cut short by the crash it records

    @classmethod
    def now(cls, stream: str, database: str, started_us: int) -> RunMarker:
        """The marker of this process.

        Args:
            stream: the stream id.
            database: the audit database, password hidden.
            started_us: the start time.

        Returns:
            The marker.
        """
        return cls(stream, database, socket.gethostname(), os.getpid(), started_us)

    def write(self, path: Path) -> None:
        """Write the marker (fsync-ed), replacing any old one.

        Args:
            path: the marker file.

        Raises:
            OSError: it cannot be written.
        """
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        data = json.dumps(
            {"stream": self.stream, "database": self.database, "host": self.host,
             "pid": self.pid, "started_us": self.started_us}
        ).encode()  # fmt: skip
        # a fresh file, never one planted in a shared folder: a symlink left at ``tmp``
        # is removed (not followed), and O_EXCL fails if one reappears before the open
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)


def gap_event(previous: RunMarker, last_stored_seq: int) -> AuditEvent:
    """The ``audit_gap`` event a writer records when it finds a run marker at start.

    Args:
        previous: the marker the previous writer left.
        last_stored_seq: the last ``seq`` of the stream in the database or its spool.

    Returns:
        The event.
    """
    return AuditEvent(
        EventType.AUDIT_GAP,
        details={
            "cause": "unclean_stop",
            "last_stored_seq": last_stored_seq,
            "previous_pid": previous.pid,
            "previous_host": previous.host,
            "previous_start_us": previous.started_us,
            "meaning": "the previous writer of this stream stopped without close(); "
            "events it recorded after last_stored_seq and held only in memory are lost",
        },
    )


def quarantine_gap_event(
    refusals: list[Refusal], damaged: int, quarantine: Path, breaks: Sequence[str] = ()
) -> AuditEvent:
    """The ``audit_gap`` event a writer records when it quarantines records.

    Args:
        refusals: the records the database refused, or whose spool seal failed.
        damaged: spool lines that did not parse, quarantined too.
        quarantine: the quarantine file.
        breaks: where a replayed spool lacks sealed batches or does not continue the
            chain (each a sentence).

    Returns:
        The event (``details``: ``cause`` ``"quarantined"``, or ``"spool_incomplete"``
        when nothing was quarantined but batches are missing; ``seqs`` of the refused
        events, at most 100, the number of ``records``, the first ``reason``, the
        ``quarantine`` file, and the ``spool_breaks``, at most 20, when there are some).
    """
    seqs = sorted(int(r.record[1]) for r in refusals if isinstance(r.record, tuple))
    if refusals:
        reason = refusals[0].reason
    else:
        reason = "spool line does not parse" if damaged else (breaks[0] if breaks else "")
    details: dict[str, Any] = {
        "cause": "quarantined" if refusals or damaged else "spool_incomplete",
        "seqs": seqs[:100],
        "records": len(refusals) + damaged,
        "reason": reason[:500],
        "quarantine": str(quarantine),
    }
    if breaks:
        details["spool_breaks"] = [b[:200] for b in breaks[:20]]
    try:
        return AuditEvent(EventType.AUDIT_GAP, details=details)
    except InvalidAuditEvent:  # a reason text the store could not hold
        return AuditEvent(EventType.AUDIT_GAP, details={**details, "reason": "unprintable"})
