"""``AuditLog``: the batched, background, bounded, never-lossy audit writer.

::

    caller threads                   writer thread                     keeper thread
    --------------                   -------------                     -------------
    record(event)                    every 50 ms, or when woken:       every max_age / 2:
      lock: seq = next_seq++           cv: pop events in seq order,      a database call
            deque.append(...)              seal (hash chain, checkpoints)  running longer than
      return "<stream>:<seq>"          database, WITHOUT the cv:          max_age, or no
                                         one transaction (refused         progress: cv: seal
    record(critical event)               records are isolated and         and spool everything
      wake the writer; wait on cv        quarantined, never block)
      until durable or the deadline;   cv: on success drop what was
      past the deadline: seal and          stored; on failure spool it
      spool here, on this thread       notify the waiters

``cv`` (a condition on one lock) guards the chain head, the sealed records not yet
durable, the spool and the quarantine; it is never held during a database call, so
a hung database (a frozen server, a partition) delays no caller past its deadline:
critical events and ``flush`` wait at most ``critical_deadline`` seconds and then
spool, the keeper spools anything a stuck call holds back after ``max_queue_age``.
Only the writer thread talks to the database once the log is open, so there is
never more than one statement in flight, and records the spool and the database
both hold are told apart on replay by ``seq``.

Event ids are ``"<stream>:<seq>"``: the stream (worker) id and the event's sequence
number in that stream, which is also the unique key ``(stream, seq)`` in the table.

Why a deque and not ``queue.Queue``: ``record`` must cost a few microseconds on the
caller's thread, and ``Queue.put`` takes a lock and signals a condition on every call.
The deque's ``append``/``popleft`` are atomic; sequence numbers are assigned and
appended under one small lock so that deque order is chain order, and only holders
of ``cv`` pop, so events are sealed in that order.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, Literal

import structlog
from sqlalchemy import Engine
from sqlalchemy.engine import URL

from kvgov.audit.durability import (
    AuditStats,
    Deferred,
    Recorded,
    RunMarker,
    derive_stream_id,
    gap_event,
    marker_path,
    positive_seconds,
    quarantine_gap_event,
)
from kvgov.audit.events import CRITICAL_EVENT_TYPES, AuditEvent
from kvgov.audit.outbox import Outbox, Snapshot
from kvgov.audit.persist import HeldConnection, Refusal, first_line, load_head
from kvgov.audit.sealer import Item, Sealer
from kvgov.audit.signing import SigningKey, load_signing_key
from kvgov.audit.spool import (
    KeyRecord,
    Quarantine,
    Spool,
    SpoolContents,
    default_spool_path,
    quarantine_path,
)
from kvgov.audit.store import mask_url, normalize_url, open_engine
from kvgov.defaults import (
    AUDIT_BATCH_SIZE,
    AUDIT_CRITICAL_DEADLINE_SECONDS,
    AUDIT_MAX_QUEUE_AGE_SECONDS,
    AUDIT_QUEUE_SIZE,
    AUDIT_STATEMENT_TIMEOUT_SECONDS,
    AUDIT_URL,
    CHECKPOINT_EVERY,
    CHECKPOINT_SECONDS,
)
from kvgov.exceptions import AuditError, AuditUnavailable, InvalidAuditEvent
from kvgov.retry import Backoff
from kvgov.schema import TEXT_LIMITS, text_problem

__all__ = ["AuditLog"]

_log = structlog.get_logger("kvgov.audit")

#: Seconds between the starts of two writer passes (sooner when woken: a critical event, a flush).
WRITER_INTERVAL_SECONDS: Final = 0.05
#: Passes in a row that found nothing to write after which the writer stops passing every
#: interval and sleeps until the next event (which wakes it), a flush, or
#: ``IDLE_POLL_SECONDS``: an idle writer's pass costs 30-100 us of CPU, its caches
#: being cold, 20 times a second otherwise.
IDLE_AFTER_PASSES: Final = 4
#: Seconds an idle writer sleeps at most (its checkpoint cadence needs no more).
IDLE_POLL_SECONDS: Final = 1.0
#: Where an ``AuditLog`` seals and stores: ``"thread"`` (this process, a background
#: thread) or ``"process"`` (an audit writer process of its own, :mod:`kvgov.audit.handoff`).
WriterKind = Literal["thread", "process"]
WRITERS: Final = ("thread", "process")
#: Least seconds after a database failure before it is tried again (events are spooled
#: meanwhile); doubled per failure in a row up to the max, plus jitter (kvgov.retry).
DB_RETRY_SECONDS, DB_RETRY_MAX_SECONDS = 1.0, 30.0


def checked_stream(worker_id: str | None, checkpoint_every: int, batch_size: int) -> str:
    """A log's stream id (``worker_id``, or one derived for this process), its counts checked.

    Raises:
        InvalidAuditEvent: the stream id is empty or too long, a count is below 1.
    """
    stream = worker_id if worker_id is not None else derive_stream_id()
    problem = text_problem(stream, TEXT_LIMITS["stream"]) if stream else "is empty"
    if problem is not None:
        raise InvalidAuditEvent("worker_id", problem)
    for name, value in (("checkpoint_every", checkpoint_every), ("batch_size", batch_size)):
        if value < 1:
            raise InvalidAuditEvent(name, "must be at least 1")
    return stream


class AuditLog:
    """Append hash-chained audit events for one stream, in batches, off the caller's thread.

    Non-critical events are queued and written by a background thread; critical ones
    (:data:`kvgov.audit.CRITICAL_EVENT_TYPES`) are durable, after everything queued
    before them, when ``record`` returns: in the database, or, when it is down or does
    not answer within ``critical_deadline``, in the local spool file (same chain),
    replayed in order when it answers again. :meth:`record_durable` says which.
    When neither can be written, critical ``record`` calls, ``flush`` and
    ``raise_if_unavailable`` raise :class:`~kvgov.exceptions.AuditUnavailable`, and the
    events are kept in memory and retried. Records the database refuses (it should
    never, events are validated when made) are quarantined, not retried forever.

    A new stream signs a checkpoint at seq 0; then every ``checkpoint_every`` events,
    every ``checkpoint_seconds`` while events wait unsigned, and at ``close`` the
    writer signs ``(stream, seq, chain hash)`` with Ed25519. With no key configured
    (argument or ``KVGOV_SIGNING_KEY``) an ephemeral key is generated and its public key
    recorded in ``audit_keys``; verifiers report such checkpoints as untrusted.

    A stream id must be used by one process at a time; a restarted worker that passes
    the same ``worker_id`` (and spool path) continues its chain from the last stored
    and spooled event, and records an ``audit_gap`` event if the previous writer
    stopped without ``close()``.

    Args:
        url: the audit database URL.
        worker_id: the stream id; None derives ``<hostname>-<pid>-<8 hex>``.
        signing_key: a key, PEM text, or a path; None reads ``KVGOV_SIGNING_KEY``.
        clock: seconds since the epoch (UTC), for event times.
        checkpoint_every: events between two signed checkpoints.
        checkpoint_seconds: seconds unsigned events may wait for a checkpoint.
        spool_path: the spool file; None puts it next to a SQLite file, else in the
            working directory, named after the stream. Its quarantine and run marker
            go next to it.
        batch_size: events per database round trip.
        queue_size: events queued before ``record`` blocks the caller.
        retry_seconds: least seconds after a database failure before it is tried again.
        auto_upgrade: passed to :func:`kvgov.audit.store.open_engine`.
        critical_deadline: seconds a critical event (and ``flush``, without progress)
            waits for the database before it is spooled instead.
        max_queue_age: seconds an event may stay only in memory behind a database
            call that has not returned before it is spooled.
        statement_timeout: seconds one database statement may run.
        writer: ``"thread"`` (the default: a writer thread in this process) or
            ``"process"``: a writer process of its own seals and stores, the caller's
            cost per event is a hand-off (:class:`kvgov.audit.handoff.ProcessAuditLog`,
            which this then is; docs/audit.md, "The writer process").

    Raises:
        AuditSchemaError: the database is not at the head revision.
        AuditUnavailable: the database cannot be reached at start.
        InvalidAuditEvent: an argument is out of range (named in ``field``).
        SigningKeyError: the configured signing key cannot be loaded.
    """

    def __new__(cls, *args: Any, writer: str = "thread", **kwargs: Any) -> AuditLog:
        if writer not in WRITERS:
            known = ", ".join(WRITERS)
            raise InvalidAuditEvent("writer", f"must be one of {known}, got {writer!r}")
        if cls is AuditLog and writer in WRITER_CLASSES:
            return super().__new__(WRITER_CLASSES[writer])
        return super().__new__(cls)

    def _configure(
        self,
        url: str | URL,
        worker_id: str | None,
        signing_key: Any,
        clock: Callable[[], float],
        checkpoint_every: int,
        checkpoint_seconds: float,
        spool_path: str | os.PathLike[str] | None,
        batch_size: int,
        queue_size: int,
        critical_deadline: float,
        max_queue_age: float,
        statement_timeout: float,
    ) -> tuple[str, Path]:
        """Check the settings both writers take and keep what both use: the URL, stream,
        clock, batch and queue sizes, deadlines and signing key. Returns the stream and
        the spool path (the constructor's arguments are documented on the class).

        Raises:
            InvalidAuditEvent: an argument is out of range (named in ``field``).
            SigningKeyError: the configured signing key cannot be loaded.
        """
        stream = checked_stream(worker_id, checkpoint_every, batch_size)
        self._critical_deadline = positive_seconds("critical_deadline", critical_deadline)
        self._max_queue_age = positive_seconds("max_queue_age", max_queue_age)
        self._checkpoint_seconds = positive_seconds("checkpoint_seconds", checkpoint_seconds)
        positive_seconds("statement_timeout", statement_timeout)
        self._url = normalize_url(url)
        self._stream = stream
        self._clock = clock
        self._batch_size = batch_size
        self._queue_size = max(queue_size, batch_size)
        loaded = load_signing_key(signing_key)
        self._key = loaded if loaded is not None else SigningKey.ephemeral()
        path = Path(spool_path) if spool_path is not None else default_spool_path(self._url, stream)
        return stream, path

    def __init__(
        self,
        url: str | URL = AUDIT_URL,
        worker_id: str | None = None,
        signing_key: Any = None,
        *,
        clock: Callable[[], float] = time.time,
        checkpoint_every: int = CHECKPOINT_EVERY,
        checkpoint_seconds: float = CHECKPOINT_SECONDS,
        spool_path: str | os.PathLike[str] | None = None,
        batch_size: int = AUDIT_BATCH_SIZE,
        queue_size: int = AUDIT_QUEUE_SIZE,
        retry_seconds: float = DB_RETRY_SECONDS,
        auto_upgrade: bool | None = None,
        critical_deadline: float = AUDIT_CRITICAL_DEADLINE_SECONDS,
        max_queue_age: float = AUDIT_MAX_QUEUE_AGE_SECONDS,
        statement_timeout: float = AUDIT_STATEMENT_TIMEOUT_SECONDS,
        writer: WriterKind = "thread",
    ) -> None:
        stream, path = self._configure(
            url, worker_id, signing_key, clock, checkpoint_every, checkpoint_seconds,
            spool_path, batch_size, queue_size, critical_deadline, max_queue_age,
            statement_timeout,
        )  # fmt: skip
        spool = Spool(path, self._key, stream)  # seals each spooled batch with the key
        self._marker = marker_path(path)
        timeout = statement_timeout
        try:
            self._engine: Engine = open_engine(
                self._url, auto_upgrade=auto_upgrade, statement_timeout=timeout
            )
        except AuditError:
            raise
        except Exception as exc:
            raise AuditUnavailable(f"cannot open the audit database: {exc}") from exc
        try:
            head = load_head(self._engine, stream, spool)
        except Exception as exc:
            self._engine.dispose()
            raise AuditUnavailable(f"cannot read the audit database: {exc}") from exc

        self._lock = threading.Lock()  # guards next_seq, deque order and closed
        self._cv = threading.Condition()  # guards everything below (see the module doc)
        self._dq: deque[Item] = deque()
        self._wake = threading.Event()
        #: the writer sleeps until woken (IDLE_AFTER_PASSES): the next event wakes it
        self._sleeping = False
        self._stop = False
        self._closed = False
        #: close() gave up on a database call in flight and spooled everything: the
        #: spool belongs to the next writer of the stream, this thread touches nothing more
        self._handed_over = False
        self._keeper_stop = threading.Event()
        self._db_backoff = Backoff(retry_seconds, DB_RETRY_MAX_SECONDS)
        self._db_since: float | None = None  # monotonic start of the call in flight
        self._db_error: str | None = None
        self._persists = 0  # persist attempts finished (flush waits for a new one)
        self._db = HeldConnection(self._engine)  # the writer thread's, between passes
        now_us = round(clock() * 1_000_000)
        key = KeyRecord(self._key.key_id, self._key.public_raw, self._key.origin, stream, now_us)
        self._out = Outbox(
            spool, Quarantine(quarantine_path(path)), stream, head.seq, key,
            lambda: round(self._clock() * 1_000_000),
        )  # fmt: skip
        self._sealer = Sealer(
            stream, self._key, clock, head.seq, head.hash, head.last_checkpoint,
            checkpoint_every, self._checkpoint_seconds,
        )  # fmt: skip
        self._next_seq = head.seq + 1
        database = mask_url(self._url)
        previous = RunMarker.read(self._marker)
        if previous is not None and previous.database in ("", database):
            self._enqueue(gap_event(previous, head.seq))
        with contextlib.suppress(AuditUnavailable):
            self._pass()  # replays a leftover spool, records the key and any gap event
        try:
            RunMarker.now(stream, database, now_us).write(self._marker)
        except OSError as exc:
            _log.warning("audit run marker not written", path=str(self._marker), error=str(exc))

        self._thread = threading.Thread(target=self._run, name=f"kvgov-audit-{stream}", daemon=True)
        self._thread.start()
        self._keeper = threading.Thread(
            target=self._keep, name=f"kvgov-keeper-{stream}", daemon=True
        )
        self._keeper.start()
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
        return self._out.spool.path

    @property
    def spooled(self) -> bool:
        """Whether events are waiting in the spool for the database to return."""
        return self._out.spool_dirty

    def record(self, event: AuditEvent) -> str:
        """Append an event to this stream.

        A critical event is durable when this returns (see :meth:`record_durable`,
        which also says whether it is in the database or only spooled). Returns the
        event id, ``"<stream>:<seq>"``.

        Raises:
            AuditUnavailable: a critical event could not be written to the database or
                the spool (the caller must refuse the operation), the queue is full
                while storage is failing, or the log is closed.
            InvalidAuditEvent: ``event`` is not an :class:`AuditEvent`.
        """
        seq = self._enqueue(event)
        if event.type in CRITICAL_EVENT_TYPES:
            self._await_durable(seq)
        else:
            n = len(self._dq)
            if n >= self._batch_size and not self._wake.is_set():
                self._wake.set()
            if n >= self._queue_size:
                self._backpressure()
        return f"{self._stream}:{seq}"

    def record_durable(self, event: AuditEvent) -> Recorded:
        """Append an event; return once it is durable (database, or spool past the deadline).

        Waits at most ``critical_deadline`` s, less once the call in flight has hung for
        ``max_queue_age``; then it spools the event (and all before it) on this thread.

        Returns:
            The event id and its evidence, ``"stored"`` or ``"spooled"`` (with why).

        Raises:
            AuditUnavailable: neither the database nor the spool could be written (the
                caller must refuse the operation), or the log is closed.
            InvalidAuditEvent: ``event`` is not an :class:`AuditEvent`.
        """
        return self.defer(event).wait()

    def defer(self, event: AuditEvent) -> Deferred:
        """Append an event now (its chain place is fixed); its ``wait()`` makes it durable.

        For a caller holding a lock of its own: defer under the lock, ``wait()`` (as
        :meth:`record_durable`, raising the same) after releasing it.
        """
        seq = self._enqueue(event)
        self._wake.set()
        return Deferred(f"{self._stream}:{seq}", lambda: self._await_durable(seq))

    def raise_if_unavailable(self) -> None:
        """Cheap check for callers about to do something that must be audited.

        Raises:
            AuditUnavailable: the last write reached neither the database nor the spool.
        """
        reason = self._out.unavailable
        if reason is not None:
            raise AuditUnavailable(reason)

    def stats(self) -> AuditStats:
        """A consistent snapshot of this log's write state.

        Returns:
            The counters and sequence numbers (see :class:`AuditStats`).
        """
        with self._lock:
            recorded, queued = self._next_seq - 1, len(self._dq)
        with self._cv:
            return self._out.stats(recorded, self._db_error, queued)

    def flush(self) -> None:
        """Write everything recorded so far (database, or spool while it is down).

        Tries the database now (whatever ``retry_seconds`` says) and replays the spool
        when it is reachable again. Waits while the writer makes progress; after
        ``critical_deadline`` seconds without progress, or when two attempts could
        write nowhere, the rest is spooled on the caller's thread (or kept in memory).

        Raises:
            AuditUnavailable: some events could be written neither to the database nor
                to the spool (they stay in memory and are retried).
        """
        with self._lock:
            target = self._next_seq - 1
        with self._cv:
            begun = self._persists
            self._db_backoff.retry_now()  # an explicit flush tries the database now
            self._wake.set()
            why = self._wait_locked(
                lambda: (
                    self._out.durable_seq >= target
                    and (not self._out.spool_dirty or self._persists >= begun + 2)
                )
            )
            if self._out.durable_seq < target:
                self._spool_now_locked(why or "the audit database did not answer (flush)")
        if self._out.durable_seq < target:
            raise AuditUnavailable(self._out.unavailable or "events are still pending")

    def close(self) -> None:
        """Flush, sign a final checkpoint, stop the writer thread, release the database.

        Bounded: it waits while the writer makes progress, but spools the rest at once
        when a database call has not returned for ``max_queue_age`` (a hung database),
        and after ``critical_deadline`` seconds without progress.

        Raises:
            AuditUnavailable: the final events could not be written anywhere (the run
                marker stays, so the next start of this stream records the gap).
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        atexit.unregister(self._atexit)
        self._stop = True
        self._db_backoff.retry_now()  # the final pass tries the database once more
        self._wake.set()
        with self._cv:
            why = self._wait_locked(lambda: not self._thread.is_alive(), poll=0.01, hang=True)
            if self._thread.is_alive():  # stuck in a database call: spool the rest
                self._spool_now_locked(why or "the audit database did not answer (close)", True)
                self._handed_over = True  # the thread stops when its call returns
        self._keeper_stop.set()
        self._keeper.join()
        if not self._thread.is_alive():
            self._engine.dispose()
        with self._lock:
            last = self._next_seq - 1
        if self._out.durable_seq < last:
            raise AuditUnavailable(self._out.unavailable or "events are still pending")
        with contextlib.suppress(OSError):
            self._marker.unlink(missing_ok=True)

    def __enter__(self) -> AuditLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ queue

    def _enqueue(self, event: AuditEvent) -> int:
        if type(event) is not AuditEvent:
            raise InvalidAuditEvent("event", "record() takes an audit.AuditEvent")
        with self._lock:
            if self._closed:
                raise AuditUnavailable("the audit log is closed")
            seq = self._next_seq
            self._next_seq = seq + 1
            self._dq.append((seq, round(self._clock() * 1_000_000), event))
        if self._sleeping:
            self._wake_from_idle()
        return seq

    def _wake_from_idle(self) -> None:
        """The first event after an idle spell (IDLE_AFTER_PASSES): the writer passes now.

        Callers test ``_sleeping`` first (an attribute read on the recording path), after
        queueing the event; see :meth:`_run` for why that order loses no wake-up.
        """
        self._sleeping = False
        self._wake.set()

    def _give_up(self, end: float, begun: int, hang: bool) -> str | None:
        """Why a caller waiting on ``cv`` stops waiting for the writer, or None.

        It stops at its deadline ``end``, when two database attempts made since it
        started waiting (``begun``) could write nowhere, and (``hang``) when the
        database call in flight has not returned for ``max_queue_age``.
        """
        now = time.monotonic()
        if now >= end:
            return f"the audit database did not answer within {self._critical_deadline:g} s"
        if self._out.unavailable is not None and self._persists >= begun + 2:
            return self._db_error or "the audit database is unavailable"
        since = self._db_since
        if hang and since is not None and now - since >= self._max_queue_age:
            return f"an audit database call has not returned for {self._max_queue_age:g} s"
        return None

    def _next_wake(self, end: float, hang: bool) -> float:
        """Seconds until ``end`` or (``hang``) until the call in flight is hung."""
        since = self._db_since
        wake = end - time.monotonic()
        if hang and since is not None:
            wake = min(wake, since + self._max_queue_age - time.monotonic())
        return max(wake, 0.001)

    def _await_durable(self, seq: int) -> Recorded:
        end = time.monotonic() + self._critical_deadline
        with self._cv:
            begun = self._persists
            self._wake.set()
            while self._out.durable_seq < seq:
                why = self._give_up(end, begun, hang=True)
                if why is not None:
                    self._spool_now_locked(why)  # raises AuditUnavailable if the spool fails
                    break
                self._cv.wait(self._next_wake(end, hang=True))
            if self._out.durable_seq < seq:  # pragma: no cover - _spool_now_locked raised
                raise AuditUnavailable(self._out.unavailable or "the event could not be written")
            event_id = f"{self._stream}:{seq}"
            if seq <= self._out.stored_seq:
                return Recorded(event_id, "stored")
            return Recorded(event_id, "spooled", self._out.spool_reason or self._db_error)

    def _wait_locked(
        self, done: Callable[[], bool], poll: float | None = None, *, hang: bool = False
    ) -> str | None:
        """Wait on ``cv`` for ``done()`` (deadline reset on progress); else say why not."""
        begun, durable = self._persists, self._out.durable_seq
        end = time.monotonic() + self._critical_deadline
        while not done():
            if self._out.durable_seq != durable:
                durable, end = self._out.durable_seq, time.monotonic() + self._critical_deadline
            why = self._give_up(end, begun, hang)
            if why is not None:
                return why
            wait = self._next_wake(end, hang)
            self._cv.wait(wait if poll is None else min(poll, wait))
        return None

    def _backpressure(self) -> None:
        while len(self._dq) >= self._queue_size:
            self.raise_if_unavailable()
            self._wake.set()
            time.sleep(0.001)

    # ------------------------------------------------------------------ threads

    def _atexit(self) -> None:
        try:
            self.close()
        except AuditError as exc:  # pragma: no cover - interpreter shutdown
            print(f"kvgov audit: events lost at exit: {exc}", file=sys.stderr)

    def _run(self) -> None:
        due = time.monotonic()
        empty = 0  # passes in a row that found nothing to write
        while True:  # one pass per interval from the last one's start, sooner when woken
            wait = max(0.0, due - time.monotonic())
            if empty >= IDLE_AFTER_PASSES:
                # idle: sleep until an event wakes us (see _enqueue). The flag goes up
                # before the queue is looked at, so an event queued meanwhile is seen
                # here or sees the flag and wakes us.
                self._sleeping = True
                wait = 0.0 if self._dq else IDLE_POLL_SECONDS
            self._wake.wait(wait)
            self._sleeping = False
            self._wake.clear()
            due = time.monotonic() + WRITER_INTERVAL_SECONDS
            final = self._stop
            worked = True
            try:
                worked = self._pass(final=final)
            except AuditUnavailable:
                pass  # kept in self._out.unavailable; the events stay pending
            except Exception:  # a bug: say so, keep writing
                _log.exception("audit writer pass failed")
            empty = 0 if worked else empty + 1
            if self._handed_over or final:
                self._db.release()
                if self._handed_over:  # close() returned: its spool is the next writer's
                    self._engine.dispose()
                return

    def _keep(self) -> None:
        """Spool what a database call holds back too long, or what nobody writes."""
        period = self._max_queue_age / 2
        mark = durable = 0
        while not self._keeper_stop.wait(period):
            since = self._db_since
            stuck = since is not None and time.monotonic() - since >= self._max_queue_age
            # no call in flight, yet nothing became durable while events waited a period
            idle = since is None and self._out.durable_seq == durable < mark
            durable = self._out.durable_seq
            with self._lock:
                mark = self._next_seq - 1
            if (stuck or idle) and self._out.durable_seq < mark:
                with self._cv, contextlib.suppress(AuditUnavailable):
                    self._spool_now_locked("the audit database or its writer is not keeping up")

    # ------------------------------------------------------------------ sealing

    def _seal_from_queue_locked(self, limit: int, final: bool) -> None:
        """Pop up to ``limit`` queued events and seal them, with the checkpoints due."""
        dq = self._dq
        n = min(len(dq), limit)
        if n:
            self._sealer.seal(
                [dq.popleft() for _ in range(n)], self._out.events, self._out.checkpoints
            )
        self._sealer.checkpoint_if_due(final and not dq, self._out.checkpoints)

    # ------------------------------------------------------------------ persisting

    def _pass(self, *, final: bool = False) -> bool:
        """Seal and persist a batch; more only while full ones wait (no back-to-back commits).

        Returns:
            Whether there was anything to write (events, checkpoints, a spool to replay).
        """
        worked = False
        while True:
            with self._cv:
                if self._handed_over:
                    return worked
                self._seal_from_queue_locked(self._batch_size, final)
                snap = self._out.snapshot()
            if snap is not None:
                worked = True
                self._persist(snap)
            if not self._dq or (not final and len(self._dq) < self._batch_size):
                return worked

    def _persist(self, snap: Snapshot) -> None:
        """Write a snapshot to the database (without ``cv``), or spool it."""
        refusals: list[Refusal] | None = None
        replay: SpoolContents | None = None
        notes: list[str] = []  # where the replay does not continue the chain
        now = time.monotonic()
        if self._db_backoff.ready(now):
            with self._cv:  # waiters re-time their wait: this call may hang
                self._db_since = now
                self._cv.notify_all()
            try:
                replay = self._out.spool.read() if snap.replay else None
                refusals = self._db.store(self._stream, replay, snap.records, notes)
                self._db_backoff.succeeded()
            except Exception as exc:  # unreachable, timed out, no schema, no permission
                self._db_backoff.failed()
                self._db_error = f"database: {first_line(exc)}"
                _log.warning("audit database write failed; spooling", error=str(exc))
            finally:
                self._db_since = None
        with self._cv:
            try:
                if self._handed_over:  # the call outlived close(): leave outbox and spool be
                    return
                if refusals is not None:
                    self._db_error = None
                    damaged = len(replay.damaged) if replay is not None else 0
                    if replay is not None:  # failed authentication: quarantined, reported
                        refusals += [Refusal(r, why) for r, why in replay.rejected]
                        notes = [*replay.breaks, *notes]
                    if self._out.stored(snap, replay, refusals) and (refusals or damaged or notes):
                        self._enqueue_gap_locked(refusals, damaged, notes)
                else:
                    self._out.spool_pending(self._db_error or "database: unavailable")
            finally:
                self._persists += 1
                self._cv.notify_all()

    def _enqueue_gap_locked(self, refusals: list[Refusal], damaged: int, notes: list[str]) -> None:
        """Queue an ``audit_gap`` event naming records kept in the quarantine, not the store,
        and spool batches found missing."""
        event = quarantine_gap_event(refusals, damaged, self._out.quarantine.path, notes)
        with self._lock:  # even when closed: the pass in progress seals it
            seq = self._next_seq
            self._next_seq = seq + 1
            self._dq.append((seq, round(self._clock() * 1_000_000), event))

    def _spool_now_locked(self, reason: str, final: bool = False) -> None:
        """Seal everything queued and spool everything pending, on the caller's thread."""
        self._seal_from_queue_locked(len(self._dq), final)
        self._out.spool_pending(reason)
        self._cv.notify_all()


#: ``AuditLog(writer=...)``'s classes besides this one, registered by their modules
#: (:mod:`kvgov.audit.handoff` registers ``"process"``; ``kvgov.audit`` imports it).
WRITER_CLASSES: dict[str, type[AuditLog]] = {}
