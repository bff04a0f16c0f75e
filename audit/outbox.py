"""Sealed records on their way to durability: pending, spooled, stored or quarantined.

An :class:`Outbox` holds one stream's sealed records that are not yet in the
database and knows where every record is::

    sealed --pending--> stored in the database        (stored_seq, durable_seq advance)
              |   \\---> refused by it: quarantine file (kept, counted, an audit_gap event)
              +-------> spool file (database down or too slow; replayed, then removed)

Every event up to ``durable_seq`` is in the database, the spool or the quarantine;
up to ``stored_seq`` in the database (or quarantined). It is not thread-safe: the
writer calls it under its ``cv`` and never holds ``cv`` during the database call
between :meth:`Outbox.snapshot` and :meth:`Outbox.stored`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

import structlog

from kvgov.audit.durability import AuditStats
from kvgov.audit.events import CRITICAL_EVENT_TYPES
from kvgov.audit.persist import Record, Refusal
from kvgov.audit.spool import (
    CheckpointRecord,
    EventRecord,
    KeyRecord,
    Quarantine,
    Spool,
    SpoolContents,
)
from kvgov.exceptions import AuditUnavailable

__all__ = ["Outbox", "Snapshot"]

_log = structlog.get_logger("kvgov.audit")

_TYPE: Final = 3  # index of ``type`` in a sealed row


@dataclass(frozen=True, slots=True)
class Snapshot:
    """What one pass hands the database (copied under ``cv``, written without it).

    Attributes:
        records: keys, events and checkpoints pending when it was taken.
        last_event: highest event seq among them (0: none).
        last_cp: highest checkpoint seq among them (-1: none).
        key_ids: the keys among them.
        replay: the spool had records to replay when it was taken.
        spool_size: the spool's size then: it is removed after the replay only if
            nothing was appended since.
    """

    records: list[Record]
    last_event: int
    last_cp: int
    key_ids: frozenset[str]
    replay: bool
    spool_size: int


class Outbox:
    """One stream's sealed records until they are durable (see the module docstring).

    Args:
        spool: the stream's spool.
        quarantine: the stream's quarantine.
        stream: the stream id.
        head_seq: the last durable ``seq`` at start.
        key: the signing key's record, pending until it reaches the database.
        now_us: microseconds since the epoch, to stamp quarantined records.
    """

    def __init__(
        self,
        spool: Spool,
        quarantine: Quarantine,
        stream: str,
        head_seq: int,
        key: KeyRecord,
        now_us: Callable[[], int],
    ) -> None:
        self.spool = spool
        self.quarantine = quarantine
        self._stream = stream
        self._now_us = now_us
        #: Sealed rows not yet durable, in ``seq`` order (the sealer appends).
        self.events: list[EventRecord] = []
        #: Checkpoints not yet durable (the sealer appends).
        self.checkpoints: list[CheckpointRecord] = []
        #: Keys not yet in the database (the spool may hold them too).
        self.keys: list[KeyRecord] = [key]
        self.stored_seq = head_seq
        self.durable_seq = head_seq
        self.spool_dirty = spool.exists()
        #: Why the last records were spooled, for ``Recorded.reason``.
        self.spool_reason: str | None = None
        #: Why neither database nor spool could be written, or None.
        self.unavailable: str | None = None
        self.quarantined = 0
        self.damaged = 0
        #: Events appended to the spool since start (replays count again if re-spooled).
        self.spooled_total = 0
        #: Critical events whose evidence is only spooled: seq -> type.
        self.critical_spooled: dict[int, str] = {}

    def stats(self, recorded: int, database_error: str | None, queued: int = 0) -> AuditStats:
        """A snapshot for :meth:`kvgov.audit.AuditLog.stats`.

        Args:
            recorded: the highest ``seq`` handed out.
            database_error: the last database error, while it fails.
            queued: events in the writer's queue.

        Returns:
            The stats.
        """
        spooled = max(0, self.durable_seq - self.stored_seq) if self.spool_dirty else 0
        return AuditStats(
            stream=self._stream,
            recorded=recorded,
            stored_seq=self.stored_seq,
            durable_seq=self.durable_seq,
            spooled=spooled,
            spooled_total=self.spooled_total,
            quarantined=self.quarantined,
            damaged_lines=self.damaged,
            critical_spooled=tuple(f"{self._stream}:{s}" for s in self.critical_spooled),
            database_error=database_error,
            unavailable=self.unavailable,
            queue_depth=queued,
            spool_bytes=self.spool.size(),
        )

    def snapshot(self) -> Snapshot | None:
        """Copy what is pending, or None when there is nothing to write.

        Returns:
            The snapshot.
        """
        events, cps, keys = self.events, self.checkpoints, self.keys
        if not (events or cps or keys or self.spool_dirty):
            return None
        return Snapshot(
            records=[*keys, *events, *cps],
            last_event=int(events[-1][1]) if events else 0,
            last_cp=cps[-1].seq if cps else -1,
            key_ids=frozenset(k.key_id for k in keys),
            replay=self.spool_dirty,
            spool_size=self.spool.size() if self.spool_dirty else 0,
        )

    def stored(self, snap: Snapshot, replay: SpoolContents | None, refusals: list[Refusal]) -> bool:
        """The database took a snapshot (but ``refusals``): drop it from what is pending.

        Args:
            snap: the snapshot written.
            replay: the spool contents replayed with it, or None.
            refusals: the records the database refused.

        Returns:
            True when the refused records and damaged spool lines (if any) are in the
            quarantine (the writer then records an ``audit_gap`` event), False when
            they could only be kept in the spool.

        Raises:
            AuditUnavailable: refused records could be kept neither in the quarantine
                nor in the spool.
        """
        self.events = [r for r in self.events if r[1] > snap.last_event]
        self.checkpoints = [c for c in self.checkpoints if c.seq > snap.last_cp]
        self.keys = [k for k in self.keys if k.key_id not in snap.key_ids]
        top = max(snap.last_event, replay.last_seq if replay is not None else 0)
        self.stored_seq = max(self.stored_seq, top)
        self.durable_seq = max(self.durable_seq, top)
        self.unavailable = None
        for seq in [s for s in self.critical_spooled if s <= self.stored_seq]:
            del self.critical_spooled[seq]
        damaged = replay.damaged if replay is not None else ()
        fresh = {id(r) for r in snap.records}  # refused records the spool does not hold
        kept = self._quarantine(refusals, damaged, fresh)
        if snap.replay and kept and self.spool.size() == snap.spool_size:
            self.spool.remove()
            self.spool_dirty = False
            _log.info("audit spool replayed", spool=str(self.spool.path))
        return kept

    def _quarantine(
        self, refusals: list[Refusal], damaged: tuple[str, ...], fresh: set[int]
    ) -> bool:
        """Keep refused records and damaged spool lines; True when they are on disk."""
        if not (refusals or damaged):
            return True
        try:
            self.quarantine.add(
                [(r.record, r.reason) for r in refusals],
                self._now_us(),
                [(self._stream, line, "spool line does not parse") for line in damaged],
            )
        except OSError as exc:
            _log.error("audit quarantine not writable", error=str(exc))
            # keep them in the spool: refused again at the next replay, quarantined then
            self.spool_records([r.record for r in refusals if id(r.record) in fresh], str(exc))
            return False
        self.quarantined += len(refusals)
        self.damaged += len(damaged)
        _log.error(
            "audit records refused by the database; quarantined",
            count=len(refusals) + len(damaged),
            quarantine=str(self.quarantine.path),
        )
        return True

    def spool_records(self, records: list[Record], reason: str) -> None:
        """Append records to the spool.

        Args:
            records: the records.
            reason: why they are spooled (for the error message).

        Raises:
            AuditUnavailable: the spool cannot be written.
        """
        events = [r for r in records if isinstance(r, tuple)]
        cps = [r for r in records if isinstance(r, CheckpointRecord)]
        keys = [r for r in records if isinstance(r, KeyRecord)]
        try:
            self.spool.append(events, cps, keys)
        except OSError as exc:
            self.unavailable = f"{reason}; spool {self.spool.path}: {exc}"
            raise AuditUnavailable(self.unavailable) from exc
        self.spool_dirty = True

    def spool_pending(self, reason: str) -> None:
        """Append everything pending to the spool (the database did not take it).

        Args:
            reason: why (kept for ``Recorded.reason``).

        Raises:
            AuditUnavailable: the spool cannot be written (the records stay pending).
        """
        events, cps, keys = self.events, self.checkpoints, self.keys
        if not (events or cps or keys):
            return
        self.spool_records([*keys, *events, *cps], reason)
        if events:
            self.durable_seq = max(self.durable_seq, int(events[-1][1]))
            self.spooled_total += len(events)
            for r in events:
                if r[_TYPE] in CRITICAL_EVENT_TYPES:
                    self.critical_spooled[int(r[1])] = r[_TYPE]
        self.events, self.checkpoints = [], []
        # keys stay pending until they reach the database (the spool also holds them)
        self.unavailable = None
        self.spool_reason = reason
