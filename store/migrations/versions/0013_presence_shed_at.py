"""control plane presence: when an API process last shed load

A heartbeat refused with 429 (api/shedding.py) is one the control plane did not hear.
The presence row carries the last such refusal so that the liveness sweepers hold every
transition for a stale threshold after it (store/fleet.py: shedding_recently): overload
must never turn into false stale or offline transitions.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03 17:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "control_plane_presence", sa.Column("shed_at", sa.DateTime(timezone=True), nullable=True)
    )


def downgrade() -> None:
    op.drop_column("control_plane_presence", "shed_at")
