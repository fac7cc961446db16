"""`GET /v1/models` and `POST /v1/chat/completions`."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter(tags=["gateway"])
