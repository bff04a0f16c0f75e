"""``AuditLog``: the batched, background, bounded, never-lossy audit writer.

::

    caller thread                         writer thread (or the caller, for critical events)
    -------------                         --------------------------------------------------
    record(event)                         every interval, or when a batch is waiting:
      lock: seq = next_seq++                io_lock: pop events in seq order
            deque.append((seq, t, ev))               seal: canonical bytes, hash chain,
      return "<stream>:<seq>"                              a checkpoint every N events
                                                     persist: database (one transaction)
    record(critical event)                             or, if it is down, the spool file
      ... as above, then io_lock: drain                or, if both fail, keep in memory
      everything up to it, persist, and                and raise AuditUnavailable
      raise AuditUnavailable unless durable

Event ids are ``"<stream>:<seq>"``: the stream (worker) id and the event's sequence
number in that stream, which is also the unique key ``(stream, seq)`` in the table.

Why a deque and not ``queue.Queue``: ``record`` must cost a few microseconds on the
caller's thread, and ``Queue.put`` takes a lock and signals a condition on every call.
The deque's ``append``/``popleft`` are atomic; sequence numbers are assigned and
appended under one small lock so that deque order is chain order, and only holders
of ``io_lock`` pop, so events are sealed and persisted in that order.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import re
import secrets
import socket
import sqlite3
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from itertools import chain
from operator import attrgetter
from pathlib import Path
from typing import Any, Final

import structlog
from sqlalchemy import Connection, Engine, func, insert, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import URL

from kvgov.audit.chain import GENESIS_HASH, BlockIdsJson, ChainHash, canonical_prefix, fast_json
from kvgov.audit.events import CRITICAL_EVENT_TYPES, FIELDS, AuditEvent
from kvgov.audit.models import EVENT_INSERT_COLUMNS, AuditCheckpoint, AuditEventRow, AuditKey
from kvgov.audit.signing import SigningKey, checkpoint_message, load_signing_key
from kvgov.audit.spool import CheckpointRecord, EventRecord, KeyRecord, Spool
from kvgov.audit.store import normalize_url, open_engine
from kvgov.defaults import AUDIT_BATCH_SIZE, AUDIT_QUEUE_SIZE, AUDIT_URL, CHECKPOINT_EVERY
from kvgov.exceptions import AuditError, AuditUnavailable, InvalidAuditEvent

__all__ = ["AuditLog"]

_log = structlog.get_logger("kvgov.audit")

#: Seconds the writer thread sleeps between drains when no batch is waiting.
WRITER_INTERVAL_SECONDS: Final = 0.05
#: Seconds after a database failure before the writer tries the database again
#: (in between, events go straight to the spool).
DB_RETRY_SECONDS: Final = 1.0
_MAX_STREAM_CHARS: Final = 128

_COLS = ", ".join(EVENT_INSERT_COLUMNS)
_PG_COPY = f"COPY audit_events ({_COLS}) FROM STDIN"
#: Rows per SQLite INSERT statement, largest first (each size is prepared once).
_SQLITE_CHUNKS: Final = (1024, 128, 16, 1)
_SQLITE_ROW: Final = f"({', '.join('?' * len(EVENT_INSERT_COLUMNS))})"
_SCOPE_END: Final = FIELDS.index("sequence_id")
#: ``type`` .. ``template_version``: the same for most events of one tenant and model.
_SCOPE: Final = attrgetter("type", *FIELDS[:_SCOPE_END])
#: ``sequence_id`` .. ``policy_revision``: new for most events.
_REQUEST: Final = attrgetter(*FIELDS[_SCOPE_END:])
#: Scopes whose JSON the sealing thread keeps before it starts over.
_SCOPE_CACHE_SIZE: Final = 4096

_Item = tuple[int, int, AuditEvent]  # (seq, time_us, event)


def _derive_stream_id() -> str:
    host = socket.gethostname() or "host"
    return f"{host[:64]}-{os.getpid()}-{secrets.token_hex(4)}"


def _default_spool_path(url: URL, stream: str) -> Path:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", stream)
    if url.get_backend_name() == "sqlite" and url.database not in (None, "", ":memory:"):
        db = Path(str(url.database))
        return db.with_name(f"{db.name}.{safe}.spool.jsonl")
    return Path.cwd() / f"kvgov-audit.{safe}.spool.jsonl"


@functools.cache
def _sqlite_insert_sql(rows: int) -> str:
    return f"INSERT INTO audit_events ({_COLS}) VALUES {', '.join([_SQLITE_ROW] * rows)}"


def _insert_sqlite(raw: sqlite3.Connection, rows: Sequence[EventRecord]) -> None:
    """Insert rows with multi-row INSERTs rather than ``executemany``.

    Why: ``executemany`` releases and retakes the GIL around every row's step (a
    hand-off that a busy caller thread makes wait) and pays the driver's per-row
    overhead; one statement per chunk of rows steps once.
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


