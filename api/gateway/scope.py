"""What a service client may reach: the served models and roles it names and its bounds,
as the gateway holds it once the client is admitted (api/gateway/auth.py), caches it
(api/gateway/cache.py) and bounds it (api/gateway/limits.py). A value of its own, so the
cache and the limits the API's state holds need nothing of the authentication route."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from store.deployments.service_client_tables import ServiceClient


@dataclass(frozen=True)
class ClientScope:
    """Who is calling, and what it may call: the served models and roles it names, and
    its bounds (api/gateway/limits.py). None: no bound."""

    client_id: uuid.UUID
    name: str
    models: frozenset[str]
    roles: frozenset[str]
    max_concurrent: int | None
    rate_per_minute: int | None
    # Prompt and completion tokens a UTC day (api/gateway/usage.py).
    max_tokens_per_day: int | None = None

    def allows(self, model: str) -> bool:
        """A model or role name this client is scoped to."""
        return model in self.models or model in self.roles


def scope_of(client: ServiceClient) -> ClientScope:
    return ClientScope(
        client_id=client.id,
        name=client.name,
        models=frozenset(client.models),
        roles=frozenset(client.roles),
        max_concurrent=client.max_concurrent,
        rate_per_minute=client.rate_per_minute,
        max_tokens_per_day=client.max_tokens_per_day,
    )
