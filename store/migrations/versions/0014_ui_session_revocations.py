"""dashboard logouts every API process hears: ui_session_revocations

A dashboard session is a signed cookie (api/ui/session.py) that every API process
admits without shared state; logout used to end it only in the process that served it.
A revocation is now a row (kept until the session would have expired) and a NOTIFY on
modelforge_ui_logouts: running processes hear it at once, a process that starts or
reconnects later reads the rows.

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-03 17:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ui_session_revocations",
        sa.Column("nonce", sa.String(64), primary_key=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("ui_session_revocations")
