"""The audit writer process: the other end of ``AuditLog(writer="process")``.

Started by :class:`kvgov.audit.handoff.ProcessAuditLog` as ``python -m
kvgov.audit.writer_process`` in a session of its own, it reads frames
(:mod:`kvgov.audit.wire`) from stdin and answers on stdout::

    engine -> writer                         writer -> engine
    ("CONFIG", settings)                     ("READY", head_seq, key_id, spool_path)
                                             or ("E", error kind, args)
    ("R", [(seq, time_us, record), ...])     ("A", state, gaps): state a tuple of the
      records in seq order; a critical one     AuditStats fields and the process's CPU,
                                               whenever what is durable changes; gaps:
      is made durable (database, or spool     audit_gap events this writer needs a seq
      past the deadline) before the next       for, [(token, record)], sent back by the
      frame is read                            engine as records with the token
                                             ("K", seq, reason): critical seq not durable
    ("F", token)  flush                      ("F", token, error or None)
    ("C",)        close                      ("C", error or None), then it exits

Inside, an ordinary :class:`~kvgov.audit.writer.AuditLog` (its writer and keeper
threads, spool, quarantine, checkpoints) owns the chain; the engine numbers the
events (so ``record`` returns an id at once) and this process checks each number is
the next. End of stdin without ``("C",)`` means the engine died: everything received
is written (database, or spool) and the log closed, the run marker kept, so that the
engine's next start records the ``audit_gap`` for what it held only in memory.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from kvgov.audit.durability import RunMarker, marker_path, quarantine_gap_event
from kvgov.audit.events import (
    CRITICAL_EVENT_TYPES,
    AuditEvent,
    event_from_record,
    event_record,
)
from kvgov.audit.persist import Refusal
from kvgov.audit.signing import SigningKey
from kvgov.audit.wire import WireClosed, read_frame, write_frame
from kvgov.audit.writer import AuditLog
from kvgov.exceptions import AuditSchemaError, AuditUnavailable, InvalidAuditEvent

__all__ = ["HandoffLog", "main"]

#: Seconds between two looks at the log's state when nothing wakes the acknowledger
#: (every persist and spool wakes it: this only bounds a missed one).
ACK_POLL_SECONDS = 0.5


class HandoffLog(AuditLog):
    """An :class:`AuditLog` whose sequence numbers come from the engine.

    Its own ``audit_gap`` events (quarantined records, damaged spool lines) are handed
    to the engine, which gives them the next number; before the engine is attached and
    after it has gone (closing), it numbers them itself.
    """

    def __init__(self, send: Any, *, resume: bool, **settings: Any) -> None:
        self._send = send
        # a resumed chain's numbers beyond the head are the engine's (it sends again what
        # it holds): a gap event of the start's spool replay waits for the engine's number
        self._attached = resume
        self._gaps_new: list[tuple[int, tuple[Any, ...]]] = []
        self._gaps_out: dict[int, tuple[Any, ...]] = {}
        self._gap_token = 0
        if resume:  # the engine holds every event not yet durable: nothing was lost
            with contextlib.suppress(OSError):
                marker_path(Path(settings["spool_path"])).unlink(missing_ok=True)
        super().__init__(**settings)

    @property
    def head_seq(self) -> int:
        """The last sequence number taken (the engine goes on from the next)."""
        with self._lock:
            return self._next_seq - 1

    def attach(self) -> None:
        """From now on the engine numbers the events, this writer's gap events included."""
        with self._cv:
            self._attached = True
            # gap events of the start's replay wait for the engine's numbers too
            self._cv.notify_all()

    def append(self, seq: int, time_us: int, event: Any) -> None:
        """Queue an event the engine numbered ``seq``; it must be the next number.

        Raises:
            AuditUnavailable: ``seq`` is not the next number (the engine and this
                writer disagree about the chain: nothing more is accepted).
        """
        with self._lock:
            if seq != self._next_seq:
                raise AuditUnavailable(
                    f"the engine sent seq {seq}, the writer expected {self._next_seq}"
                )
            self._next_seq = seq + 1
            self._dq.append((seq, time_us, event))
        if self._sleeping:
            self._wake_from_idle()
        # no back-pressure here: the engine holds every event until it is durable and
        # bounds that (queue_size), so this queue is never longer than the engine's
        if len(self._dq) >= self._batch_size and not self._wake.is_set():
            self._wake.set()

    def gap_returned(self, token: int) -> None:
        """The engine numbered the gap event ``token`` (it arrives as a record)."""
        with self._cv:
            self._gaps_out.pop(token, None)

    def await_durable(self, seq: int) -> None:
        """Make everything up to ``seq`` durable, as ``record`` does for a critical event.

        Raises:
            AuditUnavailable: neither the database nor the spool could be written.
        """
        self._await_durable(seq)

    @property
    def marker(self) -> Path:
        """The run marker of this stream."""
        return self._marker

    @property
    def spool_reason(self) -> str | None:
        """Why events were last spooled, or None."""
        return self._out.spool_reason

    def wait_change(self, timeout: float) -> None:
        """Wait until the writer's state changes (a persist, a spool), at most ``timeout`` s."""
        with self._cv:
            self._cv.wait(timeout)

    def detach(self) -> None:
        """The engine has gone (or closes): number the gap events it has not, here."""
        with self._cv:
            self._attached = False
            pending = [*self._gaps_out.values(), *(r for _, r in self._gaps_new)]
            self._gaps_out.clear()
            self._gaps_new.clear()
        for record in pending:  # an AuditEvent again (validated: this process made it)
            with contextlib.suppress(AuditUnavailable):
                self._enqueue(AuditEvent(*record))

    def take_gaps(self) -> list[tuple[int, tuple[Any, ...]]]:
        """Gap events to hand to the engine for numbering (each once)."""
        with self._cv:
            gaps, self._gaps_new = self._gaps_new, []
            self._gaps_out.update(gaps)
            return gaps

    def _enqueue_gap_locked(self, refusals: list[Refusal], damaged: int, notes: list[str]) -> None:
        if not self._attached:
            super()._enqueue_gap_locked(refusals, damaged, notes)
            return
        event = quarantine_gap_event(refusals, damaged, self._out.quarantine.path, notes)
        self._gap_token += 1
        self._gaps_new.append((self._gap_token, event_record(event)))
        self._cv.notify_all()


