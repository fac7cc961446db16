"""Operator routes for deployments (create, list, get, drain, unload) and their jobs."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter()
