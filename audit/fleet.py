"""The fleet's control plane in the audit database: engines, signed orders, results.

Three tables (migration ``0005_fleet``)::

    fleet_engines   engine_id, kind, versions (JSON), policy_revision, key_id,
                    audit_stream, started_us, heartbeat_us, stopped_us
    fleet_orders    seq (ordering), order_id, kind, payload (JSON), issued_us,
                    signer_key_id, signature (Ed25519, 64 bytes)
    fleet_results   (order_id, engine_id) primary key, status, verified, event_id,
                    detail (JSON), done_us

An order is signed by an operator key (Ed25519, the key handling of
:mod:`kvgov.audit.signing`). Signed message::

    b"kvgov-fleet-order-1\\n" || RFC 8785 JSON of
        {"order_id", "kind", "payload", "issued_us"}

Engines hold the operators' public keys and refuse any order whose signature does not
verify under one of them (the refusal is a result row and an audit event). Orders and
results are only ever inserted; the results' primary key is what makes a replayed order
execute once per engine. On PostgreSQL an insert into ``fleet_orders`` is announced on
the channel :data:`NOTIFY_CHANNEL`; engines also poll, so a lost notification only
delays an order.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from sqlalchemy import (
    BigInteger,
    Boolean,
    Integer,
    LargeBinary,
    String,
    Text,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.engine import URL, Connection
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Mapped, mapped_column

from kvgov.audit.models import Base
from kvgov.audit.signing import SigningKey, key_id, verify_signature
from kvgov.audit.store import mask_url, open_engine
from kvgov.canonical import canonical_json
from kvgov.exceptions import FleetUnavailable, InvalidFleetOrder

__all__ = [
    "NOTIFY_CHANNEL",
    "ORDER_KINDS",
    "EngineRecord",
    "FleetStore",
    "Order",
    "OrderResult",
    "check_payload",
    "order_message",
    "sign_order",
    "verify_order",
]

#: The PostgreSQL channel an issued order is announced on (payload: the order id).
NOTIFY_CHANNEL = "kvgov_fleet"
#: The kinds of order, and the payload fields each needs (name -> type).
ORDER_KINDS: Mapping[str, Mapping[str, type]] = {
    "purge": {"tenant": str},
    "invalidate": {"filter": dict},
    "rotate_secret": {"secret_file": str, "key_id": str},
    "rollout": {"files": dict, "digest": str},
}
_TAG = b"kvgov-fleet-order-1\n"
#: Result statuses: the order ran and its evidence verified, ran unverified (blocks still
#: held), was refused (signature), failed (an error; the detail says which).
RESULT_STATUSES = ("completed", "unverified", "refused", "failed")


class FleetEngineRow(Base):
    """One governed engine of the fleet."""

    __tablename__ = "fleet_engines"
    engine_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    kind: Mapped[str] = mapped_column(String(32))
    versions: Mapped[str] = mapped_column(Text)
    policy_revision: Mapped[str] = mapped_column(String(256))
    key_id: Mapped[str] = mapped_column(String(64))
    audit_stream: Mapped[str] = mapped_column(String(256))
    started_us: Mapped[int] = mapped_column(BigInteger)
    heartbeat_us: Mapped[int] = mapped_column(BigInteger)
    stopped_us: Mapped[int | None] = mapped_column(BigInteger)


class FleetOrderRow(Base):
    """One operator-signed order."""

    __tablename__ = "fleet_orders"
    seq: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    order_id: Mapped[str] = mapped_column(String(32), unique=True)
    kind: Mapped[str] = mapped_column(String(32))
    payload: Mapped[str] = mapped_column(Text)
    issued_us: Mapped[int] = mapped_column(BigInteger)
    signer_key_id: Mapped[str] = mapped_column(String(64))
    signature: Mapped[bytes] = mapped_column(LargeBinary(128))


class FleetResultRow(Base):
    """What one engine did with one order."""

    __tablename__ = "fleet_results"
    order_id: Mapped[str] = mapped_column(String(32), primary_key=True)
    engine_id: Mapped[str] = mapped_column(String(256), primary_key=True)
    status: Mapped[str] = mapped_column(String(32))
    verified: Mapped[bool | None] = mapped_column(Boolean)
    event_id: Mapped[str | None] = mapped_column(String(320))
    detail: Mapped[str] = mapped_column(Text)
    done_us: Mapped[int] = mapped_column(BigInteger)


@dataclass(frozen=True, slots=True)
class Order:
    """A signed order, as written or read.

    Attributes:
        order_id: 32 hex digits.
        kind: one of :data:`ORDER_KINDS`.
        payload: its arguments (see :data:`ORDER_KINDS`).
        issued_us: microseconds since 1970-01-01 UTC.
        signer_key_id: the key id of the operator key that signed it.
        signature: the Ed25519 signature of :func:`order_message`.
        seq: its position in ``fleet_orders`` (0 before it is stored).
    """

    order_id: str
    kind: str
    payload: Mapping[str, Any]
    issued_us: int
    signer_key_id: str
    signature: bytes
    seq: int = 0


@dataclass(frozen=True, slots=True)
class OrderResult:
    """One engine's result for one order.

    Attributes:
        order_id: the order.
        engine_id: the engine.
        status: one of ``RESULT_STATUSES``.
        verified: whether the evidence verified (None: nothing to verify, e.g. a refusal).
        event_id: the audit event that is the evidence (``stream:seq``), if any.
        detail: what the engine reports (blocks, revision, reason).
        done_us: when, microseconds since 1970-01-01 UTC.
    """

    order_id: str
    engine_id: str
    status: str
    verified: bool | None
    event_id: str | None
    detail: Mapping[str, Any] = field(default_factory=dict)
    done_us: int = 0


@dataclass(frozen=True, slots=True)
class EngineRecord:
    """A row of ``fleet_engines``."""

    engine_id: str
    kind: str
    versions: Mapping[str, str]
    policy_revision: str
    key_id: str
    audit_stream: str
    started_us: int
    heartbeat_us: int
    stopped_us: int | None


def check_payload(kind: str, payload: Mapping[str, Any]) -> None:
    """Check an order's kind and payload.

    Raises:
        InvalidFleetOrder: an unknown kind, a missing field or a field of the wrong type.
    """
    if kind not in ORDER_KINDS:
        raise InvalidFleetOrder(f"kind {kind!r} is not one of {', '.join(ORDER_KINDS)}")
    if not isinstance(payload, Mapping):
        raise InvalidFleetOrder(f"the payload of a {kind} order must be an object")
    wanted = ORDER_KINDS[kind]
    for name, typ in wanted.items():
        value = payload.get(name)
        if not isinstance(value, typ) or not value:
            raise InvalidFleetOrder(f"a {kind} order needs a non-empty {typ.__name__} {name!r}")
    extra = set(payload) - set(wanted)
    if extra:
        raise InvalidFleetOrder(f"a {kind} order has no field(s) {sorted(extra)}")


def order_message(order_id: str, kind: str, payload: Mapping[str, Any], issued_us: int) -> bytes:
    """The bytes an order's signature covers (layout in the module docstring)."""
    body = {"order_id": order_id, "kind": kind, "payload": dict(payload), "issued_us": issued_us}
    return _TAG + canonical_json(body).encode("utf-8")


