"""Chain format 2: a ``chain_format`` column on ``audit_events``.

Revision ID: 0004_chain_format
Revises: 0003_offload_keys
Create Date: 2026-11-23

Adds ``audit_events.chain_format`` (smallint, not null, server default 1): every row
already stored, and any row inserted without it, is chain format 1 (the encoding its
hash was made with); writers of this revision insert 2 (RFC 8785, see
``kvgov.audit.chain``). No row is rewritten: the table stays append-only and the hashes
are untouched.

Downgrade drops the column, and so refuses while format-2 rows exist (the schema before
this revision would verify them as format 1, and every one would fail), unless the
target is ``base``, which drops the whole trail anyway. Offline (``--sql``) the rows
cannot be counted: the rendered script says so.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

from kvgov.exceptions import AuditDowngradeRefused

revision: str = "0004_chain_format"
down_revision: str | None = "0003_offload_keys"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Add ``chain_format``, 1 for every row already there."""
    op.add_column(
        "audit_events",
        sa.Column("chain_format", sa.SmallInteger(), nullable=False, server_default=sa.text("1")),
    )


def downgrade() -> None:
    """Drop ``chain_format``, refusing while rows of format 2 exist (unless going to base)."""
    to_base = context.get_revision_argument() is None
    if context.is_offline_mode():
        op.execute(
            "-- kvgov: rows with chain_format <> 1 must not exist (they would no longer verify)"
        )
    elif not to_base:
        count = (
            op.get_bind()
            .execute(sa.text("SELECT count(*) FROM audit_events WHERE chain_format <> 1"))
            .scalar_one()
        )
        if count:
            raise AuditDowngradeRefused(
                revision,
                f"{count} audit event(s) are chain format 2, which the schema before it "
                "cannot tell from format 1: they would all fail verification. Keep this "
                "revision (or downgrade to base, which drops the audit trail)",
            )
    op.drop_column("audit_events", "chain_format")