def _error_frame(exc: BaseException) -> tuple[Any, ...]:
    if isinstance(exc, AuditSchemaError):
        return ("E", "schema", (exc.url, exc.current, exc.head))
    if isinstance(exc, InvalidAuditEvent):
        return ("E", "invalid", (exc.field, exc.reason))
    if isinstance(exc, AuditUnavailable):
        return ("E", "unavailable", (exc.reason,))
    return ("E", "unavailable", (f"the audit writer process could not start: {exc}",))


class _Acknowledger:
    """Sends the log's durable state to the engine whenever it changes."""

    def __init__(self, log: HandoffLog, send: Any) -> None:
        self.log, self.send = log, send
        self.stop = threading.Event()
        self.last: Any = None
        self.lock = threading.Lock()  # one state at a time, in order
        self.thread = threading.Thread(target=self._run, name="kvgov-audit-ack", daemon=True)

    def push(self, force: bool = False) -> None:
        log = self.log
        with self.lock:
            gaps = log.take_gaps()
            st = log.stats()
            # what the engine acts on; the queue's depth and the spool's size ride along
            key = (
                st.stored_seq, st.durable_seq, st.spooled, st.spooled_total, st.quarantined,
                st.damaged_lines, st.critical_spooled, st.database_error, st.unavailable,
                log.spool_reason,
            )  # fmt: skip
            if force or gaps or key != self.last:
                self.last = key
                # a plain tuple (fast to unpickle), and this process's CPU for benchmarks
                state = (*key, st.queue_depth, st.spool_bytes, time.process_time())
                self.send(("A", state, gaps))

    def _run(self) -> None:
        log = self.log
        while not self.stop.is_set():
            log.wait_change(ACK_POLL_SECONDS)
            try:
                self.push()
            except WireClosed:
                return


