"""Writing sealed records to the audit database, and isolating the ones it refuses.

The writer hands everything due in one pass (a spool being replayed and the events,
checkpoints and keys sealed since) to :func:`store_on`, on the connection it keeps
between passes (:class:`HeldConnection`); :func:`store_records` does the same on a
connection of its own. Normally they go in one
transaction. When the database *refuses* the data (:func:`is_refusal`: a value it
cannot hold, a duplicate key) rather than being unreachable, one bad record must not
hold back the records behind it, so the batch is bisected, each half in its own
transaction, until every refused record is alone; those are returned to be
quarantined (kept on disk, never dropped) and all the others are stored.

Why bisect and not one record per transaction: a refusal is rare (events are
validated when they are made), and bisection stores a batch of ``n`` records with
one bad one in about ``2 log2 n`` transactions instead of ``n`` commits.
"""

from __future__ import annotations

import dataclasses
import json
import sqlite3
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import chain, groupby
from typing import Any, Final

from sqlalchemy import Connection, Engine, func, insert, select
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite

from kvgov.audit.chain import GENESIS_HASH, ChainHash
from kvgov.audit.models import EVENT_INSERT_COLUMNS, AuditCheckpoint, AuditEventRow, AuditKey
from kvgov.audit.spool import CheckpointRecord, EventRecord, KeyRecord, Spool, SpoolContents

__all__ = [
    "HELD_IDLE_SECONDS",
    "Head",
    "HeldConnection",
    "Record",
    "Refusal",
    "first_line",
    "insert_events",
    "is_refusal",
    "last_seq",
    "load_head",
    "store_on",
    "store_records",
]

#: One record of any kind, as the spool and the quarantine hold them.
Record = EventRecord | CheckpointRecord | KeyRecord

_COLS: Final = ", ".join(EVENT_INSERT_COLUMNS)
_PG_COPY: Final = f"COPY audit_events ({_COLS}) FROM STDIN"
#: Rows per SQLite INSERT statement, largest first (each size is prepared once).
_SQLITE_CHUNKS: Final = (1024, 128, 16, 1)
_SQLITE_ROW: Final = f"({', '.join('?' * len(EVENT_INSERT_COLUMNS))})"
_SQLITE_SQL: dict[int, str] = {}
_HASH: Final = EVENT_INSERT_COLUMNS.index("hash")
_PREV: Final = EVENT_INSERT_COLUMNS.index("prev_hash")


@dataclass(frozen=True, slots=True)
class Refusal:
    """A record the database refused, and why.

    Attributes:
        record: the sealed event, checkpoint or key.
        reason: the database's error message, first line.
    """

    record: Record
    reason: str


def is_refusal(exc: BaseException) -> bool:
    """Whether an error means "the database refuses this data" rather than "it is down".

    Refusals are the DB-API ``DataError`` (a value the column cannot hold) and
    ``IntegrityError`` (a duplicate key), raw or wrapped by SQLAlchemy, and a
    ``UnicodeError`` while encoding a value. Everything else (connection failures,
    timeouts, a missing table, a permission denied) is the environment: the records
    are spooled and tried again.

    Args:
        exc: the error.

    Returns:
        True for a refusal of the data.
    """
    if isinstance(exc, sa_exc.StatementError) and exc.orig is not None:
        exc = exc.orig
    if isinstance(exc, (sqlite3.DataError, sqlite3.IntegrityError, UnicodeError)):
        return True
    pg: Any = sys.modules.get("psycopg")  # no psycopg error exists unless it was imported
    return pg is not None and isinstance(exc, (pg.DataError, pg.IntegrityError))


def first_line(exc: BaseException) -> str:
    """``"<ErrorType>: <first line of the message>"``, the driver's error under SQLAlchemy's.

    Args:
        exc: the error.

    Returns:
        One line for a log or a reason.
    """
    if isinstance(exc, sa_exc.StatementError) and exc.orig is not None:
        exc = exc.orig
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}"


def _sqlite_insert_sql(rows: int) -> str:
    sql = _SQLITE_SQL.get(rows)
    if sql is None:
        sql = _SQLITE_SQL[rows] = (
            f"INSERT INTO audit_events ({_COLS}) VALUES {', '.join([_SQLITE_ROW] * rows)}"
        )
    return sql