def _insert_events(conn: Connection, rows: Sequence[EventRecord]) -> None:
    if not rows:
        return
    dialect = conn.dialect
    raw = conn.connection.driver_connection
    if isinstance(raw, sqlite3.Connection):
        _insert_sqlite(raw, rows)
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


def _last_seq(
    conn: Connection, table: type[AuditEventRow] | type[AuditCheckpoint], stream: str
) -> int:
    """The highest ``seq`` one stream has in ``table`` (0 when none)."""
    last = conn.execute(select(func.max(table.seq)).where(table.stream == stream)).scalar()
    return int(last or 0)


class AuditLog:
    """Append hash-chained audit events for one stream, in batches, off the caller's thread.

    Non-critical events are queued and written by a background thread; critical ones
    (:data:`kvgov.audit.CRITICAL_EVENT_TYPES`) are written, after everything queued before
    them, before ``record`` returns. When the database is unreachable, sealed events
    go to a local spool file (same chain) and are replayed in order when it returns.
    When neither can be written, critical ``record`` calls, ``flush`` and
    ``raise_if_unavailable`` raise :class:`~kvgov.exceptions.AuditUnavailable`, and the
    events are kept in memory and retried.

    Every ``checkpoint_every`` events and at ``close`` the writer signs
    ``(stream, seq, chain hash)`` with Ed25519. With no key configured (argument or
    ``KVGOV_SIGNING_KEY``) an ephemeral key is generated and its public key recorded in
    ``audit_keys``; verifiers report such checkpoints as untrusted.

    A stream id must be used by one process at a time; a restarted worker that passes
    the same ``worker_id`` continues its chain from the last stored (and spooled) event.

    Args:
        url: the audit database URL.
        worker_id: the stream id; None derives ``<hostname>-<pid>-<8 hex>``.
        signing_key: a key, PEM text, or a path; None reads ``KVGOV_SIGNING_KEY``.
        clock: seconds since the epoch (UTC), for event times.
        checkpoint_every: events between two signed checkpoints.
        spool_path: the spool file; None puts it next to a SQLite file, else in the
            working directory, named after the stream.
        batch_size: events per database round trip.
        queue_size: events queued before ``record`` blocks the caller.
        retry_seconds: seconds after a database failure before it is tried again.
        auto_upgrade: passed to :func:`kvgov.audit.store.open_engine`.

    Raises:
        AuditSchemaError: the database is not at the head revision.
        AuditUnavailable: the database cannot be reached at start.
        SigningKeyError: the configured signing key cannot be loaded.
    """

    def __init__(
        self,
        url: str | URL = AUDIT_URL,
        worker_id: str | None = None,
        signing_key: Any = None,
        *,
        clock: Callable[[], float] = time.time,
        checkpoint_every: int = CHECKPOINT_EVERY,
        spool_path: str | os.PathLike[str] | None = None,
        batch_size: int = AUDIT_BATCH_SIZE,
        queue_size: int = AUDIT_QUEUE_SIZE,
        retry_seconds: float = DB_RETRY_SECONDS,
        auto_upgrade: bool | None = None,
    ) -> None:
        stream = worker_id if worker_id is not None else _derive_stream_id()
        if not stream or len(stream) > _MAX_STREAM_CHARS:
            raise InvalidAuditEvent("worker_id", f"must be 1..{_MAX_STREAM_CHARS} characters")
        for name, value in (("checkpoint_every", checkpoint_every), ("batch_size", batch_size)):
            if value < 1:
                raise InvalidAuditEvent(name, "must be at least 1")
        self._url = normalize_url(url)
        self._stream = stream
        self._clock = clock
        self._checkpoint_every = checkpoint_every
        # the sealing thread's caches: decimal text of block ids, JSON of scopes
        self._block_ids_json = BlockIdsJson()
        self._scope_json: dict[tuple[str | None, ...], str] = {}
        self._batch_size = batch_size
        self._queue_size = max(queue_size, batch_size)
        self._retry_seconds = retry_seconds
        loaded = load_signing_key(signing_key)
        self._key = loaded if loaded is not None else SigningKey.ephemeral()
        self._spool = Spool(
            Path(spool_path) if spool_path is not None else _default_spool_path(self._url, stream)
        )
        try:
            self._engine: Engine = open_engine(self._url, auto_upgrade=auto_upgrade)
        except AuditError:
            raise
        except Exception as exc:
            raise AuditUnavailable(f"cannot open the audit database: {exc}") from exc

        self._lock = threading.Lock()  # guards next_seq and deque order
        self._io_lock = threading.Lock()  # guards everything below: chain head, pending, spool
        self._dq: deque[_Item] = deque()
        self._wake = threading.Event()
        self._stop = False
        self._closed = False

        self._pending_events: list[EventRecord] = []
        self._pending_cps: list[CheckpointRecord] = []
        self._pending_keys: list[KeyRecord] = [
            KeyRecord(
                self._key.key_id,
                self._key.public_raw,
                self._key.origin,
                stream,
                round(clock() * 1_000_000),
            )
        ]
        self._spool_dirty = self._spool.exists()
        self._db_retry_at = 0.0
        self._unavailable: str | None = None
        self._head_seq, self._head_hash = self._load_head()
        self._durable_seq = self._head_seq
        self._last_cp_seq = self._head_seq
        self._next_seq = self._head_seq + 1
        with self._io_lock:
            self._persist_locked()  # replays a leftover spool, records the key

        self._thread = threading.Thread(target=self._run, name=f"kvgov-audit-{stream}", daemon=True)
        self._thread.start()
        atexit.register(self._atexit)

    # ------------------------------------------------------------------ public API

    @property
    def stream_id(self) -> str:
        """This writer's stream (worker) id."""
        return self._stream

    @property
    def key_id(self) -> str:
        """Id of the key signing this stream's checkpoints."""
        return self._key.key_id

    @property
    def spool_path(self) -> Path:
        """Where events go while the database is unreachable."""
        return self._spool.path

    @property
    def spooled(self) -> bool:
        """Whether events are waiting in the spool for the database to return."""
        return self._spool_dirty

    def record(self, event: AuditEvent) -> str:
        """Append an event to this stream.

        Args:
            event: the event.

        Returns:
            The event id, ``"<stream>:<seq>"``.

        Raises:
            AuditUnavailable: a critical event could not be written to the database or
                the spool (the caller must refuse the operation), the queue is full
                while storage is failing, or the log is closed.
            InvalidAuditEvent: ``event`` is not an :class:`AuditEvent`.
        """
        if type(event) is not AuditEvent:
            raise InvalidAuditEvent("event", "record() takes an audit.AuditEvent")
        with self._lock:
            if self._closed:
                raise AuditUnavailable("the audit log is closed")
            seq = self._next_seq
            self._next_seq = seq + 1
            self._dq.append((seq, round(self._clock() * 1_000_000), event))
        if event.type in CRITICAL_EVENT_TYPES:
            self._write_through(seq)
        else:
            n = len(self._dq)
            if n >= self._batch_size and not self._wake.is_set():
                self._wake.set()
            if n >= self._queue_size:
                self._backpressure()
        return f"{self._stream}:{seq}"

    def raise_if_unavailable(self) -> None:
        """Cheap check for callers about to do something that must be audited.

        Raises:
            AuditUnavailable: the last write reached neither the database nor the spool.
        """
        reason = self._unavailable
        if reason is not None:
            raise AuditUnavailable(reason)

    def flush(self) -> None:
        """Write everything recorded so far (database, or spool while it is down).

        Also replays the spool when the database is reachable again.

        Raises:
            AuditUnavailable: some events could be written neither to the database nor
                to the spool (they stay in memory and are retried).
        """
        with self._lock:
            target = self._next_seq - 1
        with self._io_lock:
            self._drain_locked()
        if self._durable_seq < target:
            raise AuditUnavailable(self._unavailable or "events are still pending")

    def close(self) -> None:
        """Flush, sign a final checkpoint, stop the writer thread, release the database.

        Raises:
            AuditUnavailable: the final events could not be written anywhere.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        atexit.unregister(self._atexit)
        self._stop = True
        self._wake.set()
        self._thread.join()
        try:
            with self._io_lock:
                self._drain_locked(final_checkpoint=True)
        finally:
            self._engine.dispose()
        if self._durable_seq < self._next_seq - 1:
            raise AuditUnavailable(self._unavailable or "events are still pending")

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ internals

    def _atexit(self) -> None:
        try:
            self.close()
        except AuditError as exc:  # pragma: no cover - interpreter shutdown
            print(f"kvgov audit: events lost at exit: {exc}", file=sys.stderr)

    def _load_head(self) -> tuple[int, ChainHash]:
        with self._engine.connect() as conn:
            row = conn.execute(
                select(AuditEventRow.seq, AuditEventRow.hash)
                .where(AuditEventRow.stream == self._stream)
                .order_by(AuditEventRow.seq.desc())
                .limit(1)
            ).first()
        seq, head = (0, GENESIS_HASH) if row is None else (int(row[0]), ChainHash(bytes(row[1])))
        if self._spool_dirty:
            spooled = [r for r in self._spool.read().events if r[1] > seq]
            if spooled:
                last = spooled[-1]
                seq, head = int(last[1]), ChainHash(bytes(last[-1]))
        return seq, head

    def _backpressure(self) -> None:
        while len(self._dq) >= self._queue_size:
            self.raise_if_unavailable()
            self._wake.set()
            time.sleep(0.001)

    def _run(self) -> None:
        while not self._stop:
            self._wake.wait(WRITER_INTERVAL_SECONDS)
            self._wake.clear()
            # AuditUnavailable is kept in self._unavailable; the events stay pending
            with self._io_lock, contextlib.suppress(AuditUnavailable):
                self._drain_locked()

    def _write_through(self, seq: int) -> None:
        with self._io_lock:
            self._drain_locked()
        if self._durable_seq < seq:
            raise AuditUnavailable(self._unavailable or "the event could not be written")

    def _drain_locked(self, *, final_checkpoint: bool = False) -> None:
        dq = self._dq
        while True:
            n = min(len(dq), self._batch_size)
            if n:
                self._seal_locked([dq.popleft() for _ in range(n)])
            if final_checkpoint and not dq and self._head_seq > self._last_cp_seq:
                self._checkpoint_locked(self._head_seq, self._head_hash)
            self._persist_locked()
            if not dq:
                return

    def _checkpoint_locked(self, seq: int, chain: ChainHash) -> None:
        sig = self._key.sign(checkpoint_message(self._stream, seq, chain))
        self._pending_cps.append(
            CheckpointRecord(
                self._stream, seq, chain, sig, self._key.key_id, round(self._clock() * 1_000_000)
            )
        )
        self._last_cp_seq = seq

    def _seal_locked(self, items: list[_Item]) -> None:
        """Compute canonical bytes and chain hashes; layout in :mod:`kvgov.audit.chain`."""
        prev: bytes = self._head_hash
        prev_row = bytearray(prev)
        stream = self._stream
        out = self._pending_events
        every = self._checkpoint_every
        encode = fast_json
        encode_ids = self._block_ids_json
        sha256 = hashlib.sha256
        scope_of, request_of = _SCOPE, _REQUEST
        scope_json = self._scope_json
        prefix = canonical_prefix(stream)
        for seq, time_us, ev in items:
            scope = scope_of(ev)  # str or None only: equal tuples have equal JSON
            head = scope_json.get(scope)
            if head is None:
                if len(scope_json) >= _SCOPE_CACHE_SIZE:
                    scope_json.clear()
                head = scope_json[scope] = encode(scope)[1:-1]
            request = request_of(ev)
            bids = encode_ids(ev.block_ids)
            det = encode(ev.details) if ev.details else "{}"
            text = f"{prefix}{seq},{time_us},{head},{encode(request)[1:-1]},{bids},{det}]"
            h = sha256(prev + text.encode("ascii")).digest()
            # the row holds the hashes as bytearrays: the sqlite3 driver binds those
            # directly, bytes only after an adapter lookup (half a microsecond a row)
            h_row = bytearray(h)
            out.append((stream, seq, time_us, *scope, *request, bids, det, prev_row, h_row))
            prev, prev_row = h, h_row
            if seq % every == 0:
                self._checkpoint_locked(seq, ChainHash(h))
        if items:
            self._head_seq = items[-1][0]
            self._head_hash = ChainHash(prev)

    def _persist_locked(self) -> None:
        events, cps, keys = self._pending_events, self._pending_cps, self._pending_keys
        if not (events or cps or keys or self._spool_dirty):
            return
        last = int(events[-1][1]) if events else self._durable_seq
        now = time.monotonic()
        if now >= self._db_retry_at:
            try:
                with self._engine.begin() as conn:
                    if self._spool_dirty:
                        self._replay_spool(conn)
                    _insert_keys(conn, keys)
                    _insert_events(conn, events)
                    _insert_checkpoints(conn, cps)
            except Exception as exc:  # any driver or connection failure: spool instead
                self._db_retry_at = now + self._retry_seconds
                _log.warning("audit database write failed; spooling", error=str(exc))
                db_error = f"database: {exc}"
            else:
                if self._spool_dirty:
                    self._spool.remove()
                    self._spool_dirty = False
                    _log.info("audit spool replayed", spool=str(self._spool.path))
                self._pending_events, self._pending_cps, self._pending_keys = [], [], []
                self._durable_seq = last
                self._unavailable = None
                return
        else:
            db_error = "database: unreachable at the last attempt"
        if not (events or cps or keys):
            return  # only a spool replay was due; it stays spooled
        try:
            self._spool.append(events, cps, keys)
        except OSError as exc:
            self._unavailable = f"{db_error}; spool {self._spool.path}: {exc}"
            raise AuditUnavailable(self._unavailable) from exc
        self._spool_dirty = True
        self._pending_events, self._pending_cps = [], []
        # keys stay pending until they reach the database (the spool also holds them)
        self._durable_seq = last
        self._unavailable = None

    def _replay_spool(self, conn: Connection) -> None:
        contents = self._spool.read()
        after = _last_seq(conn, AuditEventRow, self._stream)
        cp_after = _last_seq(conn, AuditCheckpoint, self._stream)
        _insert_keys(conn, contents.keys)
        _insert_events(conn, [r for r in contents.events if r[1] > after])
        _insert_checkpoints(conn, [c for c in contents.checkpoints if c.seq > cp_after])
