"""node changes notify: API processes drop what they cached about a node (LISTEN
modelforge_node_changes, payload: the node id) when it changes

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01 14:20:00
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# Delivered at commit, only if it commits; one per node per transaction (PostgreSQL folds
# identical notifications of a transaction). One statement per execute (asyncpg).
FUNCTION = """
CREATE FUNCTION modelforge_node_changes_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_TABLE_NAME = 'nodes' THEN
        PERFORM pg_notify('modelforge_node_changes', NEW.id::text);
    ELSE
        PERFORM pg_notify('modelforge_node_changes', NEW.node_id::text);
    END IF;
    RETURN NULL;
END
$$
"""
# Only what the API's node cache holds or admits on; last_heartbeat_at is not in it.
NODES_TRIGGER = """
CREATE TRIGGER nodes_changes_notify AFTER UPDATE ON nodes FOR EACH ROW
    WHEN (OLD.enabled IS DISTINCT FROM NEW.enabled
          OR OLD.decommissioned_at IS DISTINCT FROM NEW.decommissioned_at
          OR OLD.liveness IS DISTINCT FROM NEW.liveness
          OR OLD.agent_version IS DISTINCT FROM NEW.agent_version
          OR OLD.protocol_version IS DISTINCT FROM NEW.protocol_version
          OR OLD.capabilities IS DISTINCT FROM NEW.capabilities)
    EXECUTE FUNCTION modelforge_node_changes_notify()
"""
CREDENTIALS_TRIGGER = """
CREATE TRIGGER node_credentials_changes_notify AFTER UPDATE ON node_credentials FOR EACH ROW
    WHEN (OLD.revoked_at IS DISTINCT FROM NEW.revoked_at)
    EXECUTE FUNCTION modelforge_node_changes_notify()
"""


def upgrade() -> None:
    op.execute(FUNCTION)
    op.execute(NODES_TRIGGER)
    op.execute(CREDENTIALS_TRIGGER)


def downgrade() -> None:
    op.execute("DROP TRIGGER node_credentials_changes_notify ON node_credentials")
    op.execute("DROP TRIGGER nodes_changes_notify ON nodes")
    op.execute("DROP FUNCTION modelforge_node_changes_notify()")
