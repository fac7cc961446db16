"""audit from events: audit rows carry their event id; accepted inventory waits for workers

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 14:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, UUID

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("audit_log", sa.Column("event_id", UUID(as_uuid=True), nullable=True))
    op.create_unique_constraint("uq_audit_log_event_id", "audit_log", ["event_id"])
    # When the consumer wrote the row: `recorded_at - at` is how far the log lagged.
    op.add_column(
        "audit_log",
        sa.Column(
            "recorded_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
    )
    # A GPU target is "<node_id>/<gpu uuid>": 37 + up to 128 characters.
    op.alter_column("audit_log", "target_id", type_=sa.String(200))
    op.create_table(
        "inventory_observations",
        sa.Column("node_id", UUID(as_uuid=True), sa.ForeignKey("nodes.id"), primary_key=True),
        sa.Column("sequence", sa.BigInteger(), primary_key=True),
        sa.Column("received_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("correlation_id", sa.String(128), nullable=True),
        sa.Column("report", JSONB(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("inventory_observations")
    op.alter_column("audit_log", "target_id", type_=sa.String(100))
    op.drop_column("audit_log", "recorded_at")
    op.drop_constraint("uq_audit_log_event_id", "audit_log", type_="unique")
    op.drop_column("audit_log", "event_id")