def main() -> int:
    """Run the writer: read the engine's frames until it closes the log or goes away."""
    source = sys.stdin.buffer
    out = os.dup(1)
    os.dup2(2, 1)  # a stray print must not corrupt the frames: stdout goes to stderr
    lock = threading.Lock()

    def send(value: Any) -> None:
        with lock:
            write_frame(out, value)

    try:
        tag, settings = read_frame(source)
    except WireClosed:
        return 1
    assert tag == "CONFIG"
    key_raw, origin = settings.pop("signing_key")
    resume = bool(settings.pop("resume"))
    settings["signing_key"] = SigningKey.from_private_key(
        Ed25519PrivateKey.from_private_bytes(key_raw), origin
    )
    try:
        log = HandoffLog(send, resume=resume, **settings)
    except Exception as exc:
        send(_error_frame(exc))
        return 1
    log.attach()
    # each frame unpickles thousands of tuples: with the default thresholds the cyclic
    # collector would run every few hundred records, over everything the imports made
    # (this process makes no cycles of its own in steady state)
    gc.freeze()
    gc.set_threshold(100_000, 50, 50)
    send(("READY", log.head_seq, log.key_id, str(log.spool_path)))
    acker = _Acknowledger(log, send)
    acker.push(force=True)
    acker.thread.start()
    try:
        return _serve(log, source, send, acker)
    finally:
        acker.stop.set()


def _serve(log: HandoffLog, source: Any, send: Any, acker: _Acknowledger) -> int:
    while True:
        try:
            frame = read_frame(source)
        except WireClosed:  # the engine died: write what it handed over, keep the marker
            marker = RunMarker.read(log.marker)
            log.detach()
            with contextlib.suppress(AuditUnavailable):
                log.close()
            if marker is not None:
                with contextlib.suppress(OSError):
                    marker.write(log.marker)
            return 0
        # handled in a call of its own: the frame is freed when it returns, while this
        # loop waits for the next one, not when the next one arrives (a frame of large
        # events holds thousands of objects: freeing them is the writer's work of now)
        status = _handle(log, frame, send, acker)
        del frame
        if status is not None:
            return status


def _handle(log: HandoffLog, frame: tuple[Any, ...], send: Any, acker: _Acknowledger) -> int | None:
    """Act on one frame; an exit status when the writer must stop, else None."""
    tag = frame[0]
    if tag == "R":
        critical = 0
        try:
            for item in frame[1]:
                seq, time_us, record = item[0], item[1], item[2]
                if len(item) > 3:
                    log.gap_returned(item[3])
                log.append(seq, time_us, event_from_record(record))
                if record[0] in CRITICAL_EVENT_TYPES:
                    critical = seq
        except AuditUnavailable as exc:  # out of step with the engine: stop, it restarts us
            send(("X", exc.reason))
            return 2
        if critical:
            try:
                log.await_durable(critical)
            except AuditUnavailable as exc:
                acker.push(force=True)
                send(("K", critical, exc.reason))
                return None
            acker.push()
    elif tag == "F":
        error: str | None = None
        try:
            log.flush()
        except AuditUnavailable as exc:
            error = exc.reason
        acker.push(force=True)
        send(("F", frame[1], error))
    elif tag == "C":
        log.detach()
        error = None
        try:
            log.close()
        except AuditUnavailable as exc:
            error = exc.reason
        acker.stop.set()
        acker.push(force=True)
        send(("C", error))
        return 0
    return None


if __name__ == "__main__":
    sys.exit(main())
