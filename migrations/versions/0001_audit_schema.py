"""Audit schema: append-only events, signed checkpoints, recorded signing keys.

Revision ID: 0001
Revises:
Create Date: 2025-01-01

Creates ``audit_events``, ``audit_checkpoints`` and ``audit_keys`` and the triggers
that make them append-only: UPDATE and DELETE are rejected on SQLite and PostgreSQL,
TRUNCATE too on PostgreSQL. Triggers stop mistakes, not a superuser; the hash chain
and signed checkpoints are what prove integrity (see docs/audit.md).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("audit_events", "audit_checkpoints", "audit_keys")
#: Indexes the compliance queries use: reuse / erasure by owner tenant, by requester,
#: decisions by policy revision. Every index costs each insert; (stream, seq) is the
#: primary key, so rows are stored in chain order (SQLite: WITHOUT ROWID).
INDEXES = (
    ("ix_audit_events_tenant_type_time", ["tenant", "type", "time_us"]),
    ("ix_audit_events_requester_time", ["requester_tenant", "time_us"]),
    ("ix_audit_events_policy_revision", ["policy_revision"]),
)
#: Denials are rare: a partial index holds only their rows.
DENIALS_WHERE = "type IN ('policy_denied', 'share_denied', 'policy_error')"

_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

PG_FUNCTION = """
CREATE OR REPLACE FUNCTION kvgov_audit_append_only() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'kvgov audit: % on % is not allowed, the audit trail is append-only',
        TG_OP, TG_TABLE_NAME
        USING ERRCODE = 'insufficient_privilege';
END
$$
"""


def upgrade() -> None:
    """Create the three tables, their indexes, and the append-only triggers."""
    op.create_table(
        "audit_events",
        sa.Column("stream", sa.String(128), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("time_us", sa.BigInteger(), nullable=False),
        sa.Column("type", sa.String(32), nullable=False),
        sa.Column("tenant", sa.String(256)),
        sa.Column("requester_tenant", sa.String(256)),
        sa.Column("classification", sa.String(256)),
        sa.Column("model", sa.String(256)),
        sa.Column("model_revision", sa.String(256)),
        sa.Column("adapter", sa.String(256)),
        sa.Column("adapter_revision", sa.String(256)),
        sa.Column("tokenizer", sa.String(256)),
        sa.Column("tokenizer_revision", sa.String(256)),
        sa.Column("template_version", sa.String(256)),
        sa.Column("sequence_id", sa.String(256)),
        sa.Column("token_count", sa.BigInteger()),
        sa.Column("reused_tokens", sa.BigInteger()),
        sa.Column("decision_id", sa.String(64)),
        sa.Column("policy_revision", sa.String(128)),
        sa.Column("block_ids", _JSON, nullable=False),
        sa.Column("details", _JSON, nullable=False),
        sa.Column("prev_hash", sa.LargeBinary(32), nullable=False),
        sa.Column("hash", sa.LargeBinary(32), nullable=False),
        sa.PrimaryKeyConstraint("stream", "seq", name="pk_audit_events"),
        sqlite_with_rowid=False,
    )
    for name, cols in INDEXES:
        op.create_index(name, "audit_events", cols)
    op.create_index(
        "ix_audit_events_denials_time",
        "audit_events",
        ["type", "time_us"],
        sqlite_where=sa.text(DENIALS_WHERE),
        postgresql_where=sa.text(DENIALS_WHERE),
    )
    op.create_table(
        "audit_checkpoints",
        sa.Column("stream", sa.String(128), nullable=False),
        sa.Column("seq", sa.BigInteger(), nullable=False),
        sa.Column("chain_hash", sa.LargeBinary(32), nullable=False),
        sa.Column("signature", sa.LargeBinary(64), nullable=False),
        sa.Column("key_id", sa.String(16), nullable=False),
        sa.Column("time_us", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("stream", "seq", name="pk_audit_checkpoints"),
        sqlite_with_rowid=False,
    )
    op.create_table(
        "audit_keys",
        sa.Column("key_id", sa.String(16), nullable=False),
        sa.Column("algorithm", sa.String(16), nullable=False),
        sa.Column("public_key", sa.LargeBinary(32), nullable=False),
        sa.Column("origin", sa.String(16), nullable=False),
        sa.Column("stream", sa.String(128), nullable=False),
        sa.Column("time_us", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("key_id", name="pk_audit_keys"),
        sqlite_with_rowid=False,
    )
    dialect = op.get_context().dialect.name
    if dialect == "postgresql":
        op.execute(PG_FUNCTION)
        for table in TABLES:
            op.execute(
                f"CREATE TRIGGER {table}_append_only BEFORE UPDATE OR DELETE ON {table} "
                "FOR EACH ROW EXECUTE FUNCTION kvgov_audit_append_only()"
            )
            op.execute(
                f"CREATE TRIGGER {table}_no_truncate BEFORE TRUNCATE ON {table} "
                "FOR EACH STATEMENT EXECUTE FUNCTION kvgov_audit_append_only()"
            )
    elif dialect == "sqlite":
        for table in TABLES:
            for verb in ("UPDATE", "DELETE"):
                op.execute(
                    f"CREATE TRIGGER {table}_no_{verb.lower()} BEFORE {verb} ON {table} "
                    f"BEGIN SELECT RAISE(ABORT, 'kvgov audit: {verb} on {table} is not "
                    "allowed, the audit trail is append-only'); END"
                )


def downgrade() -> None:
    """Drop the triggers and the tables (this deletes the audit trail)."""
    dialect = op.get_context().dialect.name
    for table in TABLES:
        if dialect == "postgresql":
            op.execute(f"DROP TRIGGER IF EXISTS {table}_append_only ON {table}")
            op.execute(f"DROP TRIGGER IF EXISTS {table}_no_truncate ON {table}")
        elif dialect == "sqlite":
            op.execute(f"DROP TRIGGER IF EXISTS {table}_no_update")
            op.execute(f"DROP TRIGGER IF EXISTS {table}_no_delete")
    if dialect == "postgresql":
        op.execute("DROP FUNCTION IF EXISTS kvgov_audit_append_only()")
    op.drop_table("audit_keys")
    op.drop_table("audit_checkpoints")
    op.drop_index("ix_audit_events_denials_time", table_name="audit_events")
    for name, _cols in reversed(INDEXES):
        op.drop_index(name, table_name="audit_events")
    op.drop_table("audit_events")
