"""jobs: work handed to nodes under leases with fencing; the nodes' artifact inventory

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 17:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, UUID

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", UUID(as_uuid=True), primary_key=True),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("node_id", UUID(as_uuid=True), sa.ForeignKey("nodes.id"), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("spec", JSONB(), nullable=False),
        sa.Column("attempt", sa.Integer(), server_default="0", nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("available_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("lease_id", UUID(as_uuid=True), nullable=True),
        sa.Column("lease_epoch", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("cancel_requested_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("progress", JSONB(), nullable=True),
        sa.Column("failure_code", sa.String(64), nullable=True),
        sa.Column("failure_retryable", sa.Boolean(), nullable=True),
        sa.Column("failure_detail", sa.String(500), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
    )
    op.create_index(
        "ix_jobs_claimable",
        "jobs",
        ["node_id", "kind", "available_at"],
        postgresql_where=sa.text("state = 'queued'"),
    )
    op.create_index(
        "ix_jobs_leased",
        "jobs",
        ["lease_expires_at"],
        postgresql_where=sa.text("state = 'leased'"),
    )
    op.create_index("ix_jobs_created", "jobs", ["created_at", "id"])
    op.create_table(
        "node_artifacts",
        sa.Column("node_id", UUID(as_uuid=True), sa.ForeignKey("nodes.id"), primary_key=True),
        sa.Column("root", sa.String(1024), primary_key=True),
        sa.Column("repository", sa.String(200), primary_key=True),
        sa.Column("commit", sa.String(40), primary_key=True),
        sa.Column("files", JSONB(), nullable=False),
        sa.Column("job_id", UUID(as_uuid=True), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("node_artifacts")
    op.drop_table("jobs")
