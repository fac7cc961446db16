"""node changes notify: a node coming online is not a change the node cache must hear

The API's node cache holds only online nodes, so a node that becomes online is in no
process's cache, and the notification only made the process that recorded it forget
the node it had just cached: every returning node took two transactional heartbeats
instead of one, and at 5,000 returning nodes that second round kept the fleet from
ever settling (ops/bench/fleet.py). Leaving online still notifies, as do the standing
and the agent's facts.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-03 13:40:00
"""

from __future__ import annotations

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

_TRIGGER = """
CREATE TRIGGER nodes_changes_notify AFTER UPDATE ON nodes FOR EACH ROW
    WHEN (OLD.enabled IS DISTINCT FROM NEW.enabled
          OR OLD.decommissioned_at IS DISTINCT FROM NEW.decommissioned_at
          OR (OLD.liveness IS DISTINCT FROM NEW.liveness AND {liveness})
          OR OLD.agent_version IS DISTINCT FROM NEW.agent_version
          OR OLD.protocol_version IS DISTINCT FROM NEW.protocol_version
          OR OLD.capabilities IS DISTINCT FROM NEW.capabilities)
    EXECUTE FUNCTION modelforge_node_changes_notify()
"""


def upgrade() -> None:
    op.execute("DROP TRIGGER nodes_changes_notify ON nodes")
    op.execute(_TRIGGER.format(liveness="NEW.liveness <> 'online'"))


def downgrade() -> None:
    op.execute("DROP TRIGGER nodes_changes_notify ON nodes")
    op.execute(_TRIGGER.format(liveness="TRUE"))
