"""gateway changes notify: API processes drop what the gateway cached about a service
client or the routing table (LISTEN modelforge_gateway_changes; payload `c:<client id>`
or `d:<deployment id>`) when either changes

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02 12:30:00
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

# Delivered at commit, only if it commits (PostgreSQL folds identical notifications of
# one transaction). One statement per execute (asyncpg).
FUNCTION = """
CREATE FUNCTION modelforge_gateway_changes_notify() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    row_id uuid;
BEGIN
    IF TG_OP = 'DELETE' THEN
        row_id := OLD.id;
    ELSE
        row_id := NEW.id;
    END IF;
    IF TG_OP = 'UPDATE' AND OLD IS NOT DISTINCT FROM NEW THEN
        RETURN NULL;
    END IF;
    IF TG_TABLE_NAME = 'service_clients' THEN
        PERFORM pg_notify('modelforge_gateway_changes', 'c:' || row_id::text);
    ELSE
        PERFORM pg_notify('modelforge_gateway_changes', 'd:' || row_id::text);
    END IF;
    RETURN NULL;
END
$$
"""
TRIGGERS = {
    "service_clients_gateway_notify": "service_clients",
    "deployments_gateway_notify": "deployments",
}


def upgrade() -> None:
    op.execute(FUNCTION)
    for name, table in TRIGGERS.items():
        op.execute(
            f"CREATE TRIGGER {name} AFTER INSERT OR UPDATE OR DELETE ON {table}"
            " FOR EACH ROW EXECUTE FUNCTION modelforge_gateway_changes_notify()"
        )


def downgrade() -> None:
    for name, table in TRIGGERS.items():
        op.execute(f"DROP TRIGGER {name} ON {table}")
    op.execute("DROP FUNCTION modelforge_gateway_changes_notify()")