def insert_sqlite(raw: sqlite3.Connection, rows: Sequence[EventRecord]) -> None:
    """Insert rows with multi-row INSERTs rather than ``executemany``.

    Why: ``executemany`` releases and retakes the GIL around every row's step (a
    hand-off that a busy caller thread makes wait) and pays the driver's per-row
    overhead; one statement per chunk of rows steps once.

    Args:
        raw: the sqlite3 connection.
        rows: sealed events in ``EVENT_INSERT_COLUMNS`` order.
    """
    width = len(EVENT_INSERT_COLUMNS)
    limit = raw.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
    cur = raw.cursor()
    try:
        done, n = 0, len(rows)
        for size in _SQLITE_CHUNKS:
            if size > 1 and size * width > limit:
                continue
            sql = _sqlite_insert_sql(size)
            while n - done >= size:
                cur.execute(sql, list(chain.from_iterable(rows[done : done + size])))
                done += size
    finally:
        cur.close()


def insert_events(conn: Connection, rows: Sequence[EventRecord]) -> None:
    """Insert sealed events the fastest way the driver allows (COPY on psycopg).

    Args:
        conn: a connection inside a transaction.
        rows: sealed events in ``EVENT_INSERT_COLUMNS`` order.
    """
    if not rows:
        return
    dialect = conn.dialect
    raw = conn.connection.driver_connection
    if isinstance(raw, sqlite3.Connection):
        insert_sqlite(raw, rows)
        return
    if dialect.name == "postgresql" and dialect.driver == "psycopg" and raw is not None:
        with raw.cursor() as cur, cur.copy(_PG_COPY) as copy:
            for r in rows:
                copy.write_row(r)
        return
    dicts = []
    for r in rows:  # any other driver: plain executemany through SQLAlchemy
        d = dict(zip(EVENT_INSERT_COLUMNS, r, strict=True))
        d["block_ids"] = json.loads(d["block_ids"])
        d["details"] = json.loads(d["details"])
        dicts.append(d)
    conn.execute(insert(AuditEventRow), dicts)


def _insert_checkpoints(conn: Connection, cps: Sequence[CheckpointRecord]) -> None:
    if cps:  # the record's fields are the table's columns
        conn.execute(insert(AuditCheckpoint), [dataclasses.asdict(c) for c in cps])


def _insert_keys(conn: Connection, keys: Sequence[KeyRecord]) -> None:
    for k in keys:
        values = dataclasses.asdict(k)  # the record's fields are the table's columns
        if conn.dialect.name == "postgresql":
            conn.execute(postgresql.insert(AuditKey).values(values).on_conflict_do_nothing())
        elif conn.dialect.name == "sqlite":
            conn.execute(sqlite.insert(AuditKey).values(values).on_conflict_do_nothing())
        else:  # pragma: no cover - other dialects
            exists = conn.execute(select(AuditKey.key_id).where(AuditKey.key_id == k.key_id))
            if exists.first() is None:
                conn.execute(insert(AuditKey).values(values))


def last_seq(
    conn: Connection, table: type[AuditEventRow] | type[AuditCheckpoint], stream: str
) -> int:
    """The highest ``seq`` one stream has in ``table``.

    Args:
        conn: a connection.
        table: the events or the checkpoints table.
        stream: the stream.

    Returns:
        The sequence number, -1 when the stream has no row there.
    """
    last = conn.execute(select(func.max(table.seq)).where(table.stream == stream)).scalar()
    return -1 if last is None else int(last)


def _kind(record: Record) -> int:
    if isinstance(record, KeyRecord):
        return 0
    return 2 if isinstance(record, CheckpointRecord) else 1


def _insert_all(conn: Connection, records: Sequence[Record]) -> None:
    for kind, group in groupby(records, key=_kind):
        items: list[Any] = list(group)
        if kind == 0:
            _insert_keys(conn, items)
        elif kind == 1:
            insert_events(conn, items)
        else:
            _insert_checkpoints(conn, items)


def _already_stored(conn: Connection, record: Record) -> bool:
    """Whether a record refused as a duplicate is in fact stored, byte for byte."""
    if isinstance(record, CheckpointRecord):
        stored = conn.execute(
            select(AuditCheckpoint.chain_hash).where(
                AuditCheckpoint.stream == record.stream, AuditCheckpoint.seq == record.seq
            )
        ).scalar()
        return stored is not None and bytes(stored) == record.chain_hash
    if isinstance(record, KeyRecord):
        return False  # keys are inserted with ON CONFLICT DO NOTHING: never a duplicate
    stored = conn.execute(
        select(AuditEventRow.hash).where(
            AuditEventRow.stream == record[0], AuditEventRow.seq == record[1]
        )
    ).scalar()
    return stored is not None and bytes(stored) == bytes(record[_HASH])


