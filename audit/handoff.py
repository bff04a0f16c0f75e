"""``AuditLog(writer="process")``: the engine hands compact records to a writer process.

::

    engine (caller threads)        engine: sender thread           writer process
    -----------------------        ---------------------           --------------
    record(event)                  every 50 ms, or when woken:     an AuditLog (writer and
      lock: seq = next_seq++         swap the pending list;          keeper threads, spool,
            pending.append(          keep it (retained) until        quarantine, checkpoints)
              (seq, time_us,         the writer says durable;        appends each record at
               event's fields))      one pickled frame to the        the engine's seq, seals,
      return "<stream>:<seq>"        writer's stdin                  stores; acknowledges
                                                                     what is durable
    record(critical event)         engine: reader thread
      wake the sender; wait until  reads the acknowledgements:
      the writer says durable,     durable / stored seq, stats;
      within critical_deadline;    on end of file (the writer died)
      writer down or no answer:    marks it down (callers fail
      AuditUnavailable             closed) and starts a new one,
                                   which continues the chain; the
                                   retained records are sent again

The engine's cost per event is the hand-off: the event appended under a lock, and on
the sender thread one tuple of its fields (:func:`kvgov.audit.events.packed_record`:
one C call, and many block ids packed into one buffer) pickled with the batch and
written to the pipe. The
writer process seals (hash chain, signatures), stores and spools with the same rules
as the in-process writer, whose code it runs (:mod:`kvgov.audit.writer_process`).

Durability (docs/audit.md): a critical event is in the database or the spool when
``record`` returns, else it raises :class:`~kvgov.exceptions.AuditUnavailable`; the
writer process spools it itself when the database does not answer within 80% of
``critical_deadline`` and acknowledges, the engine waits at most ``critical_deadline``.
The engine keeps every record until the writer says it is durable, so a writer
killed at any point loses nothing: its successor reads the head from the database
and the spool, and the engine sends what is beyond it again (no ``audit_gap``: the
chain has no hole). An engine that dies loses only what it had not yet handed over
(at most one sender interval): the writer sees its pipe close, writes everything it
received and keeps the run marker, so that the engine's next start records the
``audit_gap``.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import os
import select
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, Final

import structlog
from sqlalchemy.engine import URL

from kvgov.audit.durability import AuditStats, Deferred, Recorded
from kvgov.audit.events import CRITICAL_EVENT_TYPES, AuditEvent, packed_record
from kvgov.audit.wire import WireClosed, read_frame, write_frame
from kvgov.audit.writer import (
    DB_RETRY_SECONDS,
    WRITER_CLASSES,
    WRITER_INTERVAL_SECONDS,
    AuditLog,
    WriterKind,
)
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
from kvgov.exceptions import AuditError, AuditSchemaError, AuditUnavailable, InvalidAuditEvent
from kvgov.retry import Backoff

__all__ = ["WRITER_DEADLINE_SHARE", "ProcessAuditLog"]

_log = structlog.get_logger("kvgov.audit")

#: The share of ``critical_deadline`` the writer process waits for the database before
#: it spools a critical event; the rest is the engine's margin for the acknowledgement.
WRITER_DEADLINE_SHARE: Final = 0.8
#: Seconds a writer process may take to start (open the database, read the head).
STARTUP_SECONDS: Final = 60.0
#: Least and most seconds between two attempts to start a writer after one died.
RESTART_SECONDS, RESTART_MAX_SECONDS = 0.05, 5.0

#: (seq, time_us, event) until handed over, then (seq, time_us, record); a writer's own
#: gap event is (seq, time_us, record, token)
Item = tuple[Any, ...]


@dataclasses.dataclass
class _Link:
    """One writer process and the two pipes to it."""

    proc: subprocess.Popen[bytes]
    to_writer: int
    from_writer: IO[bytes]
    head: int
    key_id: str
    spool_path: Path


def _startup_error(kind: str, args: tuple[Any, ...]) -> AuditError:
    if kind == "schema":
        return AuditSchemaError(*args)
    if kind == "invalid":
        return InvalidAuditEvent(*args)
    return AuditUnavailable(*args)


class ProcessAuditLog(AuditLog):
    """An :class:`AuditLog` whose writer runs in a process of its own.

    Made by ``AuditLog(..., writer="process")``, with the same arguments, methods and
    guarantees; see the module doc for how. Differences: ``clock`` stamps the events
    (here, at ``record``), while the writer process's own times (checkpoints, gap
    events) are its ``time.time``; a critical event's wait has a second bound, the
    writer process's acknowledgement within ``critical_deadline``; while the writer
    process is down (killed, crashed; a new one is being started) critical events,
    ``flush`` and ``raise_if_unavailable`` raise
    :class:`~kvgov.exceptions.AuditUnavailable` at once, ordinary events are kept.

    Raises:
        AuditSchemaError: the database is not at the head revision.
        AuditUnavailable: the database cannot be reached at start, or the writer
            process does not start.
        InvalidAuditEvent: an argument is out of range (named in ``field``).
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
        checkpoint_seconds: float = CHECKPOINT_SECONDS,
        spool_path: str | os.PathLike[str] | None = None,
        batch_size: int = AUDIT_BATCH_SIZE,
        queue_size: int = AUDIT_QUEUE_SIZE,
        retry_seconds: float = DB_RETRY_SECONDS,
        auto_upgrade: bool | None = None,
        critical_deadline: float = AUDIT_CRITICAL_DEADLINE_SECONDS,
        max_queue_age: float = AUDIT_MAX_QUEUE_AGE_SECONDS,
        statement_timeout: float = AUDIT_STATEMENT_TIMEOUT_SECONDS,
        writer: WriterKind = "process",
    ) -> None:
        stream, path = self._configure(
            url, worker_id, signing_key, clock, checkpoint_every, checkpoint_seconds,
            spool_path, batch_size, queue_size, critical_deadline, max_queue_age,
            statement_timeout,
        )  # fmt: skip
        self._settings: dict[str, Any] = {
            "url": self._url.render_as_string(hide_password=False),
            "worker_id": stream,
            "signing_key": (self._key.private_key.private_bytes_raw(), self._key.origin),
            "checkpoint_every": checkpoint_every,
            "checkpoint_seconds": checkpoint_seconds,
            "spool_path": str(path),
            "batch_size": batch_size,
            "queue_size": self._queue_size,
            "retry_seconds": retry_seconds,
            "auto_upgrade": auto_upgrade,
            "critical_deadline": critical_deadline * WRITER_DEADLINE_SHARE,
            "max_queue_age": max_queue_age,
            "statement_timeout": statement_timeout,
        }
        # the hand-off: guards next_seq, pending, controls and closed
        self._lock = threading.Lock()
        self._pending: list[Item] = []
        self._controls: list[tuple[Any, ...]] = []
        self._closed = False
        self._token = 0
        # the writer's side: guards everything below
        self._cv = threading.Condition(threading.Lock())
        self._retained: deque[Item] = deque()  # handed over, not yet durable, in seq order
        self._down: str | None = None  # why no writer process serves now
        self._failed: tuple[int, str] = (0, "")  # the writer could not make seqs <= this durable
        self._replies: dict[int, str | None] = {}
        self._waiting: set[int] = set()
        self._close_reply: tuple[bool, str | None] = (False, None)
        self._closing = False
        self._spool_reason: str | None = None
        self._writer_cpu = 0.0
        self._send_lock = threading.Lock()  # one sender of frames; held across a restart
        self._wake = threading.Event()  # something waits to be handed over
        self._hurry = threading.Event()  # ... and should go now, not at the interval
        self._stop = False

        link = self._spawn(resume=False)
        self._link = link
        self._durable = self._stored = link.head
        self._next_seq = link.head + 1
        head = link.head
        self._stats = AuditStats(stream, head, head, head, 0, 0, 0, 0, (), None, None)
        self._sender = threading.Thread(
            target=self._send_loop, name=f"kvgov-audit-handoff-{stream}", daemon=True
        )
        self._reader = threading.Thread(
            target=self._read_loop, name=f"kvgov-audit-acks-{stream}", daemon=True
        )
        self._sender.start()
        self._reader.start()
        atexit.register(self._atexit)

    # ------------------------------------------------------------------ public API

    @property
    def spool_path(self) -> Path:
        """Where the writer process puts events while the database is unreachable."""
        return self._link.spool_path

    @property
    def spooled(self) -> bool:
        """Whether events are waiting in the spool for the database to return."""
        return self._stats.spooled > 0

    @property
    def writer_cpu_seconds(self) -> float:
        """CPU seconds the writer process had used at its last report (benchmarks).

        A ``flush`` ends with a fresh report. A new writer process (after one died)
        starts again from its own start.
        """
        return self._writer_cpu

    @property
    def writer_pid(self) -> int | None:
        """The writer process's id (None while none runs)."""
        with self._cv:
            return None if self._down is not None else self._link.proc.pid

    def record(self, event: AuditEvent) -> str:
        """Hand an event to the writer process; see :meth:`AuditLog.record`.

        Raises:
            AuditUnavailable: a critical event could not be made durable within
                ``critical_deadline`` (the writer process is down, or neither the
                database nor the spool could be written), the events the writer has
                not yet made durable fill the queue while it cannot, or the log is closed.
            InvalidAuditEvent: ``event`` is not an :class:`AuditEvent`.
        """
        if type(event) is not AuditEvent:
            raise InvalidAuditEvent("event", "record() takes an audit.AuditEvent")
        with self._lock:
            if self._closed:
                raise AuditUnavailable("the audit log is closed")
            seq = self._next_seq
            self._next_seq = seq + 1
            pending = self._pending
            pending.append((seq, round(self._clock() * 1_000_000), event))
            n = len(pending)
        if event.type in CRITICAL_EVENT_TYPES:
            self._await_durable(seq)
        elif n == 1:  # the first of an interval: the sender sleeps until there is one
            self._wake.set()
        elif n >= self._batch_size:
            if not self._hurry.is_set():
                self._hurry_up()
            if n + len(self._retained) >= self._queue_size:
                self._backpressure()
        return f"{self._stream}:{seq}"

    def defer(self, event: AuditEvent) -> Deferred:
        """Hand an event over now (its chain place is fixed); ``wait()`` makes it durable."""
        if type(event) is not AuditEvent:
            raise InvalidAuditEvent("event", "record() takes an audit.AuditEvent")
        with self._lock:
            if self._closed:
                raise AuditUnavailable("the audit log is closed")
            seq = self._next_seq
            self._next_seq = seq + 1
            self._pending.append((seq, round(self._clock() * 1_000_000), event))
        self._hurry_up()
        return Deferred(f"{self._stream}:{seq}", lambda: self._await_durable(seq))

    def raise_if_unavailable(self) -> None:
        """Raise while the writer process is down or can write neither database nor spool.

        Raises:
            AuditUnavailable: why.
        """
        reason = self._down or self._stats.unavailable
        if reason is not None:
            raise AuditUnavailable(reason)

    def stats(self) -> AuditStats:
        """The writer process's last reported state, with this side's counts.

        Returns:
            The counters and sequence numbers (see :class:`AuditStats`); ``queue_depth``
            adds the events not yet handed over.
        """
        with self._lock:
            recorded, pending = self._next_seq - 1, len(self._pending)
        with self._cv:
            st = self._stats
            return dataclasses.replace(
                st,
                recorded=recorded,
                durable_seq=self._durable,
                stored_seq=self._stored,
                queue_depth=st.queue_depth + pending,
                unavailable=self._down or st.unavailable,
            )

    def flush(self) -> None:
        """Have the writer process write everything recorded so far; see :meth:`AuditLog.flush`.

        Raises:
            AuditUnavailable: some events could be written neither to the database nor
                to the spool, or the writer process is down or does not answer.
        """
        with self._lock:
            target = self._next_seq - 1
            self._token += 1
            token = self._token
            self._controls.append(("F", token))
        with self._cv:
            self._waiting.add(token)
        self._hurry_up()
        try:
            self._wait_reply(lambda: token in self._replies, "flush")
        finally:
            with self._cv:
                self._waiting.discard(token)
                error = self._replies.pop(token, None)
        if error is not None:
            raise AuditUnavailable(error)
        if self._durable < target:
            raise AuditUnavailable(self._stats.unavailable or "events are still pending")

    def close(self) -> None:
        """Flush, have the writer process sign a final checkpoint and exit; stop the threads.

        Raises:
            AuditUnavailable: the final events could not be written anywhere, or the
                writer process is down (its run marker stays, so the next start of the
                stream records the gap).
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            last = self._next_seq - 1
            self._controls.append(("C",))
        atexit.unregister(self._atexit)
        error: str | None = None
        try:
            with self._cv:  # a writer being restarted gets its deadline to come back
                self._cv.wait_for(lambda: self._down is None, self._critical_deadline)
            self._hurry_up()
            self._wait_reply(lambda: self._close_reply[0], "close", closing=True)
            error = self._close_reply[1]
        except AuditUnavailable as exc:
            error = exc.reason
        finally:
            with self._cv:
                self._closing = True
                self._cv.notify_all()
            self._stop = True
            self._hurry_up()
            self._sender.join(self._critical_deadline)
            self._end_process(self._link)
            self._reader.join(self._critical_deadline)
        if error is not None:
            raise AuditUnavailable(error)
        if self._durable < last:
            raise AuditUnavailable(self._stats.unavailable or "events are still pending")

    # ------------------------------------------------------------------ waiting

    def _await_durable(self, seq: int) -> Recorded:
        self._hurry_up()
        end = time.monotonic() + self._critical_deadline
        with self._cv:
            while self._durable < seq:
                if self._failed[0] >= seq:
                    raise AuditUnavailable(self._failed[1])
                if self._down is not None:
                    raise AuditUnavailable(self._down)
                left = end - time.monotonic()
                if left <= 0:
                    raise AuditUnavailable(
                        f"the audit writer process did not acknowledge within "
                        f"{self._critical_deadline:g} s"
                    )
                self._cv.wait(left)
            event_id = f"{self._stream}:{seq}"
            if seq <= self._stored:
                return Recorded(event_id, "stored")
            reason = self._spool_reason or self._stats.database_error
            return Recorded(event_id, "spooled", reason)

    def _wait_reply(self, done: Callable[[], bool], what: str, closing: bool = False) -> None:
        """Wait on ``cv`` for ``done()`` while the writer makes progress; else raise."""
        with self._cv:
            durable = self._durable
            end = time.monotonic() + self._critical_deadline + self._max_queue_age
            while not done():
                if self._down is not None and not (closing and self._close_reply[0]):
                    raise AuditUnavailable(self._down)
                if self._durable != durable:  # progress: the deadline starts again
                    durable = self._durable
                    end = time.monotonic() + self._critical_deadline + self._max_queue_age
                left = end - time.monotonic()
                if left <= 0:
                    raise AuditUnavailable(f"the audit writer process did not answer ({what})")
                self._cv.wait(left)

    def _backpressure(self) -> None:
        while len(self._pending) + len(self._retained) >= self._queue_size:
            self.raise_if_unavailable()
            self._hurry_up()
            time.sleep(0.001)

    # ------------------------------------------------------------------ the writer process

    def _spawn(self, *, resume: bool) -> _Link:
        """Start a writer process and read its head.

        Raises:
            AuditError: it reported an error at start (the database's, typed), or did
                not start within ``STARTUP_SECONDS``.
        """
        env = dict(os.environ)
        package = sys.modules["kvgov"].__file__  # where this kvgov lives: the writer's too
        root = str(Path(str(package)).resolve().parents[1])
        env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
        proc = subprocess.Popen(
            [sys.executable, "-m", "kvgov.audit.writer_process"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            start_new_session=True,  # the terminal's ^C reaches the engine, not its writer
        )
        assert proc.stdin is not None and proc.stdout is not None
        to_writer = proc.stdin.fileno()
        try:
            write_frame(to_writer, ("CONFIG", {**self._settings, "resume": resume}))
            ready, _, _ = select.select([proc.stdout], [], [], STARTUP_SECONDS)
            if not ready:
                raise AuditUnavailable(
                    f"the audit writer process did not start within {STARTUP_SECONDS:g} s"
                )
            reply = read_frame(proc.stdout)
        except (WireClosed, AuditError) as exc:
            self._end_process_now(proc)
            if isinstance(exc, AuditError):
                raise
            raise AuditUnavailable(
                f"the audit writer process exited at start (status {proc.returncode})"
            ) from exc
        if reply[0] == "E":
            self._end_process_now(proc)
            raise _startup_error(reply[1], reply[2])
        _, head, key_id, spool_path = reply
        return _Link(proc, to_writer, proc.stdout, int(head), str(key_id), Path(spool_path))

    @staticmethod
    def _end_process_now(proc: subprocess.Popen[bytes]) -> None:
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()
        try:
            proc.wait(5.0)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()

    def _end_process(self, link: _Link) -> None:
        """Close the pipe to the writer (it finishes and exits); kill it if it overstays."""
        if link.proc.stdin is not None:
            with contextlib.suppress(OSError):
                link.proc.stdin.close()
        try:
            link.proc.wait(self._critical_deadline + self._max_queue_age + 5.0)
        except subprocess.TimeoutExpired:  # pragma: no cover - a hung writer at close
            _log.warning("audit writer process did not exit; killing it", pid=link.proc.pid)
            link.proc.kill()
            link.proc.wait()

    # ------------------------------------------------------------------ threads

    def _hurry_up(self) -> None:
        self._hurry.set()
        self._wake.set()

    def _send_loop(self) -> None:
        while True:  # asleep while nothing is pending; then one frame per interval, sooner
            self._wake.wait()  # when hurried (a critical event, a flush, a full batch)
            self._hurry.wait(WRITER_INTERVAL_SECONDS)
            self._wake.clear()
            self._hurry.clear()
            self._send_pending()
            if self._stop:
                return

    def _send_pending(self) -> None:
        with self._send_lock:
            with self._lock:
                items, self._pending = self._pending, []
                controls, self._controls = self._controls, []
            # the compact records: each event's fields as one tuple (a C call an event;
            # many block ids packed into one buffer)
            items = [(i[0], i[1], packed_record(i[2])) if len(i) == 3 else i for i in items]
            with self._cv:
                self._retained.extend(items)
                down = self._down is not None
            if down:  # kept: the next writer gets the items (retained) and the controls
                with self._lock:
                    self._controls[:0] = controls
                return
            try:
                if items:
                    write_frame(self._link.to_writer, ("R", items))
                for control in controls:
                    write_frame(self._link.to_writer, control)
            except WireClosed:
                pass  # the reader sees the end of its pipe and restarts the writer

    def _read_loop(self) -> None:
        backoff = Backoff(RESTART_SECONDS, RESTART_MAX_SECONDS)
        while True:
            link = self._link
            try:
                while True:
                    self._handle(read_frame(link.from_writer))
            except WireClosed:
                pass
            status = link.proc.wait()
            with self._cv:
                if self._closing or self._close_reply[0]:
                    return
                self._down = f"the audit writer process exited (status {status})"
                self._cv.notify_all()
            _log.error("audit writer process died; starting another", status=status)
            while True:
                with self._cv:
                    if self._closing:
                        return
                time.sleep(backoff.failed())
                try:
                    self._restart()
                except AuditError as exc:
                    with self._cv:
                        self._down = f"the audit writer process cannot be restarted: {exc}"
                        self._cv.notify_all()
                    continue
                backoff.succeeded()
                break

    def _restart(self) -> None:
        """Start a writer that continues the chain; send it what is not durable yet."""
        with self._send_lock:
            link = self._spawn(resume=True)
            with self._cv:
                if self._closing:  # close() gave up meanwhile: this writer just finishes
                    self._end_process_now(link.proc)
                    raise AuditUnavailable("the audit log is closed")
                items = [it for it in self._retained if it[0] > link.head]
                if items and items[0][0] != link.head + 1:
                    self._end_process_now(link.proc)
                    raise AuditUnavailable(
                        f"the audit trail holds events up to {link.head} but the engine "
                        f"kept them from {items[0][0]}: events were lost"
                    )
            try:
                if items:
                    write_frame(link.to_writer, ("R", items))
            except WireClosed as exc:
                raise AuditUnavailable("the new audit writer process exited") from exc
            with self._cv:
                self._link = link
                self._down = None
                self._durable = max(self._durable, link.head)
                self._cv.notify_all()
        _log.info("audit writer process restarted", pid=link.proc.pid, head=link.head)
        self._hurry_up()

    def _handle(self, frame: tuple[Any, ...]) -> None:
        tag = frame[0]
        if tag == "A":
            state, gaps = frame[1], frame[2]
            (stored, durable, spooled, spooled_total, quarantined, damaged, critical_spooled,
             db_error, unavailable, spool_reason, depth, spool_bytes, cpu) = state  # fmt: skip
            with self._cv:
                self._stats = AuditStats(
                    self._stream, durable, stored, durable, spooled, spooled_total,
                    quarantined, damaged, critical_spooled, db_error, unavailable,
                    depth, spool_bytes,
                )  # fmt: skip
                self._spool_reason = spool_reason
                self._writer_cpu = cpu
                self._durable = max(self._durable, durable)
                self._stored = max(self._stored, stored)
                retained, durable = self._retained, self._durable
                while retained and retained[0][0] <= durable:
                    retained.popleft()
                self._cv.notify_all()
            for token, record in gaps:
                self._number_gap(token, record)
        elif tag == "K":
            with self._cv:
                self._failed = (max(self._failed[0], frame[1]), frame[2])
                self._cv.notify_all()
        elif tag == "F":
            with self._cv:
                if frame[1] in self._waiting:
                    self._replies[frame[1]] = frame[2]
                self._cv.notify_all()
        elif tag == "C":
            with self._cv:
                self._close_reply = (True, frame[1])
                self._cv.notify_all()
        elif tag == "X":
            _log.error("audit writer process stopped", reason=frame[1])

    def _number_gap(self, token: int, record: tuple[Any, ...]) -> None:
        """Give the writer's own gap event the next seq (it numbers it itself at close)."""
        with self._lock:
            if self._closed:
                return
            seq = self._next_seq
            self._next_seq = seq + 1
            self._pending.append((seq, round(time.time() * 1_000_000), record, token))
        self._hurry_up()


WRITER_CLASSES["process"] = ProcessAuditLog
