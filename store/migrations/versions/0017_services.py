"""model services and their replicas: services, service_replicas

A service is desired state (a model, its template, replicas, placement, an update
strategy); the service reconciler in the workers places each replica on a node's device
and moves it through an artifact job and a deployment. One live replica per device (a
partial unique index), one live service per served name.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-05 11:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

UUID = postgresql.UUID(as_uuid=True)
JSONB = postgresql.JSONB
WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "services",
        sa.Column("id", UUID, primary_key=True),
        sa.Column("name", sa.String(128), nullable=False),
        sa.Column("roles", JSONB, nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("template", JSONB, nullable=False),
        sa.Column("previous_template", JSONB, nullable=True),
        sa.Column("previous_generation", sa.Integer, nullable=True),
        sa.Column("generation", sa.Integer, nullable=False),
        sa.Column("replicas", sa.Integer, nullable=False),
        sa.Column("autoscale", JSONB, nullable=True),
        sa.Column("placement", JSONB, nullable=False),
        sa.Column("strategy", JSONB, nullable=False),
        sa.Column("rollout_state", sa.String(16), nullable=False),
        sa.Column("rollout_reason", sa.String(300), nullable=True),
        sa.Column("rollout_started_at", WHEN, nullable=True),
        sa.Column("last_receipt", JSONB, nullable=True),
        sa.Column("backoff", JSONB, nullable=False, server_default=sa.text("'{}'::jsonb")),
        sa.Column("scaled_at", WHEN, nullable=True),
        sa.Column("created_at", WHEN, nullable=False),
        sa.Column("updated_at", WHEN, nullable=False),
    )
    op.create_index(
        "ux_services_live_name",
        "services",
        ["name"],
        unique=True,
        postgresql_where=sa.text("state <> 'deleted'"),
    )
    op.create_table(
        "service_replicas",
        sa.Column("id", UUID, primary_key=True),
        sa.Column("service_id", UUID, sa.ForeignKey("services.id"), nullable=False),
        sa.Column("generation", sa.Integer, nullable=False),
        sa.Column("node_id", UUID, sa.ForeignKey("nodes.id"), nullable=False),
        sa.Column("device_id", sa.String(16), nullable=False),
        sa.Column("phase", sa.String(16), nullable=False),
        sa.Column("artifact_job_id", UUID, sa.ForeignKey("jobs.id"), nullable=True),
        sa.Column("deployment_id", UUID, sa.ForeignKey("deployments.id"), nullable=True),
        sa.Column("receipt", JSONB, nullable=True),
        sa.Column("failure_code", sa.String(64), nullable=True),
        sa.Column("failure_detail", sa.String(500), nullable=True),
        sa.Column("ended_reason", sa.String(64), nullable=True),
        sa.Column("created_at", WHEN, nullable=False),
        sa.Column("updated_at", WHEN, nullable=False),
        sa.Column("phase_changed_at", WHEN, nullable=False),
    )
    op.create_index("ix_service_replicas_service", "service_replicas", ["service_id", "phase"])
    op.create_index(
        "ux_service_replicas_live_device",
        "service_replicas",
        ["node_id", "device_id"],
        unique=True,
        postgresql_where=sa.text("phase <> 'ended'"),
    )


def downgrade() -> None:
    op.drop_table("service_replicas")
    op.drop_table("services")
