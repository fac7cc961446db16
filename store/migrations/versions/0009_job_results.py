"""jobs.result: a job's result gets a column of its own, out of `progress`

A completed health or unload job kept its report in progress["result"], where the next
progress write could overwrite it and where an operator's view had to dig it out. The
result is now its own column, typed per kind (store/results.py); existing results move
there, and back on downgrade.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 10:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("jobs", sa.Column("result", JSONB(), nullable=True))
    # What is left of progress once the result moves out is nothing: NULL, not {}.
    op.execute(
        "UPDATE jobs SET result = progress -> 'result',"
        " progress = NULLIF(progress - 'result', '{}'::jsonb)"
        " WHERE progress ? 'result'"
    )


def downgrade() -> None:
    op.execute(
        "UPDATE jobs SET progress = coalesce(progress, '{}'::jsonb)"
        " || jsonb_build_object('result', result) WHERE result IS NOT NULL"
    )
    op.drop_column("jobs", "result")
