"""The gateway knows a live service by its name even while no replica of it is ready (it
heals, it scales from zero): a 503 with Retry-After, which OpenAI's clients retry, not a
404 they give up on; and /v1/models lists it. A deleted service's name is unknown again."""

from __future__ import annotations

import json
import uuid

from schemas.protocol import GATEWAY_CHAT_COMPLETIONS, GATEWAY_MODELS
from tests.api_server import RunningApi
from tests.deployment_flows import service_client
from tests.services import db_fetch, run_async

CHAT = {"model": "svc-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


def _insert_service(api: RunningApi, name: str, roles: list[str]) -> uuid.UUID:
    """A service row as the admin API writes one, without a replica yet."""
    service_id = uuid.uuid4()
    template = {
        "artifact": {
            "repository": "acme/smol",
            "revision": "main",
            "commit": "0" * 40,
            "path": "model.gguf",
            "size_bytes": 1,
        },
        "profile_id": str(uuid.uuid4()),
        "profile_version": 1,
        "environment_id": None,
        "max_concurrent": 4,
    }
    run_async(
        lambda: db_fetch(
            api.settings.database_url,
            """INSERT INTO services (id, name, roles, state, template, generation, replicas,
                placement, strategy, rollout_state, created_at, updated_at)
               VALUES ($1, $2, $3::jsonb, 'active', $4::jsonb, 1, 1, '{}'::jsonb,
                '{}'::jsonb, 'complete', now(), now())""",
            service_id,
            name,
            json.dumps(roles),
            json.dumps(template),
        )
    )
    return service_id


def test_a_live_service_without_a_ready_replica_is_a_503_then_a_deleted_one_a_404(
    api: RunningApi,
) -> None:
    with api.client() as client:
        secret = service_client(client, api, models=["svc-model"], roles=["svc-role"])
        auth = {"Authorization": f"Bearer {secret}"}
        unknown = client.post(GATEWAY_CHAT_COMPLETIONS, json=CHAT, headers=auth)
        assert unknown.status_code == 404, unknown.text
        assert unknown.json()["error"]["code"] == "model_not_found"

        service_id = _insert_service(api, "svc-model", ["svc-role"])
        waiting = client.post(GATEWAY_CHAT_COMPLETIONS, json=CHAT, headers=auth)
        assert waiting.status_code == 503, waiting.text
        assert waiting.json()["error"]["code"] == "no_ready_deployment"
        assert int(waiting.headers["Retry-After"]) > 0
        by_role = client.post(
            GATEWAY_CHAT_COMPLETIONS, json={**CHAT, "model": "svc-role"}, headers=auth
        )
        assert by_role.status_code == 503, by_role.text
        listed = client.get(GATEWAY_MODELS, headers=auth).json()["data"]
        assert {"id": "svc-model", "roles": ["svc-role"]} in [
            {"id": entry["id"], "roles": entry.get("roles")} for entry in listed
        ], listed

        run_async(
            lambda: db_fetch(
                api.settings.database_url,
                "UPDATE services SET state = 'deleted' WHERE id = $1",
                service_id,
            )
        )
        gone = client.post(GATEWAY_CHAT_COMPLETIONS, json=CHAT, headers=auth)
        assert gone.status_code == 404, gone.text
