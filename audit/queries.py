"""Compliance queries over the audit trail: reuse, erasure, denials, decisions, export.

Every query returns small frozen :class:`AuditRecord` objects read by name. None of
them can show token ids or text: the store has no column for them, and ``details``
refuses such keys when an event is created.

One stored row can be two records: an ``admission`` whose ``details`` carry
:data:`~kvgov.audit.events.OWN_REUSE_KEY` (the vLLM binding writes the reuse of a
request's own cached blocks into its admission event) is listed as that admission,
without the key, followed by the ``reuse`` record the key describes, which carries
the admission's event id, sequence number, time and hash (the row that holds it).
Every query, count and export answers as if the reuse were a row of its own.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Final, TextIO

from sqlalchemy import Select, String, cast, func, or_, select
from sqlalchemy.engine import URL

from kvgov.audit.events import FIELDS, MAX_COUNT, OWN_REUSE_KEY, EventType
from kvgov.audit.models import DENIALS_WHERE, AuditCheckpoint, AuditEventRow
from kvgov.audit.store import open_engine
from kvgov.exceptions import InvalidTimeBound, MalformedAuditRow

__all__ = ["AuditQueries", "AuditRecord", "CheckpointInfo", "TimeBound", "to_time_us"]

#: Event types that count as a denial.
DENIAL_TYPES: Final = (EventType.POLICY_DENIED, EventType.SHARE_DENIED, EventType.POLICY_ERROR)
#: Event types that count as a reuse of cached blocks.
REUSE_TYPES: Final = (EventType.REUSE, EventType.CROSS_TENANT_REUSE)

_SCOPE_END = FIELDS.index("token_count")  # display order: block ids after the scope

#: Columns of a record, in display and export order.
RECORD_FIELDS: Final = (
    "event_id",
    "time",
    "stream",
    "seq",
    "type",
    *FIELDS[:_SCOPE_END],
    "block_ids",
    *FIELDS[_SCOPE_END:],
    "details",
    "hash",
)
#: The stored columns a record is made of, in ``RECORD_FIELDS`` order.
_COLUMNS: Final = (
    "stream",
    "seq",
    "time_us",
    *(f for f in RECORD_FIELDS if f not in ("event_id", "time", "stream", "seq")),
)
_SELECT_COLS: Final = tuple(getattr(AuditEventRow, c) for c in _COLUMNS)


#: A query time bound: an aware datetime, an ISO 8601 string, or seconds since the epoch.
TimeBound = datetime | str | int | float


def to_time_us(when: TimeBound | None, name: str = "since") -> int | None:
    """Convert a query bound to microseconds since the epoch.

    Args:
        when: a timezone-aware datetime; an ISO 8601 string (``2025-01-01``,
            ``2025-01-01T12:00:00+02:00``; UTC when it names no offset, as on the
            command line); seconds since the epoch; or None.
        name: the parameter's name, for the error.

    Returns:
        Microseconds since the epoch, or None.

    Raises:
        InvalidTimeBound: a naive datetime (its zone is unknown: local time read as
            UTC would shift the window silently), a string that is not ISO 8601, or
            another type.
    """
    if when is None:
        return None
    if isinstance(when, str):
        try:
            parsed = datetime.fromisoformat(when)
        except ValueError:
            raise InvalidTimeBound(
                name, when, "not an ISO 8601 date/time, e.g. 2025-01-01T12:00:00+00:00"
            ) from None
        when = parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
    elif isinstance(when, datetime):
        if when.tzinfo is None or when.utcoffset() is None:
            raise InvalidTimeBound(
                name,
                when,
                "a naive datetime has no time zone; give an aware one "
                "(datetime(..., tzinfo=UTC), datetime.now(UTC)) or an ISO 8601 string",
            )
    elif isinstance(when, bool) or not isinstance(when, (int, float)):
        raise InvalidTimeBound(
            name, when, "give an aware datetime, an ISO 8601 string or epoch seconds"
        )
    else:
        return int(when * 1_000_000)
    return int(when.timestamp() * 1_000_000)


@dataclass(frozen=True, slots=True)
class AuditRecord:
    """One stored audit event as a query returns it.

    Attributes mirror the ``audit_events`` columns; ``event_id`` is ``"<stream>:<seq>"``,
    ``time`` the UTC datetime of ``time_us``, ``hash`` the hex chain hash.
    """

    event_id: str
    time: datetime
    time_us: int
    stream: str
    seq: int
    type: str
    tenant: str | None
    requester_tenant: str | None
    classification: str | None
    model: str | None
    model_revision: str | None
    adapter: str | None
    adapter_revision: str | None
    tokenizer: str | None
    tokenizer_revision: str | None
    template_version: str | None
    sequence_id: str | None
    block_ids: tuple[int, ...]
    token_count: int | None
    reused_tokens: int | None
    decision_id: str | None
    policy_revision: str | None
    details: dict[str, Any]
    hash: str

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict in ``RECORD_FIELDS`` order (time as ISO 8601 UTC with its offset,
        ``2025-01-01T12:00:00.000001+00:00``).

        Returns:
            The record.
        """
        out: dict[str, Any] = {}
        for name in RECORD_FIELDS:
            v = getattr(self, name)
            if name == "time":
                v = v.isoformat(timespec="microseconds")
            elif name == "block_ids":
                v = list(v)
            out[name] = v
        return out

    def csv_row(self) -> list[Any]:
        """The record as one CSV row in ``RECORD_FIELDS`` order (JSON text for lists and dicts).

        Returns:
            The cells.
        """
        return [
            json.dumps(v, sort_keys=True) if k in ("block_ids", "details") else v
            for k, v in self.to_dict().items()
        ]


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    """A stored checkpoint, for keeping a copy outside the database.

    Attributes:
        stream: the stream.
        seq: last seq covered.
        chain_hash: hex chain hash at ``seq``.
        signature: hex Ed25519 signature.
        key_id: signing key id.
        time: when it was signed (UTC).
    """

    stream: str
    seq: int
    chain_hash: str
    signature: str
    key_id: str
    time: datetime

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict.

        Returns:
            The checkpoint.
        """
        return {
            "stream": self.stream,
            "seq": self.seq,
            "chain_hash": self.chain_hash,
            "signature": self.signature,
            "key_id": self.key_id,
            "time": self.time.isoformat(timespec="microseconds"),
        }


def _time(us: int) -> datetime:
    return datetime.fromtimestamp(us / 1_000_000, tz=UTC)


#: The integer columns of a record (the others are text, but block_ids, details, hash).
_INT_COLUMNS: Final = frozenset({"seq", "time_us", "token_count", "reused_tokens"})
#: The columns that are never NULL (nor JSON null: kvgov writes a list and a dict).
_REQUIRED: Final = frozenset({"stream", "seq", "time_us", "type", "block_ids", "details", "hash"})


def _column_problem(name: str, v: Any) -> str | None:
    """What is wrong with one stored value, or None (types as kvgov writes them)."""
    if v is None:
        return "is NULL" if name in _REQUIRED else None
    if name in _INT_COLUMNS:
        ok = isinstance(v, int) and not isinstance(v, bool)
    elif name == "block_ids":
        ok = isinstance(v, list) and all(type(b) is int for b in v)
    elif name == "details":
        ok = isinstance(v, dict)
    elif name == "hash":
        ok = isinstance(v, bytes | memoryview) and len(v) == 32
    else:
        ok = isinstance(v, str)
    return None if ok else f"{name} holds {type(v).__name__} {v!r:.40}"


def _record(r: Sequence[Any]) -> AuditRecord:
    """One row as a record; a wrongly typed column raises MalformedAuditRow, never a guess."""
    d = dict(zip(_COLUMNS, r, strict=True))
    for name, v in d.items():
        problem = _column_problem(name, v)
        if problem is not None:
            raise MalformedAuditRow(f"{d['stream']!r:.40}:{d['seq']!r:.20}", problem)
    stream, seq, time_us = d["stream"], d["seq"], d["time_us"]
    d |= {
        "block_ids": tuple(d["block_ids"]),
        "details": dict(d["details"]),
        "hash": bytes(d["hash"]).hex(),
    }
    return AuditRecord(event_id=f"{stream}:{seq}", time=_time(time_us), **d)


_ADMISSION: Final = EventType.ADMISSION.value
_REUSE: Final = EventType.REUSE.value


def _own_reuse(event_id: str, num_blocks: int, details: dict[str, Any]) -> tuple[int, int] | None:
    """The (blocks, reused tokens) of the reuse an admission's row also holds, or None.

    Args:
        event_id: the admission's id (for the error).
        num_blocks: how many block ids it lists.
        details: its details.

    Raises:
        MalformedAuditRow: the key is there but does not describe a reuse of the
            admission's leading blocks.
    """
    fold = details.get(OWN_REUSE_KEY)
    if fold is None:
        return None
    if type(fold) is dict and len(fold) == 2:
        blocks, tokens = fold.get("blocks"), fold.get("reused_tokens")
        if (
            type(blocks) is int
            and type(tokens) is int
            and 0 < blocks <= num_blocks
            and 0 <= tokens <= MAX_COUNT
        ):
            return blocks, tokens
    raise MalformedAuditRow(
        event_id, f"details.{OWN_REUSE_KEY} is not a reuse of its blocks: {fold!r:.60}"
    )


def _unfold(rec: AuditRecord) -> tuple[AuditRecord, ...]:
    """The records one row stands for: itself, or an admission and the reuse it holds."""
    fold = (
        _own_reuse(rec.event_id, len(rec.block_ids), rec.details)
        if rec.type == _ADMISSION
        else None
    )
    if fold is None:
        return (rec,)
    details = {k: v for k, v in rec.details.items() if k != OWN_REUSE_KEY}
    return (
        replace(rec, details=details),
        replace(  # as the reuse event the binding would have written after the admission
            rec,
            type=_REUSE,
            requester_tenant=rec.tenant,
            block_ids=rec.block_ids[: fold[0]],
            token_count=None,
            reused_tokens=fold[1],
            decision_id=None,
            policy_revision=None,
            details={},
        ),
    )


def _records(rows: Iterable[Sequence[Any]]) -> Iterator[AuditRecord]:
    """The records of a result (a row holding an admission and its reuse is two, see the
    module docstring); a row the driver cannot decode (a JSON column holding text that
    is not JSON) raises MalformedAuditRow naming the last event read."""
    last = "the first event"
    it = iter(rows)
    while True:
        try:
            r = next(it)
        except StopIteration:
            return
        except (ValueError, TypeError) as exc:  # the JSON type's result processor
            raise MalformedAuditRow(f"after {last}", f"a column does not decode: {exc}") from None
        rec = _record(r)
        last = rec.event_id
        yield from _unfold(rec)


def _stored_types(types: Iterable[str]) -> list[str]:
    """The stored event types whose rows can hold records of ``types`` (a reuse may be
    held by an admission's row)."""
    out = list(dict.fromkeys(types))
    if _REUSE in out and _ADMISSION not in out:
        out.append(_ADMISSION)
    return out


class AuditQueries:
    """Read-only compliance queries over one audit database.

    Time bounds (``since`` inclusive, ``until`` exclusive) are timezone-aware
    datetimes, ISO 8601 strings (UTC when they name no offset) or epoch seconds; a
    naive datetime raises :class:`~kvgov.exceptions.InvalidTimeBound` (see
    :func:`to_time_us`).

    Args:
        url: the audit database URL.

    Raises:
        AuditSchemaError: the database is not at the head revision.
    """

    def __init__(self, url: str | URL) -> None:
        self._engine = open_engine(url, read_only=True)

    def close(self) -> None:
        """Release the database connections."""
        self._engine.dispose()

    def __enter__(self) -> AuditQueries:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def is_empty(self) -> bool:
        """Whether the trail holds no event at all (one indexed row read).

        Returns:
            True when ``audit_events`` has no row.
        """
        with self._engine.connect() as conn:
            return conn.execute(select(AuditEventRow.seq).limit(1)).first() is None

    def _run(
        self,
        stmt: Select[Any],
        keep: Callable[[AuditRecord], bool] | None = None,
        limit: int | None = None,
    ) -> tuple[AuditRecord, ...]:
        """The records of ``stmt``, those ``keep`` accepts (all: None), at most ``limit``."""
        out: list[AuditRecord] = []
        if limit is not None and limit <= 0:
            return ()
        with self._engine.connect() as conn:
            for rec in _records(conn.execute(stmt)):
                if keep is None or keep(rec):
                    out.append(rec)
                    if limit is not None and len(out) >= limit:
                        break
        return tuple(out)

    @staticmethod
    def _window(stmt: Select[Any], since: Any, until: Any) -> Select[Any]:
        lo, hi = to_time_us(since, "since"), to_time_us(until, "until")
        if lo is not None:
            stmt = stmt.where(AuditEventRow.time_us >= lo)
        if hi is not None:
            stmt = stmt.where(AuditEventRow.time_us < hi)
        return stmt

    @staticmethod
    def _ordered(stmt: Select[Any]) -> Select[Any]:
        return stmt.order_by(AuditEventRow.time_us, AuditEventRow.stream, AuditEventRow.seq)

    def reuse(
        self, tenant: str, since: TimeBound | None = None, until: TimeBound | None = None
    ) -> tuple[AuditRecord, ...]:
        """Every reuse of ``tenant``'s cached blocks: by which tenant, under which decision.

        Args:
            tenant: the owner tenant.
            since: inclusive lower time bound (see :func:`to_time_us`).
            until: exclusive upper time bound.

        Returns:
            ``reuse`` and ``cross_tenant_reuse`` events whose owner is ``tenant``, oldest
            first; ``requester_tenant``, ``decision_id`` and ``policy_revision`` say who
            and under which policy.
        """
        stmt = select(*_SELECT_COLS).where(
            AuditEventRow.tenant == tenant, AuditEventRow.type.in_(_stored_types(REUSE_TYPES))
        )
        return self._run(
            self._ordered(self._window(stmt, since, until)), lambda r: r.type in REUSE_TYPES
        )

    def event(self, event_id: str) -> AuditRecord | None:
        """One event by its id (``"<stream>:<seq>"``), or None when there is none.

        Args:
            event_id: the id, as a report or a fleet result names it.

        Returns:
            The event, or None.
        """
        stream, _, seq = event_id.rpartition(":")
        if not stream or not seq.isdigit():
            return None
        stmt = select(*_SELECT_COLS).where(
            AuditEventRow.stream == stream, AuditEventRow.seq == int(seq)
        )
        found = self._run(stmt)
        return found[0] if found else None

    def erasure(self, tenant: str) -> tuple[AuditRecord, ...]:
        """The erasure evidence of a tenant: every ``erasure`` event, oldest first.

        Args:
            tenant: the tenant erased.

        Returns:
            The events; ``details`` holds what the erasure reported (blocks, bytes
            zeroized, verification), ``block_ids`` the blocks.
        """
        stmt = select(*_SELECT_COLS).where(
            AuditEventRow.tenant == tenant, AuditEventRow.type == EventType.ERASURE
        )
        return self._run(self._ordered(stmt))

    def denials(
        self,
        tenant: str | None = None,
        since: TimeBound | None = None,
        until: TimeBound | None = None,
    ) -> tuple[AuditRecord, ...]:
        """Policy denials, share denials and policy errors (which deny: fail closed).

        Args:
            tenant: only those where this tenant owned or requested (None: all).
            since: inclusive lower time bound.
            until: exclusive upper time bound.

        Returns:
            The events, oldest first.
        """
        # the literal predicate of the partial index, so that the database can use it
        stmt = select(*_SELECT_COLS).where(DENIALS_WHERE)
        if tenant is not None:
            stmt = stmt.where(
                or_(AuditEventRow.tenant == tenant, AuditEventRow.requester_tenant == tenant)
            )
        return self._run(self._ordered(self._window(stmt, since, until)))

    def decisions(self, policy_revision: str) -> tuple[AuditRecord, ...]:
        """Every event decided under one policy bundle revision.

        Args:
            policy_revision: the bundle revision.

        Returns:
            The events, oldest first.
        """
        stmt = select(*_SELECT_COLS).where(AuditEventRow.policy_revision == policy_revision)
        return self._run(self._ordered(stmt), lambda r: r.policy_revision == policy_revision)

    def events(
        self,
        type: str | None = None,
        tenant: str | None = None,
        since: TimeBound | None = None,
        until: TimeBound | None = None,
        limit: int | None = None,
    ) -> tuple[AuditRecord, ...]:
        """Generic filter over all events.

        Args:
            type: an event type (None: all).
            tenant: the owner tenant (None: all).
            since: inclusive lower time bound.
            until: exclusive upper time bound.
            limit: at most this many (oldest first).

        Returns:
            The events, oldest first.
        """
        stmt = select(*_SELECT_COLS)
        if type is not None:
            stmt = stmt.where(AuditEventRow.type.in_(_stored_types((type,))))
        if tenant is not None:
            stmt = stmt.where(AuditEventRow.tenant == tenant)
        stmt = self._ordered(self._window(stmt, since, until))
        if limit is not None and type != _REUSE:
            # every row is at least one record of the type asked for: ``limit`` rows suffice
            stmt = stmt.limit(max(limit, 0))
        return self._run(stmt, None if type is None else lambda r: r.type == type, limit)

    def counts(self, by: str = "type", tenant: str | None = None) -> dict[str, int]:
        """Count events grouped by one column (to cross-check what a workload did).

        Args:
            by: ``type``, ``tenant``, ``requester_tenant``, ``stream`` or ``policy_revision``.
            tenant: only this owner tenant (None: all).

        Returns:
            ``{value: count}``; a None value is counted under ``""``.

        Raises:
            ValueError: ``by`` is not one of the allowed columns.
        """
        allowed = ("type", "tenant", "requester_tenant", "stream", "policy_revision")
        if by not in allowed:
            raise ValueError(f"by must be one of {allowed}, got {by!r}")
        col = getattr(AuditEventRow, by)
        stmt = select(col, func.count()).group_by(col)
        folded = select(
            AuditEventRow.stream,
            AuditEventRow.seq,
            AuditEventRow.tenant,
            AuditEventRow.block_ids,
            AuditEventRow.details,
        ).where(
            AuditEventRow.type == _ADMISSION,
            # the rows that can hold one, found by the database (JSON and JSONB as text)
            cast(AuditEventRow.details, String).contains(f'"{OWN_REUSE_KEY}"', autoescape=True),
        )
        if tenant is not None:
            stmt = stmt.where(AuditEventRow.tenant == tenant)
            folded = folded.where(AuditEventRow.tenant == tenant)
        with self._engine.connect() as conn:
            counts = {(k or ""): int(n) for k, n in conn.execute(stmt)}
            # the reuses admissions' rows hold count as the reuse rows they stand for
            for stream, seq, owner, block_ids, details in conn.execute(folded):
                if type(details) is not dict or OWN_REUSE_KEY not in details:
                    continue
                ids = block_ids if type(block_ids) is list else ()
                _own_reuse(f"{stream}:{seq}", len(ids), details)  # its shape, or raise
                value = {
                    "type": _REUSE,
                    "tenant": owner,
                    "requester_tenant": owner,
                    "stream": stream,
                    "policy_revision": None,
                }[by]
                counts[value or ""] = counts.get(value or "", 0) + 1
        return counts

    def checkpoints(self, stream: str | None = None) -> tuple[CheckpointInfo, ...]:
        """The latest checkpoint of every stream (or every checkpoint of one stream).

        Keep this output somewhere the database's writers cannot change: it is what
        detects a tail cut after the last checkpoint.

        Args:
            stream: list all checkpoints of this stream (None: the latest per stream).

        Returns:
            The checkpoints.
        """
        c = AuditCheckpoint
        stmt = select(c.stream, c.seq, c.chain_hash, c.signature, c.key_id, c.time_us)
        if stream is not None:
            stmt = stmt.where(c.stream == stream).order_by(c.seq)
        else:
            latest = select(c.stream.label("s"), func.max(c.seq).label("m")).group_by(c.stream)
            sub = latest.subquery()
            stmt = stmt.join(sub, (c.stream == sub.c.s) & (c.seq == sub.c.m)).order_by(c.stream)
        with self._engine.connect() as conn:
            return tuple(
                CheckpointInfo(s, int(q), bytes(h).hex(), bytes(sig).hex(), k, _time(int(t)))
                for s, q, h, sig, k, t in conn.execute(stmt)
            )

    def iter_all(self, batch: int = 10_000) -> Iterator[AuditRecord]:
        """Every event in ``(stream, seq)`` order, streamed.

        Args:
            batch: rows fetched per round trip.

        Yields:
            The records.
        """
        stmt = select(*_SELECT_COLS).order_by(AuditEventRow.stream, AuditEventRow.seq)
        with self._engine.connect() as conn:
            yield from _records(conn.execution_options(yield_per=batch).execute(stmt))

    def iter_events(
        self,
        types: Sequence[str] | None = None,
        tenant: str | None = None,
        since: TimeBound | None = None,
        until: TimeBound | None = None,
        batch: int = 10_000,
    ) -> Iterator[AuditRecord]:
        """Events of some types in a time window, oldest first, streamed (for long
        windows that ``events`` would hold in memory at once).

        Args:
            types: the event types (None: all).
            tenant: only events of this tenant, as owner or as requester (None: all).
            since: inclusive lower time bound.
            until: exclusive upper time bound.
            batch: rows fetched per round trip.

        Yields:
            The records, in time, then ``(stream, seq)`` order.
        """
        stmt = select(*_SELECT_COLS)
        wanted = None if types is None else frozenset(types)
        if wanted is not None:
            stmt = stmt.where(AuditEventRow.type.in_(_stored_types(wanted)))
        if tenant is not None:
            stmt = stmt.where(
                or_(AuditEventRow.tenant == tenant, AuditEventRow.requester_tenant == tenant)
            )
        stmt = self._ordered(self._window(stmt, since, until))
        with self._engine.connect() as conn:
            for rec in _records(conn.execution_options(yield_per=batch).execute(stmt)):
                if wanted is None or rec.type in wanted:
                    yield rec

    def export(self, out: TextIO, format: str = "jsonl") -> int:
        """Write every event to ``out`` as JSON Lines, one JSON array, or CSV (streamed).

        Args:
            out: a text stream.
            format: ``jsonl``, ``json`` or ``csv`` (``block_ids`` and ``details`` as
                JSON text).

        Returns:
            The number of events written.

        Raises:
            ValueError: unknown format.
        """
        if format not in ("jsonl", "json", "csv"):
            raise ValueError(f"format must be jsonl, json or csv, got {format!r}")
        n = 0
        writer = csv.writer(out) if format == "csv" else None
        if writer is not None:
            writer.writerow(RECORD_FIELDS)
        elif format == "json":
            out.write("[")
        for rec in self.iter_all():
            if writer is not None:
                writer.writerow(rec.csv_row())
            elif format == "json":
                out.write(("\n" if n == 0 else ",\n") + json.dumps(rec.to_dict(), sort_keys=True))
            else:
                out.write(json.dumps(rec.to_dict(), sort_keys=True) + "\n")
            n += 1
        if format == "json":
            out.write("\n]\n" if n else "]\n")
        return n
