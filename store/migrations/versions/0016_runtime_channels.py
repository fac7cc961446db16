"""the runtime worker's held channel, as every worker sees it: runtime_channels

A deployment whose runtime worker died (SIGKILL, a crash) used to stay `ready` for the
admin API, the CLI and the dashboard until its node as a whole turned offline, although
the gateway could no longer reach it. The API process holding a node's runtime channel
now keeps a row: when it opened, and until when it counts as held (refreshed at each
keep-alive, cut short when the channel ends). The deployment reconciler in the workers
reads it, so the truth survives the API process that held the channel.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-05 08:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runtime_channels",
        sa.Column(
            "node_id", postgresql.UUID(as_uuid=True), sa.ForeignKey("nodes.id"), primary_key=True
        ),
        sa.Column("channel_id", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("opened_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("closed_at", sa.DateTime(timezone=True), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("runtime_channels")
