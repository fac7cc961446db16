"""the gateway's measurements per served model: gateway_measurements

One row per (served model, API process), overwritten every few seconds by that process
(api/gateway/measurements.py): invokes in flight and started, errors, time to first
token. Autoscale sums the fresh rows of a service's name (store/services/measurements.py).

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-05 12:20:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "gateway_measurements",
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("instance", sa.String(64), nullable=False),
        sa.Column("window_end", sa.DateTime(timezone=True), nullable=False),
        sa.Column("window_s", sa.Float, nullable=False),
        sa.Column("in_flight", sa.Integer, nullable=False),
        sa.Column("started", sa.Integer, nullable=False),
        sa.Column("errors", sa.Integer, nullable=False),
        sa.Column("ttft_count", sa.Integer, nullable=False),
        sa.Column("ttft_p50_s", sa.Float, nullable=True),
        sa.Column("ttft_p90_s", sa.Float, nullable=True),
        sa.PrimaryKeyConstraint("model", "instance"),
    )


def downgrade() -> None:
    op.drop_table("gateway_measurements")
