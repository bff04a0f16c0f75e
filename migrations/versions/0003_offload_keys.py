"""Offload keys: wrapped per-tenant data keys of the encrypted offload tiers.

Revision ID: 0003_offload_keys
Revises: 0001
Create Date: 2025-01-20

Creates ``offload_keys`` (see ``kvgov.audit.offload_keys``) and the partial unique
index that allows one live key per tenant. The table is not append-only: destroying
a key (crypto-shredding its tenant) erases the wrapped bytes in place.
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003_offload_keys"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

LIVE_WHERE = "destroyed_us IS NULL"


def upgrade() -> None:
    """Create ``offload_keys`` and its one-live-key-per-tenant index."""
    op.create_table(
        "offload_keys",
        sa.Column("key_id", sa.String(32), nullable=False),
        sa.Column("tenant", sa.String(256), nullable=False),
        sa.Column("kek_id", sa.String(256), nullable=False),
        sa.Column("wrapped", sa.LargeBinary(128)),
        sa.Column("created_us", sa.BigInteger(), nullable=False),
        sa.Column("destroyed_us", sa.BigInteger()),
        sa.PrimaryKeyConstraint("key_id", name="pk_offload_keys"),
    )
    op.create_index(
        "uq_offload_keys_live_tenant",
        "offload_keys",
        ["tenant"],
        unique=True,
        sqlite_where=sa.text(LIVE_WHERE),
        postgresql_where=sa.text(LIVE_WHERE),
    )


def downgrade() -> None:
    """Drop ``offload_keys``: every wrapped data key, so every offloaded object is unreadable."""
    op.drop_index("uq_offload_keys_live_tenant", table_name="offload_keys")
    op.drop_table("offload_keys")