def sign_order(
    key: SigningKey,
    kind: str,
    payload: Mapping[str, Any],
    *,
    issued_us: int | None = None,
    order_id: str | None = None,
) -> Order:
    """Build and sign an order.

    Args:
        key: the operator's signing key.
        kind: one of :data:`ORDER_KINDS`.
        payload: its arguments.
        issued_us: its time (default: now).
        order_id: its id (default: 16 random bytes as hex).

    Raises:
        InvalidFleetOrder: a bad kind or payload.
    """
    check_payload(kind, payload)
    oid = order_id or secrets.token_hex(16)
    when = int(time.time() * 1_000_000) if issued_us is None else issued_us
    sig = key.sign(order_message(oid, kind, payload, when))
    return Order(oid, kind, dict(payload), when, key.key_id, sig)


def verify_order(order: Order, trusted: Mapping[str, Ed25519PublicKey]) -> str | None:
    """Why an order must be refused, or None when it is signed by a trusted operator key.

    Args:
        order: the order as read.
        trusted: the operators' public keys by key id.
    """
    public = trusted.get(order.signer_key_id)
    if public is None:
        return f"signer key {order.signer_key_id!r} is not a trusted operator key"
    if key_id(public) != order.signer_key_id:
        return f"trusted key listed under {order.signer_key_id!r} has another key id"
    message = order_message(order.order_id, order.kind, order.payload, order.issued_us)
    if not verify_signature(public, order.signature, message):
        return "the signature does not verify (the order was altered or signed by another key)"
    try:
        check_payload(order.kind, order.payload)
    except InvalidFleetOrder as exc:
        return exc.reason
    return None


