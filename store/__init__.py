"""PostgreSQL storage: tables, engine factory and Alembic migrations."""
