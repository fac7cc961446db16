"""dashboard login failures every API process counts: ui_login_failures

The dashboard's login limit (five wrong keys per client address in a window, then 429)
was counted in each API process's memory, so N processes allowed 5 x N tries. A failure
is now a row: every process counts the same rows, and rows older than the window are
pruned as new ones arrive, so the table stays as small as the failures of one window.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-05 08:10:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "ui_login_failures",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("client", sa.Text, nullable=False),
        sa.Column("failed_at", sa.DateTime(timezone=True), nullable=False),
    )
    # A login counts its address's recent failures; a failure prunes the oldest rows.
    op.create_index(
        "ix_ui_login_failures_client_failed_at", "ui_login_failures", ["client", "failed_at"]
    )
    op.create_index("ix_ui_login_failures_failed_at", "ui_login_failures", ["failed_at"])


def downgrade() -> None:
    op.drop_table("ui_login_failures")