def _us() -> int:
    return int(time.time() * 1_000_000)


class FleetStore:
    """The fleet tables of an audit database (SQLite or PostgreSQL).

    Args:
        url: the audit database URL.
        auto_upgrade: as :func:`kvgov.audit.open_engine`.
        clock: microseconds now (tests inject one).

    Raises:
        AuditSchemaError: the database is not at the head revision (``kvgov db upgrade``).
    """

    def __init__(
        self,
        url: str | URL,
        *,
        auto_upgrade: bool | None = None,
        clock: Callable[[], int] = _us,
    ) -> None:
        self.url = mask_url(url)
        self._engine = open_engine(url, auto_upgrade=auto_upgrade, statement_timeout=10.0)
        self._clock = clock

    def __repr__(self) -> str:
        return f"FleetStore({self.url!r})"

    @property
    def is_postgresql(self) -> bool:
        """Whether orders are announced by NOTIFY (PostgreSQL) or only polled (SQLite)."""
        return self._engine.dialect.name == "postgresql"

    @contextmanager
    def _begin(self) -> Iterator[Connection]:
        try:
            with self._engine.begin() as conn:
                yield conn
        except OperationalError as exc:
            raise FleetUnavailable(self.url, str(exc.orig or exc).strip()) from None

    # ------------------------------------------------------------------ orders

    def issue(self, order: Order) -> Order:
        """Store a signed order and announce it; returns it with its ``seq``.

        Raises:
            InvalidFleetOrder: a bad kind or payload, or an order id already used.
            FleetUnavailable: the database cannot be reached (nothing was written).
        """
        check_payload(order.kind, order.payload)
        row = {
            "order_id": order.order_id,
            "kind": order.kind,
            "payload": canonical_json(dict(order.payload)),
            "issued_us": order.issued_us,
            "signer_key_id": order.signer_key_id,
            "signature": order.signature,
        }
        try:
            with self._begin() as conn:
                conn.execute(insert(FleetOrderRow).values(**row))
                seq = conn.execute(
                    select(FleetOrderRow.seq).where(FleetOrderRow.order_id == order.order_id)
                ).scalar_one()
                if conn.dialect.name == "postgresql":
                    conn.execute(
                        text("SELECT pg_notify(:ch, :oid)"),
                        {"ch": NOTIFY_CHANNEL, "oid": order.order_id},
                    )
        except IntegrityError:
            raise InvalidFleetOrder(f"order id {order.order_id!r} is already used") from None
        return Order(
            order.order_id,
            order.kind,
            order.payload,
            order.issued_us,
            order.signer_key_id,
            order.signature,
            int(seq),
        )

    def _orders(self, where: Any = None) -> list[Order]:
        stmt = select(
            FleetOrderRow.order_id,
            FleetOrderRow.kind,
            FleetOrderRow.payload,
            FleetOrderRow.issued_us,
            FleetOrderRow.signer_key_id,
            FleetOrderRow.signature,
            FleetOrderRow.seq,
        ).order_by(FleetOrderRow.seq)
        if where is not None:
            stmt = stmt.where(where)
        with self._begin() as conn:
            rows = conn.execute(stmt).all()
        out = []
        for oid, kind, payload, issued, signer, sig, seq in rows:
            try:
                body = json.loads(payload)
            except ValueError:
                body = {"unreadable": True}
            out.append(Order(oid, kind, body, int(issued), signer, bytes(sig), int(seq)))
        return out

    def order(self, order_id: str) -> Order | None:
        """One order by id, or None.

        Raises:
            FleetUnavailable: the database cannot be reached.
        """
        found = self._orders(FleetOrderRow.order_id == order_id)
        return found[0] if found else None

    def orders(self) -> list[Order]:
        """Every order, oldest first.

        Raises:
            FleetUnavailable: the database cannot be reached.
        """
        return self._orders()

    def pending(self, engine_id: str) -> list[Order]:
        """The orders this engine has no result for, oldest first.

        Raises:
            FleetUnavailable: the database cannot be reached.
        """
        done = select(FleetResultRow.order_id).where(FleetResultRow.engine_id == engine_id)
        return self._orders(FleetOrderRow.order_id.not_in(done))

    # ------------------------------------------------------------------ results

    def record_result(self, result: OrderResult) -> bool:
        """Store an engine's result; False when that engine had stored one already.

        Raises:
            FleetUnavailable: the database cannot be reached (retry: nothing was written).
        """
        if result.status not in RESULT_STATUSES:
            raise InvalidFleetOrder(f"status {result.status!r} is not one of {RESULT_STATUSES}")
        try:
            with self._begin() as conn:
                conn.execute(
                    insert(FleetResultRow).values(
                        order_id=result.order_id,
                        engine_id=result.engine_id,
                        status=result.status,
                        verified=result.verified,
                        event_id=result.event_id,
                        detail=json.dumps(dict(result.detail), sort_keys=True, default=str),
                        done_us=result.done_us or self._clock(),
                    )
                )
        except IntegrityError:
            return False
        return True

    def results(self, order_id: str | None = None) -> list[OrderResult]:
        """The results of one order (or of all), by engine.

        Raises:
            FleetUnavailable: the database cannot be reached.
        """
        stmt = select(
            FleetResultRow.order_id,
            FleetResultRow.engine_id,
            FleetResultRow.status,
            FleetResultRow.verified,
            FleetResultRow.event_id,
            FleetResultRow.detail,
            FleetResultRow.done_us,
        ).order_by(FleetResultRow.engine_id)
        if order_id is not None:
            stmt = stmt.where(FleetResultRow.order_id == order_id)
        with self._begin() as conn:
            rows = conn.execute(stmt).all()
        out = []
        for oid, eid, status, verified, event_id, detail, done in rows:
            try:
                body = json.loads(detail)
            except ValueError:
                body = {"unreadable": True}
            verified = None if verified is None else bool(verified)
            out.append(OrderResult(oid, eid, status, verified, event_id, body, int(done)))
        return out

    # ------------------------------------------------------------------ engines

    def register(
        self,
        *,
        engine_id: str,
        kind: str,
        versions: Mapping[str, str],
        policy_revision: str,
        key_id: str,
        audit_stream: str,
    ) -> int:
        """Register (or re-register, after a restart) an engine; returns its start time.

        Raises:
            FleetUnavailable: the database cannot be reached.
        """
        now = self._clock()
        values = {
            "kind": kind,
            "versions": json.dumps(dict(versions), sort_keys=True),
            "policy_revision": policy_revision,
            "key_id": key_id,
            "audit_stream": audit_stream,
            "started_us": now,
            "heartbeat_us": now,
            "stopped_us": None,
        }
        with self._begin() as conn:
            updated = conn.execute(
                update(FleetEngineRow).where(FleetEngineRow.engine_id == engine_id).values(**values)
            ).rowcount
            if not updated:
                conn.execute(insert(FleetEngineRow).values(engine_id=engine_id, **values))
        return now

    def heartbeat(
        self, engine_id: str, *, policy_revision: str, key_id: str, stopped: bool = False
    ) -> None:
        """Note that an engine is alive (or, ``stopped``, that it stopped cleanly).

        Raises:
            FleetUnavailable: the database cannot be reached.
        """
        now = self._clock()
        values: dict[str, Any] = {
            "heartbeat_us": now,
            "policy_revision": policy_revision,
            "key_id": key_id,
        }
        if stopped:
            values["stopped_us"] = now
        with self._begin() as conn:
            conn.execute(
                update(FleetEngineRow).where(FleetEngineRow.engine_id == engine_id).values(**values)
            )

    def engines(self) -> list[EngineRecord]:
        """Every engine that ever registered.

        Raises:
            FleetUnavailable: the database cannot be reached.
        """
        t = FleetEngineRow
        stmt = select(
            t.engine_id,
            t.kind,
            t.versions,
            t.policy_revision,
            t.key_id,
            t.audit_stream,
            t.started_us,
            t.heartbeat_us,
            t.stopped_us,
        ).order_by(t.engine_id)
        with self._begin() as conn:
            rows = conn.execute(stmt).all()
        out = []
        for r in rows:
            try:
                versions = json.loads(r[2])
            except ValueError:
                versions = {}
            out.append(
                EngineRecord(
                    r[0],
                    r[1],
                    versions,
                    r[3],
                    r[4],
                    r[5],
                    int(r[6]),
                    int(r[7]),
                    None if r[8] is None else int(r[8]),
                )
            )
        return out

    def now_us(self) -> int:
        """The store's clock, microseconds since 1970-01-01 UTC."""
        return self._clock()

    def close(self) -> None:
        """Release the connections."""
        self._engine.dispose()

    def __enter__(self) -> FleetStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