def _isolate(conn: Connection, records: Sequence[Record]) -> list[Refusal]:
    try:
        with conn.begin():
            _insert_all(conn, records)
    except Exception as exc:
        if not is_refusal(exc):
            raise
        if len(records) == 1:
            with conn.begin():
                stored = _already_stored(conn, records[0])
            return [] if stored else [Refusal(records[0], first_line(exc))]
        mid = len(records) // 2
        return _isolate(conn, records[:mid]) + _isolate(conn, records[mid:])
    return []


def _split(
    records: Iterable[Record],
) -> tuple[list[KeyRecord], list[EventRecord], list[CheckpointRecord]]:
    keys: list[KeyRecord] = []
    events: list[EventRecord] = []
    cps: list[CheckpointRecord] = []
    for r in records:
        if isinstance(r, KeyRecord):
            keys.append(r)
        elif isinstance(r, CheckpointRecord):
            cps.append(r)
        else:
            events.append(r)
    return keys, events, cps


def _breaks(conn: Connection, stream: str, after: int, events: Sequence[EventRecord]) -> list[str]:
    """Where replayed events do not continue the database's chain head, or each other."""
    head = conn.execute(
        select(AuditEventRow.hash).where(AuditEventRow.stream == stream, AuditEventRow.seq == after)
    ).scalar()
    seq, prev = max(after, 0), GENESIS_HASH if head is None else bytes(head)
    out: list[str] = []
    for r in events:
        if int(r[1]) != seq + 1 or bytes(r[_PREV]) != prev:
            out.append(f"spooled event seq {r[1]} does not continue the chain at seq {seq}")
        seq, prev = int(r[1]), bytes(r[_HASH])
    return out[:20]


def due_records(
    conn: Connection,
    stream: str,
    replay: SpoolContents | None,
    records: Iterable[Record],
    notes: list[str] | None = None,
) -> list[Record]:
    """What one pass writes: the spool's records the database lacks, then the new ones.

    Args:
        conn: a connection (read only here).
        stream: the stream.
        replay: the spool being replayed, or None.
        records: records sealed since the last pass.
        notes: where to say which replayed events do not continue the database's
            chain head (or the event before them), or None.

    Returns:
        Keys, then events in ``seq`` order, then checkpoints; each event and
        checkpoint once, and none the database already holds.
    """
    keys, events, cps = _split(records)
    if replay is not None:
        after = last_seq(conn, AuditEventRow, stream)
        cp_after = last_seq(conn, AuditCheckpoint, stream)
        by_seq = {int(r[1]): r for r in chain(replay.events, events) if int(r[1]) > after}
        events = [by_seq[s] for s in sorted(by_seq)]
        if notes is not None and replay.events:
            notes.extend(_breaks(conn, stream, after, events))
        cp_by_seq = {c.seq: c for c in chain(replay.checkpoints, cps) if c.seq > cp_after}
        cps = [cp_by_seq[s] for s in sorted(cp_by_seq)]
        keys = list({k.key_id: k for k in chain(replay.keys, keys)}.values())
    return [*keys, *events, *cps]


def store_records(
    engine: Engine,
    stream: str,
    replay: SpoolContents | None,
    records: Sequence[Record],
    notes: list[str] | None = None,
) -> list[Refusal]:
    """Write one pass's records; isolate and return the ones the database refuses.

    Args:
        engine: the audit engine.
        stream: the stream.
        replay: the spool to replay first (its records the database already holds
            are skipped), or None.
        records: records sealed since the last pass.
        notes: where to say which replayed events do not continue the chain (see
            :func:`due_records`), or None.

    Returns:
        The refused records (everything else is stored).

    Raises:
        Exception: any error that is not a refusal (the database is unreachable,
            timed out, lacks the schema, denies permission): nothing was stored.
    """
    with engine.connect() as conn:
        return store_on(conn, stream, replay, records, notes)


def store_on(
    conn: Connection,
    stream: str,
    replay: SpoolContents | None,
    records: Sequence[Record],
    notes: list[str] | None = None,
) -> list[Refusal]:
    """:func:`store_records` on a connection the caller holds (no transaction open).

    Raises:
        Exception: as :func:`store_records`.
    """
    due = due_records(conn, stream, replay, records, notes)
    conn.rollback()  # end the read's implicit transaction
    if not due:
        return []
    try:
        with conn.begin():
            _insert_all(conn, due)
    except Exception as exc:
        if not is_refusal(exc):
            raise
    else:
        return []
    return _isolate(conn, due)


#: Seconds a held connection may sit unused and still be used without a check: longer,
#: and the next pass takes a fresh one from the pool (whose pre-ping tests it).
HELD_IDLE_SECONDS: Final = 5.0


