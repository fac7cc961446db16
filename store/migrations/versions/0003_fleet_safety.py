"""fleet safety: control-plane presence (restart grace) and fleet incidents (partition breaker)

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 10:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "control_plane_presence",
        sa.Column("component", sa.String(length=32), nullable=False),
        sa.Column("last_seen_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("down_since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("resumed_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("component"),
    )
    op.create_table(
        "fleet_incidents",
        sa.Column("id", sa.UUID(), nullable=False),
        sa.Column("kind", sa.String(length=64), nullable=False),
        sa.Column("opened_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("silent_nodes", sa.Integer(), nullable=False),
        sa.Column("watched_nodes", sa.Integer(), nullable=False),
        sa.Column("acknowledged_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("acknowledged_reason", sa.String(length=500), nullable=True),
        sa.Column("resolved_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index(
        "uq_fleet_incidents_one_open",
        "fleet_incidents",
        ["kind"],
        unique=True,
        postgresql_where=sa.text("resolved_at IS NULL"),
    )


def downgrade() -> None:
    op.drop_index(
        "uq_fleet_incidents_one_open",
        table_name="fleet_incidents",
        postgresql_where=sa.text("resolved_at IS NULL"),
    )
    op.drop_table("fleet_incidents")
    op.drop_table("control_plane_presence")
