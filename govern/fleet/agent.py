"""The engine side of the fleet: register, heartbeat, receive orders, run them between steps.

A :class:`FleetAgent` has one background thread that does every database call: it
registers the engine (``fleet_engines``), heartbeats, fetches the orders the engine has
no result for (woken by PostgreSQL ``LISTEN``, else every ``poll_interval``) into a
queue, and writes the results. The engine's own thread calls :meth:`FleetAgent.drain`
at a step boundary (between two forward passes): it runs the queued orders there, so
an order never runs inside a forward pass and a step never waits on the database.

Failure behaviour:

* the database down: the thread retries; orders are durable rows, so a late order is
  delayed, never lost; results wait in memory until they are written;
* a replayed order (a notification twice, a poll racing a notification) runs once: the
  agent remembers every order it queued, and the results' primary key
  ``(order_id, engine_id)`` refuses a second result;
* a restart: the new process fetches every order without a result for its engine id
  and runs it (a purge of a cache that is empty since the restart verifies at once);
* an order whose signature does not verify under a trusted operator key is refused:
  a ``fleet_order`` audit event (``outcome: refused``) and a ``refused`` result.
"""

from __future__ import annotations

import contextlib
import queue
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import structlog
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from kvgov.audit import AuditEvent, EventType, key_id
from kvgov.audit.fleet import NOTIFY_CHANNEL, FleetStore, Order, OrderResult, verify_order
from kvgov.canonical import canonical_json
from kvgov.exceptions import FleetUnavailable, InvalidArgument, KVGovError
from kvgov.secrecy import KeyFileOpenToOthers, read_key_file

from .target import Done, FleetTarget

__all__ = ["FleetAgent", "bundle_digest", "trusted_keys"]

_log = structlog.get_logger("kvgov.fleet")


def bundle_digest(files: Mapping[str, str]) -> str:
    """The SHA-256 (hex) of a rolled-out bundle's files, as a rollout order names it."""
    import hashlib

    return hashlib.sha256(canonical_json(dict(files)).encode("utf-8")).hexdigest()


def trusted_keys(keys: list[Ed25519PublicKey]) -> dict[str, Ed25519PublicKey]:
    """The operators' public keys by key id (what :class:`FleetAgent` takes)."""
    return {key_id(k): k for k in keys}