class HeldConnection:
    """The writer's database connection, kept from one pass to the next.

    Why: taking a pooled connection for each pass costs a round trip to test it
    (``pool_pre_ping``) and one to reset it on return, about 0.3 ms of the writer's
    CPU a pass with PostgreSQL, as much as storing 150 events. A writer that passes
    every ``WRITER_INTERVAL_SECONDS`` keeps its connection; one idle for
    ``HELD_IDLE_SECONDS`` (long enough for the server to have restarted unseen) gives
    it back and takes a tested one. A pass that fails drops it (invalidated: its state
    is unknown), so the next pass starts on a fresh, tested connection, as before.
    Not thread-safe: only the writer's thread (and its constructor, before the thread
    starts) uses it.

    Args:
        engine: the audit engine.
        idle_seconds: see ``HELD_IDLE_SECONDS``.
        clock: monotonic seconds.
    """

    def __init__(
        self,
        engine: Engine,
        idle_seconds: float = HELD_IDLE_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._engine = engine
        self._idle = idle_seconds
        self._clock = clock
        self._conn: Connection | None = None
        self._used = 0.0

    @property
    def held(self) -> bool:
        """Whether a connection is held now."""
        return self._conn is not None

    def store(
        self,
        stream: str,
        replay: SpoolContents | None,
        records: Sequence[Record],
        notes: list[str] | None = None,
    ) -> list[Refusal]:
        """:func:`store_records` on the held connection (taking one first if need be).

        A held connection found dead (the server restarted or ended the session since
        the last pass) is replaced and the pass tried once more on a fresh one, as the
        pool's pre-ping would have; a commit whose answer was lost is not stored twice
        (a duplicate that matches byte for byte counts as stored, :func:`store_records`).

        Raises:
            Exception: as :func:`store_records`; the connection is dropped first.
        """
        conn = self._conn
        if conn is not None and (conn.invalidated or self._clock() - self._used >= self._idle):
            self.release()
        reused = self._conn is not None
        noted = len(notes) if notes is not None else 0
        try:
            return self._store_once(stream, replay, records, notes)
        except sa_exc.DBAPIError as exc:
            if not (reused and exc.connection_invalidated):
                raise
        if notes is not None:
            del notes[noted:]  # said again by the second try
        return self._store_once(stream, replay, records, notes)

    def _store_once(
        self,
        stream: str,
        replay: SpoolContents | None,
        records: Sequence[Record],
        notes: list[str] | None,
    ) -> list[Refusal]:
        try:
            if self._conn is None:
                self._conn = self._engine.connect()
            refusals = store_on(self._conn, stream, replay, records, notes)
        except BaseException:
            self.release(invalidate=True)
            raise
        self._used = self._clock()
        return refusals

    def release(self, *, invalidate: bool = False) -> None:
        """Give the connection back to the pool (``invalidate``: close it for good)."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        try:
            if invalidate and not conn.invalidated:
                conn.invalidate()
            conn.close()
        except Exception:  # a broken connection: the pool replaces it
            pass


@dataclass(frozen=True, slots=True)
class Head:
    """Where a stream's chain stands, in the database and its spool together.

    Attributes:
        seq: the last ``seq`` (0 for a new stream).
        hash: its chain hash (``GENESIS_HASH`` for a new stream).
        last_checkpoint: the last checkpointed ``seq`` (-1 when none).
    """

    seq: int
    hash: ChainHash
    last_checkpoint: int


def load_head(engine: Engine, stream: str, spool: Spool) -> Head:
    """Read a stream's head so a restarted writer continues its chain.

    Args:
        engine: the audit engine.
        stream: the stream.
        spool: the stream's spool (its records count as written; read with the
            writer's key, the hash is that of the last authentic event, the ``seq``
            past any rejected one).

    Returns:
        The head.
    """
    with engine.connect() as conn:
        row = conn.execute(
            select(AuditEventRow.seq, AuditEventRow.hash)
            .where(AuditEventRow.stream == stream)
            .order_by(AuditEventRow.seq.desc())
            .limit(1)
        ).first()
        last_cp = last_seq(conn, AuditCheckpoint, stream)
    seq, head = (0, GENESIS_HASH) if row is None else (int(row[0]), ChainHash(bytes(row[1])))
    if spool.exists():
        contents = spool.read()
        spooled = [r for r in contents.events if r[1] > seq]
        if spooled:
            seq, head = int(spooled[-1][1]), ChainHash(bytes(spooled[-1][-1]))
        last_cp = max([last_cp, *(c.seq for c in contents.checkpoints)])
        # seqs of rejected (quarantined) events stay a hole, and the chain goes on from
        # the last authentic event: it never links to what failed authentication
        seq = max(seq, contents.rejected_seq)
    return Head(seq, head, last_cp)
