"""Operator routes for service clients (create, list, get, rotate, revoke)."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter()
