"""outbox notify: every committed outbox insert wakes the relays (LISTEN modelforge_outbox)

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01 11:35:00
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

# Per statement, not per row: a transaction that writes many events wakes the relays
# once, and PostgreSQL delivers the notification only when (and if) it commits.
# One statement per execute: asyncpg prepares each, and a prepared statement holds one.
FUNCTION = """
CREATE FUNCTION modelforge_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify('modelforge_outbox', '');
    RETURN NULL;
END
$$
"""
TRIGGER = """
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT EXECUTE FUNCTION modelforge_outbox_notify()
"""


def upgrade() -> None:
    op.execute(FUNCTION)
    op.execute(TRIGGER)


def downgrade() -> None:
    op.execute("DROP TRIGGER outbox_notify ON outbox")
    op.execute("DROP FUNCTION modelforge_outbox_notify()")
