"""Service clients: the callers of the gateway. A credential kind of their own (prefix
`mfs`, schemas/protocol.py), shown once, stored as a digest, scoped to served models
and/or roles, with optional concurrency and rate bounds and a token budget a day. A
node credential is never accepted where a service client's is, and the reverse holds
too."""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum
from typing import Annotated

from pydantic import BeforeValidator, ConfigDict, Field, Strict, model_validator

from schemas.base import Name, WireModel, json_integer
from schemas.deployments import Roles, ServedModel


class ServiceClientState(StrEnum):
    ACTIVE = "active"
    REVOKED = "revoked"


class ServiceClientCreate(WireModel):
    # At least one model or role: said in the JSON Schema too, so a client's validator
    # and ours agree.
    model_config = ConfigDict(
        json_schema_extra={
            "anyOf": [
                {"required": ["models"], "properties": {"models": {"minItems": 1}}},
                {"required": ["roles"], "properties": {"roles": {"minItems": 1}}},
            ]
        }
    )

    name: Name
    models: Annotated[list[ServedModel], Field(max_length=64)] = Field(default_factory=list)
    roles: Roles = Field(default_factory=list)
    # Requests at once, across this client's calls (per API process).
    max_concurrent: (
        Annotated[int, Strict(), Field(ge=1, le=10_000), BeforeValidator(json_integer)] | None
    ) = None
    # Requests per minute (per API process).
    rate_per_minute: (
        Annotated[int, Strict(), Field(ge=1, le=1_000_000), BeforeValidator(json_integer)] | None
    ) = None
    # Prompt and completion tokens a UTC day, across every API process; once spent, the
    # gateway refuses the client (429 budget_exhausted) until the next UTC midnight. The
    # check reads the rollup as of a few seconds ago, so the last invokes admitted
    # before it is spent may take a client over it (api/gateway/usage.py).
    max_tokens_per_day: (
        Annotated[int, Strict(), Field(ge=1, le=10**12), BeforeValidator(json_integer)] | None
    ) = None

    @model_validator(mode="after")
    def _scoped(self) -> ServiceClientCreate:
        if not self.models and not self.roles:
            raise ValueError("a service client is scoped to at least one model or role")
        return self


class ServiceClientView(WireModel):
    id: uuid.UUID
    name: str
    models: list[str]
    roles: list[str]
    max_concurrent: int | None
    rate_per_minute: int | None
    max_tokens_per_day: int | None
    state: ServiceClientState
    created_at: datetime
    rotated_at: datetime | None
    revoked_at: datetime | None


class ServiceClientCreated(ServiceClientView):
    """Create and rotate answer the secret once; only its digest is kept."""

    secret: str


class ServiceClientList(WireModel):
    items: list[ServiceClientView]