def _read_secret_file(path: str) -> bytes:
    """A secret file's bytes (one trailing newline dropped); refused when others may read it."""
    try:
        return read_key_file(Path(path)).rstrip(b"\r\n")
    except KeyFileOpenToOthers as exc:
        raise InvalidArgument("secret_file", path, str(exc)) from None
    except (OSError, ValueError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise InvalidArgument("secret_file", path, f"cannot be read ({why})") from None


def _safe_relpath(name: str) -> Path:
    p = Path(name)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise InvalidArgument("files", name, "a relative path inside the bundle")
    return p


class FleetAgent:
    """Registers an engine in the fleet and runs the orders it receives between steps.

    Args:
        url: the audit database (PostgreSQL for a fleet, SQLite for one host).
        engine_id: this engine's id, stable across restarts (a restarted engine then
            finds the orders it missed).
        target: the engine (:class:`~kvgov.govern.fleet.NativeTarget`, or the vLLM
            binding's).
        operators: the operators' public keys by key id (:func:`trusted_keys`); an
            order signed by any other key is refused.
        versions: what to report of the engine (``{"kvgov": ..., "vllm": ...}``).
        poll_interval: seconds between polls (PostgreSQL also wakes the agent by NOTIFY).
        heartbeat_interval: seconds between heartbeats.
        on_order: called (from the background thread) when an order is queued, e.g.
            to wake an idle engine so that it reaches a step boundary.

    Raises:
        InvalidArgument: no operator key, or a non-positive interval.
    """

    def __init__(
        self,
        url: str,
        engine_id: str,
        target: FleetTarget,
        operators: Mapping[str, Ed25519PublicKey],
        *,
        versions: Mapping[str, str] | None = None,
        poll_interval: float = 1.0,
        heartbeat_interval: float = 2.0,
        on_order: Callable[[], None] | None = None,
    ) -> None:
        if not operators:
            raise InvalidArgument("operators", {}, "at least one operator public key")
        if poll_interval <= 0 or heartbeat_interval <= 0:
            raise InvalidArgument("interval", (poll_interval, heartbeat_interval), "> 0")
        if not isinstance(engine_id, str) or not engine_id:
            raise InvalidArgument("engine_id", engine_id, "a non-empty string")
        self.url = url
        self.engine_id = engine_id
        self.target = target
        self._operators = dict(operators)
        self._versions = dict(versions or {})
        self._poll = poll_interval
        self._beat = heartbeat_interval
        self._on_order = on_order
        self._queue: queue.SimpleQueue[Order] = queue.SimpleQueue()
        # orders run whose effect completes later (Done.pending), engine's thread only
        self._deferred: list[tuple[Order, Done]] = []
        self._seen: set[str] = set()
        self._seen_lock = threading.Lock()
        self._results: deque[OrderResult] = deque()
        self._flush_lock = threading.Lock()
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._store: FleetStore | None = None
        self._registered = False
        self._last_beat = 0.0
        self._bundles: list[tempfile.TemporaryDirectory[str]] = []
        #: How many orders this process executed (refusals included).
        self.executed = 0

    # ------------------------------------------------------------------ life

    def start(self) -> FleetAgent:
        """Start the background thread (registration happens there, retried). Idempotent."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._run, name=f"kvgov-fleet-{self.engine_id}", daemon=True
            )
            self._thread.start()
        return self

    def stop(self, *, timeout: float = 5.0) -> None:
        """Stop the thread, write what results it can, mark the engine stopped. Idempotent."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
        store = self._store
        if store is not None:
            try:
                self._flush_results(store)
                if self._registered:
                    state = self._state()
                    store.heartbeat(
                        self.engine_id,
                        policy_revision=state["policy_revision"],
                        key_id=state["key_id"],
                        stopped=True,
                    )
            except FleetUnavailable as exc:
                _log.warning("fleet_stop_unrecorded", engine_id=self.engine_id, error=str(exc))
            store.close()
            self._store = None
        for d in self._bundles:
            d.cleanup()
        self._bundles.clear()

    def sync(self) -> None:
        """One round of the background thread's work, on the caller's thread: register,
        write the results, fetch new orders. For tests and tools; never call it on a
        step's thread (it waits on the database).

        Raises:
            FleetUnavailable: the database cannot be reached.
        """
        store = self._ensure_store()
        self._flush_results(store)
        self._fetch(store)

    @property
    def registered(self) -> bool:
        """Whether the engine's row is written (the thread retries until it is)."""
        return self._registered

    def has_orders(self) -> bool:
        """Whether orders wait for :meth:`drain` (an idle engine should reach a boundary)."""
        return not self._queue.empty()

    def pending_results(self) -> int:
        """Results executed here and not yet written to the database."""
        return len(self._results)

    def _state(self) -> dict[str, str]:
        revision = self.target.policy.bundle_revision
        return {"policy_revision": revision, "key_id": self.target.key_id()}

    # ------------------------------------------------------------------ the background thread

    def _run(self) -> None:
        listener: Any = None
        while not self._stop.is_set():
            try:
                store = self._ensure_store()
                now = time.monotonic()
                if now - self._last_beat >= self._beat:
                    state = self._state()
                    store.heartbeat(
                        self.engine_id,
                        policy_revision=state["policy_revision"],
                        key_id=state["key_id"],
                    )
                    self._last_beat = now
                self._flush_results(store)
                self._fetch(store)
                if listener is None and store.is_postgresql:
                    listener = self._listen()
            except (FleetUnavailable, KVGovError, OSError) as exc:
                _log.warning("fleet_db_unavailable", engine_id=self.engine_id, error=str(exc))
                listener = self._close_listener(listener)
            except Exception as exc:  # the thread must outlive any one failure
                _log.error("fleet_thread_error", engine_id=self.engine_id, error=repr(exc))
                listener = self._close_listener(listener)
            listener = self._wait(listener)
        self._close_listener(listener)

    def _ensure_store(self) -> FleetStore:
        if self._store is None:
            self._store = FleetStore(self.url, auto_upgrade=False)
        if not self._registered:
            self._store.register(
                engine_id=self.engine_id,
                kind=self.target.kind,
                versions=self._versions,
                audit_stream=self.target.audit.stream_id,
                **self._state(),
            )
            self._registered = True
            self._last_beat = time.monotonic()
            _log.info("fleet_registered", engine_id=self.engine_id)
        return self._store

    def _fetch(self, store: FleetStore) -> None:
        pending = list(store.pending(self.engine_id))
        # sync() on the caller's thread and the agent's own thread both fetch: the check
        # and the mark are one step, so an order both read is queued (and runs) once
        with self._seen_lock:
            fresh = [o for o in pending if o.order_id not in self._seen]
            self._seen.update(o.order_id for o in fresh)
        for order in fresh:
            self._queue.put(order)
        if fresh and self._on_order is not None:
            self._on_order()

    def _flush_results(self, store: FleetStore) -> None:
        # one writer at a time (the thread, sync, stop); the engine's thread only appends
        with self._flush_lock:
            while self._results:
                store.record_result(self._results[0])  # False: written before (a replay)
                self._results.popleft()

    def _listen(self) -> Any:
        """A PostgreSQL connection LISTENing on the orders' channel, or None."""
        import psycopg
        from sqlalchemy.engine import make_url

        from kvgov.audit.store import normalize_url

        u = make_url(normalize_url(self.url)).set(drivername="postgresql")
        try:
            conn = psycopg.connect(u.render_as_string(hide_password=False), autocommit=True)
            conn.execute(f"LISTEN {NOTIFY_CHANNEL}")
        except psycopg.Error as exc:
            _log.warning("fleet_listen_failed", engine_id=self.engine_id, error=str(exc))
            return None
        return conn

    @staticmethod
    def _close_listener(listener: Any) -> None:
        if listener is not None:
            with contextlib.suppress(Exception):  # closing a broken connection
                listener.close()
        return None

    def _wait(self, listener: Any) -> Any:
        """Sleep until a notification, a wake-up or the poll interval."""
        if listener is None:
            self._wake.wait(self._poll)
            self._wake.clear()
            return None
        import psycopg

        try:
            for _ in listener.notifies(timeout=self._poll, stop_after=1):
                break
        except psycopg.Error as exc:
            _log.warning("fleet_listen_lost", engine_id=self.engine_id, error=str(exc))
            return self._close_listener(listener)
        return listener

    # ------------------------------------------------------------------ the engine's thread

    def drain(self) -> int:
        """Run every order received so far; call it at a step boundary, on the engine's thread.

        Never touches the database: the results are written by the background thread.

        Returns:
            How many orders ran (refusals included).
        """
        ran = 0
        while True:
            try:
                order = self._queue.get_nowait()
            except queue.Empty:
                break
            result = self._execute(order)
            if result is not None:
                self._results.append(result)
            ran += 1
        if ran:
            self.executed += ran
            self._wake.set()
        self.settle()
        return ran

    def settle(self) -> int:
        """Finish the orders whose effect completed since (:attr:`Done.pending`); call
        it on the engine's thread, e.g. when a step came back. Never touches the database.

        Returns:
            How many orders it finished.
        """
        if not self._deferred:
            return 0
        waiting, finished = [], 0
        for order, first in self._deferred:
            try:
                final = first.pending() if first.pending is not None else first
            except KVGovError as exc:
                event_id = self._event(order, "failed", error=str(exc))
                self._results.append(
                    self._result(order, "failed", False, event_id, {"error": str(exc)})
                )
                finished += 1
                continue
            if final is None:
                waiting.append((order, first))
                continue
            detail = {**first.detail, **final.detail}
            event_id = self._event(
                order,
                "confirmed",
                evidence_event_id=first.event_id,
                verified=final.verified is True,
                **detail,
            )
            status = "completed" if final.verified is not False else "unverified"
            _log.info("fleet_order_done", order_id=order.order_id, kind=order.kind, status=status)
            self._results.append(self._result(order, status, final.verified, event_id, detail))
            finished += 1
        self._deferred = waiting
        if finished:
            self._wake.set()
        return finished

    def _execute(self, order: Order) -> OrderResult | None:
        why = verify_order(order, self._operators)
        if why is not None:
            event_id = self._event(order, "refused", reason=why, signer_key_id=order.signer_key_id)
            _log.warning("fleet_order_refused", order_id=order.order_id, reason=why)
            return self._result(order, "refused", None, event_id, {"reason": why})
        try:
            done = self._run_order(order)
        except KVGovError as exc:
            event_id = self._event(order, "failed", error=str(exc))
            _log.error("fleet_order_failed", order_id=order.order_id, error=str(exc))
            return self._result(order, "failed", False, event_id, {"error": str(exc)})
        if done.pending is not None:  # finished by settle()
            self._deferred.append((order, done))
            return None
        status = "completed" if done.verified is not False else "unverified"
        _log.info("fleet_order_done", order_id=order.order_id, kind=order.kind, status=status)
        return self._result(order, status, done.verified, done.event_id, done.detail)

    def _run_order(self, order: Order) -> Done:
        p = order.payload
        oid = order.order_id
        if order.kind == "purge":
            return self.target.purge(str(p["tenant"]), oid)
        if order.kind == "invalidate":
            return self.target.invalidate({str(k): str(v) for k, v in p["filter"].items()}, oid)
        if order.kind == "rotate_secret":
            secret = _read_secret_file(str(p["secret_file"]))
            from kvgov.govern.keys import secret_key_id

            if secret_key_id(secret) != p["key_id"]:
                raise InvalidArgument(
                    "secret_file", p["secret_file"], f"a secret whose key id is {p['key_id']}"
                )
            return self.target.rotate_secret(secret, oid)
        return self._rollout(order)

    def _rollout(self, order: Order) -> Done:
        files = {str(k): str(v) for k, v in order.payload["files"].items()}
        if bundle_digest(files) != order.payload["digest"]:
            raise InvalidArgument("files", order.order_id, "files matching the order's digest")
        holder = tempfile.TemporaryDirectory(prefix="kvgov-rollout-")
        root = Path(holder.name)
        for name, body in files.items():
            dest = root / _safe_relpath(name)
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_text(body, encoding="utf-8")
        policy = self.target.policy
        old = policy.bundle_revision
        try:
            new = policy.reload(root)  # the old bundle stays active if this raises
        except BaseException:
            holder.cleanup()
            raise
        self._bundles.append(holder)
        event_id = self._event(
            order,
            "rolled_out",
            policy_revision=new,
            previous_revision=old,
            digest=order.payload["digest"],
        )
        return Done(event_id, True, {"policy_revision": new, "previous_revision": old})

    def _event(self, order: Order, outcome: str, **details: Any) -> str:
        return self.target.audit.record(
            AuditEvent(
                type=EventType.FLEET_ORDER,
                details={
                    "order_id": order.order_id,
                    "kind": order.kind,
                    "outcome": outcome,
                    "engine_id": self.engine_id,
                    **details,
                },
            )
        )

    def _result(
        self,
        order: Order,
        status: str,
        verified: bool | None,
        event_id: str | None,
        detail: Mapping[str, Any],
    ) -> OrderResult:
        return OrderResult(
            order.order_id,
            self.engine_id,
            status,
            verified,
            event_id,
            dict(detail),
            int(time.time() * 1_000_000),
        )
