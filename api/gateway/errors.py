"""The refusals every gateway route documents (OpenAPI), in OpenAI's envelope."""

from __future__ import annotations

from typing import Any

from schemas.gateway import GatewayErrorBody

ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": GatewayErrorBody} for status in (401, 403, 404, 413, 422, 429, 502, 503)
}
