"""What a deployment serves (issue 34), through the API: `endpoints` on create (the
default chat and completions, kept in one order, each once), its view and the load
lease; the capabilities its node reports at the load stored and shown; the gateway
routes chat only to deployments that serve chat (404 model_not_found in OpenAI's
envelope otherwise), and a service's endpoints reach its replicas and roll out."""

from __future__ import annotations

from typing import Any

from schemas.protocol import DEPLOYMENT_JOB_COMPLETE, DEPLOYMENTS, GATEWAY_CHAT_COMPLETIONS
from tests.admin_helpers import ok, refused
from tests.api_server import RunningApi
from tests.deployment_flows import (
    HEALTHY,
    beat,
    claim_deployment_job,
    create_deployment,
    deployment,
    deployment_body,
    lease_of,
    service_client,
)
from tests.runtime_flows import create_profile, environment_id, ready_node

CHAT = {"model": "smol", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
CAPS = {"supports_tools": True, "supports_tool_calls": True, "supports_parallel_tool_calls": False}


def test_endpoints_on_create_view_and_lease_and_the_reported_caps(api: RunningApi) -> None:
    with api.client() as client:
        node = ready_node(client, api)
        beat(client, node)
        profile = create_profile(client, api, name="p-endpoints")
        body = deployment_body(node, profile["id"], environment_id(client, api))
        for endpoints in ([], ["chat", "chat"], ["images"], ["chat"] * 4):
            refused(
                client.post(
                    DEPLOYMENTS, json={**body, "endpoints": endpoints}, headers=api.admin_headers
                ),
                422,
                "validation_failed",
            )
        created = create_deployment(client, api, {**body, "endpoints": ["embeddings", "chat"]})
        assert created["endpoints"] == ["chat", "embeddings"]
        assert created["capabilities"] is None
        claim = claim_deployment_job(client, node)
        assert claim["spec"]["endpoints"] == ["chat", "embeddings"]
        done = {"kind": "deployment.load.v1", "lease": lease_of(claim), "device_id": "cpu",
                "health": HEALTHY, "load_s": 0.3, "capabilities": CAPS}  # fmt: skip
        path = DEPLOYMENT_JOB_COMPLETE.format(job_id=claim["job_id"])
        ok(client.post(path, json=done, headers=node.headers))
        view = deployment(client, api, created["id"])
        assert view["state"] == "ready" and view["capabilities"] == CAPS
        assert view["endpoints"] == ["chat", "embeddings"]
        # A caps key the control plane does not know is refused: the node sends only
        # these three, whatever llama-server lists.
        unknown = {**done, "capabilities": {**CAPS, "supports_system_role": True}}
        refused(client.post(path, json=unknown, headers=node.headers), 422, "validation_failed")
        default = create_deployment(client, api, {**body, "model": "other"})
        assert default["endpoints"] == ["chat", "completions"]


def test_embeddings_on_a_profile_with_split_kv_buffers_are_refused_at_create(
    api: RunningApi,
) -> None:
    """The node would refuse to start it (schemas/llama_flags.py: endpoint_refusals); the
    API refuses the deployment first, and queues no load job."""
    with api.client() as client:
        node = ready_node(client, api)
        beat(client, node)
        split = {"pooling": "mean", "no-kv-unified": True}
        profile = create_profile(client, api, name="p-split", server_args=split)
        body = deployment_body(node, profile["id"], environment_id(client, api))
        embeddings = {**body, "endpoints": ["chat", "embeddings"]}
        answer = client.post(DEPLOYMENTS, json=embeddings, headers=api.admin_headers)
        flagged = refused(answer, 422, "server_flag_refused")
        assert flagged["extra"]["flags"] == ["no-kv-unified"]
        assert ok(client.get(DEPLOYMENTS, headers=api.admin_headers))["items"] == []
        # Chat alone keeps the operator's choice of KV buffers.
        assert create_deployment(client, api, body)["endpoints"] == ["chat", "completions"]


def _ready(client: Any, api: RunningApi, model: str, endpoints: list[str]) -> None:
    node = ready_node(client, api, hostname=f"host-{model}")
    beat(client, node)
    profile = create_profile(client, api, name=f"p-{model}")
    body = deployment_body(node, profile["id"], environment_id(client, api), model=model)
    create_deployment(client, api, {**body, "endpoints": endpoints, "roles": []})
    claim = claim_deployment_job(client, node)
    done = {"kind": "deployment.load.v1", "lease": lease_of(claim), "device_id": "cpu",
            "health": HEALTHY, "load_s": 0.3}  # fmt: skip
    ok(client.post(DEPLOYMENT_JOB_COMPLETE.format(job_id=claim["job_id"]), json=done,
                   headers=node.headers))  # fmt: skip


def test_chat_goes_only_to_deployments_that_serve_chat(api: RunningApi) -> None:
    with api.client() as client:
        _ready(client, api, "embedder", ["embeddings"])
        secret = service_client(client, api, models=["embedder"], roles=[])
        answer = client.post(
            GATEWAY_CHAT_COMPLETIONS,
            json={**CHAT, "model": "embedder"},
            headers={"Authorization": f"Bearer {secret}"},
        )
    assert answer.status_code == 404, answer.text
    error = answer.json()["error"]
    assert error["code"] == "model_not_found" and error["type"] == "invalid_request_error"
