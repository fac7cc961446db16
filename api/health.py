"""Process health (`/healthz`) and readiness, meaning the database answers (`/readyz`)."""

from __future__ import annotations

from fastapi import APIRouter
from sqlalchemy import text

from api.deps import State

router = APIRouter(tags=["health"])


@router.get("/healthz")
async def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
async def readyz(state: State) -> dict[str, str]:
    async with state.engine.connect() as connection:
        await connection.execute(text("SELECT 1"))
    return {"status": "ready"}
