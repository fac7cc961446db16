"""the control plane's per-minute rollup: usage_minutes, fleet_minutes, node_minutes;
service_clients.max_tokens_per_day

usage_minutes: the gateway's invokes per (minute, service client, served model, outcome),
added to by every API process (store/rollup/usage.py: one additive upsert per flush).
fleet_minutes: the fleet's counts once a minute, written by the rollup worker (any number
of them, idempotently). node_minutes: each node's telemetry once a minute, for the node
panel's sparklines (short retention). The rollup worker prunes all three by age.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-05 14:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

UUID = postgresql.UUID(as_uuid=True)
JSONB = postgresql.JSONB
WHEN = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "usage_minutes",
        sa.Column("minute", WHEN, nullable=False),
        sa.Column("client_id", UUID, nullable=False),
        sa.Column("model", sa.String(128), nullable=False),
        sa.Column("outcome", sa.String(64), nullable=False),
        sa.Column("requests", sa.BigInteger, nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger, nullable=False),
        sa.Column("completion_tokens", sa.BigInteger, nullable=False),
        sa.Column("ttft_count", sa.BigInteger, nullable=False),
        sa.Column("ttft_sum_s", sa.Float, nullable=False),
        sa.Column("ttft_buckets", postgresql.ARRAY(sa.BigInteger), nullable=False),
        sa.PrimaryKeyConstraint("minute", "client_id", "model", "outcome"),
    )
    op.create_index("ix_usage_minutes_client_minute", "usage_minutes", ["client_id", "minute"])
    op.create_table(
        "fleet_minutes",
        sa.Column("minute", WHEN, primary_key=True),
        sa.Column("nodes", JSONB, nullable=False),
        sa.Column("gpus", sa.Integer, nullable=False),
        sa.Column("gpu_memory_total_bytes", sa.BigInteger, nullable=False),
        sa.Column("gpu_memory_used_bytes", sa.BigInteger, nullable=False),
        sa.Column("gpu_utilization_percent", sa.Float, nullable=True),
        sa.Column("deployments", JSONB, nullable=False),
        sa.Column("services", JSONB, nullable=False),
    )
    op.create_table(
        "node_minutes",
        sa.Column("node_id", UUID, nullable=False),
        sa.Column("minute", WHEN, nullable=False),
        sa.Column("ram_total_bytes", sa.BigInteger, nullable=True),
        sa.Column("ram_used_bytes", sa.BigInteger, nullable=True),
        sa.Column("gpu_utilization_percent", sa.Float, nullable=True),
        sa.Column("gpu_utilization_max_percent", sa.Float, nullable=True),
        sa.Column("gpu_memory_used_bytes", sa.BigInteger, nullable=True),
        sa.Column("gpu_temperature_max_c", sa.Float, nullable=True),
        sa.Column("gpu_power_w", sa.Float, nullable=True),
        sa.PrimaryKeyConstraint("node_id", "minute"),
    )
    # Pruning deletes by age across every node.
    op.create_index("ix_node_minutes_minute", "node_minutes", ["minute"])
    op.add_column("service_clients", sa.Column("max_tokens_per_day", sa.BigInteger, nullable=True))


def downgrade() -> None:
    op.drop_column("service_clients", "max_tokens_per_day")
    op.drop_index("ix_node_minutes_minute", table_name="node_minutes")
    op.drop_table("node_minutes")
    op.drop_table("fleet_minutes")
    op.drop_index("ix_usage_minutes_client_minute", table_name="usage_minutes")
    op.drop_table("usage_minutes")
