"""deployments and service clients (M5)

A deployment is an artifact served by one node's runtime worker on one device, moved
through its lifecycle by typed jobs (store/deployments/rules.py). A service client is the
gateway's caller: its credential's digest and its scope.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02 08:00:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB, UUID

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "deployments",
        sa.Column("id", UUID(as_uuid=True), primary_key=True),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("roles", JSONB(), nullable=False),
        sa.Column("node_id", UUID(as_uuid=True), sa.ForeignKey("nodes.id"), nullable=False),
        sa.Column("device_id", sa.String(16), nullable=False),
        sa.Column("artifact", JSONB(), nullable=False),
        sa.Column(
            "profile_id", UUID(as_uuid=True), sa.ForeignKey("runtime_profiles.id"), nullable=False
        ),
        sa.Column("profile_version", sa.Integer(), nullable=False),
        sa.Column(
            "environment_id",
            UUID(as_uuid=True),
            sa.ForeignKey("runtime_environments.id"),
            nullable=False,
        ),
        sa.Column("spec", JSONB(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("max_concurrent", sa.Integer(), nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=False),
        sa.Column("failure_code", sa.String(64)),
        sa.Column("failure_detail", sa.String(500)),
        sa.Column("queue_depth", sa.Integer()),
        sa.Column("cooldown_until", sa.DateTime(timezone=True)),
        sa.Column("cooldown_reason", sa.String(200)),
        sa.Column("drain_deadline_s", sa.Float()),
        sa.Column("job_id", UUID(as_uuid=True), sa.ForeignKey("jobs.id")),
        sa.Column("health_due_at", sa.DateTime(timezone=True)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("state_changed_at", sa.DateTime(timezone=True), nullable=False),
    )
    # The reconciler's sweep and the gateway's routing both read by state.
    op.create_index("ix_deployments_state", "deployments", ["state", "model"])
    op.create_index("ix_deployments_node", "deployments", ["node_id"])
    op.create_table(
        "service_clients",
        sa.Column("id", UUID(as_uuid=True), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("digest", sa.LargeBinary(), nullable=False),
        sa.Column("models", JSONB(), nullable=False),
        sa.Column("roles", JSONB(), nullable=False),
        sa.Column("max_concurrent", sa.Integer()),
        sa.Column("rate_per_minute", sa.Integer()),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("rotated_at", sa.DateTime(timezone=True)),
        sa.Column("revoked_at", sa.DateTime(timezone=True)),
    )


def downgrade() -> None:
    op.drop_table("service_clients")
    op.drop_index("ix_deployments_node", table_name="deployments")
    op.drop_index("ix_deployments_state", table_name="deployments")
    op.drop_table("deployments")
