"""The fleet's control plane: engines, signed orders and each engine's result.

Revision ID: 0005_fleet
Revises: 0004_chain_format
Create Date: 2026-11-26

Creates ``fleet_engines`` (one row per governed engine: kind, versions, policy
revision, key id, audit stream, heartbeat), ``fleet_orders`` (operator-signed orders:
purge, invalidate, rotate-secret, rollout) and ``fleet_results`` (one row per order and
engine: completed, refused, failed; the primary key makes a replayed order execute
once). See ``kvgov.audit.fleet`` and docs/fleet.md. Orders and results are evidence:
nothing updates or deletes them; engines update their own row (heartbeat).
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import context, op

from kvgov.exceptions import AuditDowngradeRefused

revision: str = "0005_fleet"
down_revision: str | None = "0004_chain_format"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    """Create ``fleet_engines``, ``fleet_orders`` and ``fleet_results``."""
    op.create_table(
        "fleet_engines",
        sa.Column("engine_id", sa.String(256), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("versions", sa.Text(), nullable=False),
        sa.Column("policy_revision", sa.String(256), nullable=False),
        sa.Column("key_id", sa.String(64), nullable=False),
        sa.Column("audit_stream", sa.String(256), nullable=False),
        sa.Column("started_us", sa.BigInteger(), nullable=False),
        sa.Column("heartbeat_us", sa.BigInteger(), nullable=False),
        sa.Column("stopped_us", sa.BigInteger()),
        sa.PrimaryKeyConstraint("engine_id", name="pk_fleet_engines"),
    )
    op.create_table(
        "fleet_orders",
        sa.Column("seq", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("order_id", sa.String(32), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("issued_us", sa.BigInteger(), nullable=False),
        sa.Column("signer_key_id", sa.String(64), nullable=False),
        sa.Column("signature", sa.LargeBinary(128), nullable=False),
        sa.PrimaryKeyConstraint("seq", name="pk_fleet_orders"),
        sa.UniqueConstraint("order_id", name="uq_fleet_orders_order_id"),
    )
    op.create_table(
        "fleet_results",
        sa.Column("order_id", sa.String(32), nullable=False),
        sa.Column("engine_id", sa.String(256), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("verified", sa.Boolean()),
        sa.Column("event_id", sa.String(320)),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("done_us", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("order_id", "engine_id", name="pk_fleet_results"),
    )


def downgrade() -> None:
    """Drop the fleet tables (the audit trail keeps each engine's evidence events).

    A downgrade on below ``0004_chain_format`` is refused there while format-2 events
    exist; it is refused here first, before anything is dropped (SQLite runs DDL outside
    the migration's transaction, so a refusal after this step would leave the fleet
    tables dropped under the ``0005_fleet`` revision).
    """
    target = context.get_revision_argument()
    if not context.is_offline_mode() and target not in (None, "-1", "0004_chain_format"):
        count = (
            op.get_bind()
            .execute(sa.text("SELECT count(*) FROM audit_events WHERE chain_format <> 1"))
            .scalar_one()
        )
        if count:
            raise AuditDowngradeRefused(
                "0004_chain_format",
                f"{count} audit event(s) are chain format 2, which the schema before it "
                "cannot tell from format 1: they would all fail verification. Keep this "
                "revision (or downgrade to base, which drops the audit trail)",
            )
    op.drop_table("fleet_results")
    op.drop_table("fleet_orders")
    op.drop_table("fleet_engines")
