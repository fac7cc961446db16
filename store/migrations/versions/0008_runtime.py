"""runtime: profiles and environments (immutable, versioned), the runtime workers'
report stream, and probe evidence per (node, device, artifact, profile, environment)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 21:30:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, UUID

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "runtime_profiles",
        sa.Column("id", UUID(as_uuid=True), primary_key=True),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("settings", JSONB(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("name", "version", name="uq_runtime_profiles_name_version"),
    )
    op.create_table(
        "runtime_environments",
        sa.Column("id", UUID(as_uuid=True), primary_key=True),
        sa.Column("binary_sha256", sa.String(64), nullable=False, unique=True),
        sa.Column("version", sa.String(200), nullable=False),
        sa.Column("backend", sa.String(16), nullable=False),
        sa.Column("first_reported_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("first_node_id", UUID(as_uuid=True), sa.ForeignKey("nodes.id"), nullable=False),
    )
    # The runtime worker's report is a third per-node stream, ordered like inventory.
    op.execute(
        "INSERT INTO node_streams (node_id, stream) SELECT id, 'runtime' FROM nodes"
        " ON CONFLICT DO NOTHING"
    )
    op.create_table(
        "runtime_evidence",
        sa.Column("node_id", UUID(as_uuid=True), sa.ForeignKey("nodes.id"), primary_key=True),
        sa.Column("device_id", sa.String(16), primary_key=True),
        sa.Column("artifact_digest", sa.String(64), primary_key=True),
        sa.Column(
            "profile_id",
            UUID(as_uuid=True),
            sa.ForeignKey("runtime_profiles.id"),
            primary_key=True,
        ),
        sa.Column(
            "environment_id",
            UUID(as_uuid=True),
            sa.ForeignKey("runtime_environments.id"),
            primary_key=True,
        ),
        sa.Column("artifact_path", sa.String(2048), nullable=False),
        sa.Column("health", JSONB(), nullable=False),
        sa.Column("evidence", JSONB(), nullable=False),
        sa.Column("job_id", UUID(as_uuid=True), sa.ForeignKey("jobs.id"), nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("runtime_evidence")
    op.execute("DELETE FROM node_streams WHERE stream = 'runtime'")
    op.drop_table("runtime_environments")
    op.drop_table("runtime_profiles")
