"""The tamper-evident audit trail of kvgov, in SQL.

Record events with :class:`AuditLog` (batched, off the caller's thread; critical events
durable before ``record`` returns, in the database or, when it is down or does not
answer within a deadline, the local spool: :meth:`AuditLog.record_durable` returns a
:class:`Recorded` saying which), prove integrity with :func:`verify` (per-stream
SHA-256 hash chains, Ed25519-signed checkpoints, optionally a signed list of
:class:`ExpectedStreams`), and answer compliance questions with :class:`AuditQueries`.
It also keeps the wrapped data keys of the encrypted offload tiers
(:class:`SqlWrappedKeyStore`), because this package owns SQL. This package never
imports torch or the allocator.
"""

from kvgov.audit.chain import GENESIS_HASH, ChainHash, canonical_event_bytes, chain_hash
from kvgov.audit.durability import AuditStats, Deferred, Evidence, Recorded
from kvgov.audit.events import CRITICAL_EVENT_TYPES, FORBIDDEN_DETAIL_KEYS, AuditEvent, EventType
from kvgov.audit.expect import (
    ExpectedStream,
    ExpectedStreams,
    load_expected_streams,
    sign_expected_streams,
)
from kvgov.audit.handoff import ProcessAuditLog  # registers AuditLog(writer="process")
from kvgov.audit.offload_keys import SqlWrappedKeyStore, StoredDataKey
from kvgov.audit.queries import AuditQueries, AuditRecord, CheckpointInfo
from kvgov.audit.signing import SigningKey, key_id, load_public_key, load_signing_key
from kvgov.audit.store import current_revision, downgrade, head_revision, open_engine, upgrade
from kvgov.audit.verify import Problem, StreamReport, VerifyReport, verify
from kvgov.audit.writer import AuditLog

__all__ = [
    "CRITICAL_EVENT_TYPES",
    "FORBIDDEN_DETAIL_KEYS",
    "GENESIS_HASH",
    "AuditEvent",
    "AuditLog",
    "AuditQueries",
    "AuditRecord",
    "AuditStats",
    "ChainHash",
    "CheckpointInfo",
    "Deferred",
    "EventType",
    "Evidence",
    "ExpectedStream",
    "ExpectedStreams",
    "Problem",
    "ProcessAuditLog",
    "Recorded",
    "SigningKey",
    "SqlWrappedKeyStore",
    "StoredDataKey",
    "StreamReport",
    "VerifyReport",
    "canonical_event_bytes",
    "chain_hash",
    "current_revision",
    "downgrade",
    "head_revision",
    "key_id",
    "load_expected_streams",
    "load_public_key",
    "load_signing_key",
    "open_engine",
    "sign_expected_streams",
    "upgrade",
    "verify",
]
