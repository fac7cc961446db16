"""The runtime worker's deployment job routes."""

from __future__ import annotations

from fastapi import APIRouter

router = APIRouter()
