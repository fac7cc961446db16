"""what a deployment or a service serves: deployments.endpoints, services.endpoints;
deployments.capabilities

endpoints: the OpenAI endpoints served (chat, completions, embeddings); the rows that
exist served chat (and completions, which llama-server serves beside it), so the default
is both. capabilities: what the loaded chat template can do (tools), as the node reports
it after a load; none until the next one.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-05 15:40:00
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

JSONB = postgresql.JSONB
DEFAULT = sa.text("""'["chat", "completions"]'::jsonb""")


def upgrade() -> None:
    for table in ("deployments", "services"):
        op.add_column(table, sa.Column("endpoints", JSONB, nullable=False, server_default=DEFAULT))
    op.add_column("deployments", sa.Column("capabilities", JSONB, nullable=True))


def downgrade() -> None:
    op.drop_column("deployments", "capabilities")
    for table in ("services", "deployments"):
        op.drop_column(table, "endpoints")
