"""SQLAlchemy 2 typed models of the audit store: events, checkpoints, keys.

All three tables are append-only: the migration installs triggers that reject
UPDATE and DELETE (and TRUNCATE on PostgreSQL). Times are integer microseconds
since the Unix epoch, UTC (``time_us``): SQLite drops time zones, integers do not,
and the hash chain covers exactly the stored integer.

JSON columns (``block_ids``, ``details``) are ``JSON`` on SQLite and ``JSONB`` on
PostgreSQL; the chain hashes their canonical form (see :mod:`kvgov.audit.chain`), which
survives JSONB's key reordering.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Index,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from kvgov.audit.events import FIELDS
from kvgov.schema import TEXT_LIMITS

__all__ = ["AuditCheckpoint", "AuditEventRow", "AuditKey", "Base", "metadata"]

#: Stable constraint and index names, so migrations can refer to them.
NAMING_CONVENTION: dict[str, str] = {
    "ix": "ix_%(column_0_label)s",
    "uq": "uq_%(table_name)s_%(column_0_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

#: Denial types, as the partial index on them is declared (only denial rows are indexed,
#: so the common events pay nothing for it). Kept in sync with ``queries.DENIAL_TYPES``.
DENIALS_WHERE = text("type IN ('policy_denied', 'share_denied', 'policy_error')")
_JSON = JSON().with_variant(JSONB(), "postgresql")


class Base(DeclarativeBase):
    """Declarative base of the audit models (shares :data:`metadata`)."""

    metadata = metadata


class AuditEventRow(Base):
    """One audit event as stored; every column but the two hashes and the format is hashed.

    ``chain_format`` is hashed too, in effect: each format's bytes start with its own
    version tag (:mod:`kvgov.audit.chain`).
    """

    __tablename__ = "audit_events"
    __table_args__ = (
        Index("ix_audit_events_tenant_type_time", "tenant", "type", "time_us"),
        Index("ix_audit_events_requester_time", "requester_tenant", "time_us"),
        Index(
            "ix_audit_events_denials_time",
            "type",
            "time_us",
            sqlite_where=DENIALS_WHERE,
            postgresql_where=DENIALS_WHERE,
        ),
        Index("ix_audit_events_policy_revision", "policy_revision"),
        # rows stored in (stream, seq) order: verification reads them sequentially
        {"sqlite_with_rowid": False},
    )

    #: Writer stream (worker) id; each stream has its own hash chain. The event id is
    #: ``"<stream>:<seq>"`` and ``(stream, seq)`` is the primary key.
    stream: Mapped[str] = mapped_column(String(TEXT_LIMITS["stream"]), primary_key=True)
    #: Sequence number within the stream, 1, 2, 3, ... without gaps.
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    #: When the event was recorded: microseconds since 1970-01-01 UTC.
    time_us: Mapped[int] = mapped_column(BigInteger)
    #: An ``kvgov.audit.EventType`` value.
    type: Mapped[str] = mapped_column(String(TEXT_LIMITS["type"]))
    tenant: Mapped[str | None] = mapped_column(String(TEXT_LIMITS["tenant"]))
    requester_tenant: Mapped[str | None] = mapped_column(String(TEXT_LIMITS["requester_tenant"]))
    classification: Mapped[str | None] = mapped_column(String(TEXT_LIMITS["classification"]))
    model: Mapped[str | None] = mapped_column(String(TEXT_LIMITS["model"]))
    model_revision: Mapped[str | None] = mapped_column(String(TEXT_LIMITS["model_revision"]))
    adapter: Mapped[str | None] = mapped_column(String(TEXT_LIMITS["adapter"]))
    adapter_revision: Mapped[str | None] = mapped_column(String(TEXT_LIMITS["adapter_revision"]))
    tokenizer: Mapped[str | None] = mapped_column(String(TEXT_LIMITS["tokenizer"]))
    tokenizer_revision: Mapped[str | None] = mapped_column(
        String(TEXT_LIMITS["tokenizer_revision"])
    )
    template_version: Mapped[str | None] = mapped_column(String(TEXT_LIMITS["template_version"]))
    sequence_id: Mapped[str | None] = mapped_column(String(TEXT_LIMITS["sequence_id"]))
    token_count: Mapped[int | None] = mapped_column(BigInteger)
    reused_tokens: Mapped[int | None] = mapped_column(BigInteger)
    decision_id: Mapped[str | None] = mapped_column(String(TEXT_LIMITS["decision_id"]))
    policy_revision: Mapped[str | None] = mapped_column(String(TEXT_LIMITS["policy_revision"]))
    #: KV block ids involved (JSON array of ints).
    block_ids: Mapped[list[int]] = mapped_column(_JSON)
    #: Extra facts (JSON object); never tokens or text.
    details: Mapped[dict[str, Any]] = mapped_column(_JSON)
    #: Hash of the previous event of this stream (32 zero bytes for the first).
    prev_hash: Mapped[bytes] = mapped_column(LargeBinary(32))
    #: SHA-256(prev_hash || canonical bytes of this event).
    hash: Mapped[bytes] = mapped_column(LargeBinary(32))
    #: How ``hash`` encodes the event (``kvgov.audit.chain.FORMATS``): 1 for rows stored
    #: before revision ``0004_chain_format`` (the server default), 2 for rows written since.
    chain_format: Mapped[int] = mapped_column(SmallInteger, server_default=text("1"))


class AuditCheckpoint(Base):
    """A signed statement that a stream had chain hash ``chain_hash`` at ``seq``."""

    __tablename__ = "audit_checkpoints"
    __table_args__ = ({"sqlite_with_rowid": False},)

    stream: Mapped[str] = mapped_column(String(TEXT_LIMITS["stream"]), primary_key=True)
    seq: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    chain_hash: Mapped[bytes] = mapped_column(LargeBinary(32))
    #: Ed25519 signature over ``kvgov.audit.signing.checkpoint_message(stream, seq, chain_hash)``.
    signature: Mapped[bytes] = mapped_column(LargeBinary(64))
    key_id: Mapped[str] = mapped_column(String(16))
    time_us: Mapped[int] = mapped_column(BigInteger)


class AuditKey(Base):
    """A public key some writer signed checkpoints with, as that writer recorded it.

    Recorded keys let ``verify`` check signatures, but they prove nothing on their
    own (whoever can write the table can add a key): only keys the verifier is given
    (``--public-key``) are trusted.
    """

    __tablename__ = "audit_keys"

    key_id: Mapped[str] = mapped_column(String(16), primary_key=True)
    algorithm: Mapped[str] = mapped_column(String(16))
    public_key: Mapped[bytes] = mapped_column(LargeBinary(32))
    #: "configured" or "ephemeral" (generated because no key was configured).
    origin: Mapped[str] = mapped_column(String(16))
    #: The stream that first recorded it.
    stream: Mapped[str] = mapped_column(String(TEXT_LIMITS["stream"]))
    time_us: Mapped[int] = mapped_column(BigInteger)


#: Column order the writer inserts and the chain hashes (after ``stream``; the chain
#: hashes the format as its version tag, first).
EVENT_INSERT_COLUMNS: tuple[str, ...] = (
    "stream",
    "seq",
    "time_us",
    "type",
    *FIELDS,
    "block_ids",
    "details",
    "chain_format",
    "prev_hash",
    "hash",
)
