"""Usage and budgets end to end, all real (issue 33): the API with its workers' pipeline,
an agent that acquired the model, the runtime worker beside it with a real llama-server,
and the official `openai` client as a service client. What the admin usage route shows
is exactly what llama-server reported: the plain answer's `usage`, the usage event of a
stream that asked for it, and that of a stream that did not (the gateway asks the node
for it and takes it out of that client's stream), each request counted once. A client
with a token budget is refused 429 budget_exhausted once it is spent, as the openai
client reads it (RateLimitError with the code, Retry-After), and the refusal is metered.
"""

from __future__ import annotations

from typing import Any

import openai
import pytest

from api.gateway.usage import DAY_S
from schemas.protocol import GATEWAY_PREFIX
from schemas.usage import USAGE
from tests.agent.harness import admin, wait_until
from tests.api_server import ApiFactory, RunningApi
from tests.deployment_flows import created_service_client
from tests.runtime.probing import MESSAGES, ProbeNode, deployed

# The usage window flushed often: the rows are there within a second.
FLUSH_S = 0.2


@pytest.fixture
def probe_api(api_factory: ApiFactory) -> RunningApi:
    return api_factory(job_lease_s=10, job_retry_base_s=0.2, gateway_measure_interval_s=FLUSH_S)


def _client(api: RunningApi, **body: Any) -> tuple[openai.OpenAI, str]:
    """The official client as a new service client (`body`: its fields), and its id."""
    with api.client() as http:
        created = created_service_client(http, api, **body)
    base = api.base_url + GATEWAY_PREFIX
    client = openai.OpenAI(base_url=base, api_key=created["secret"], max_retries=0, timeout=60)
    return client, created["id"]


def _streamed(client: openai.OpenAI, **extra: Any) -> tuple[str, Any]:
    """A stream's text and the usage its client saw (None unless it asked)."""
    text, usage = "", None
    for chunk in client.chat.completions.create(
        model="smol", messages=MESSAGES, max_tokens=8, temperature=0, stream=True, **extra
    ):
        text += "".join(choice.delta.content or "" for choice in chunk.choices)
        usage = chunk.usage or usage
    return text, usage


def _usage(api: RunningApi, client_id: str, requests: int) -> dict[str, Any]:
    """The client's usage rows once they count `requests`: the totals and the rows."""

    def counted() -> dict[str, Any] | None:
        report = admin(api, "GET", USAGE, params={"client": client_id, "step": "day"})
        return report if report["totals"]["requests"] >= requests else None

    return wait_until(counted, 20, f"{requests} requests in the usage rollup")


def test_usage_rows_are_what_llama_server_reported_and_a_spent_budget_is_refused(
    probe_node: ProbeNode,
) -> None:
    runtime, environment = probe_node.runtime()
    deployed(probe_node, environment)
    client, client_id = _client(probe_node.api, name="metered")

    plain = client.chat.completions.create(
        model="smol", messages=MESSAGES, max_tokens=8, temperature=0
    )
    assert plain.usage is not None and plain.usage.completion_tokens > 0, runtime.output[-2000:]
    text, asked = _streamed(client, stream_options={"include_usage": True})
    assert text and asked is not None and asked.completion_tokens > 0
    # Not asked: no usage event reaches this client; the same greedy answer as the one
    # that asked, so llama-server's count is the same.
    text_unasked, unasked = _streamed(client)
    assert text_unasked == text and unasked is None

    report = _usage(probe_node.api, client_id, 3)
    totals = report["totals"]
    assert totals["requests"] == 3 and totals["errors"] == {}
    assert totals["prompt_tokens"] == plain.usage.prompt_tokens + 2 * asked.prompt_tokens
    assert totals["completion_tokens"] == (
        plain.usage.completion_tokens + 2 * asked.completion_tokens
    )
    assert totals["ttft_count"] == 2  # the streams' first tokens
    assert {row["model"] for row in report["rows"]} == {"smol"}
    assert sum(row["requests"] for row in report["rows"]) == 3

    # A budget of one token: the first call is admitted (nothing spent yet), the next
    # one is refused until the next UTC day.
    budgeted, budgeted_id = _client(probe_node.api, name="budgeted", max_tokens_per_day=1)
    first = budgeted.chat.completions.create(model="smol", messages=MESSAGES, max_tokens=2)
    assert first.usage is not None and first.usage.total_tokens >= 1
    with pytest.raises(openai.RateLimitError) as refused:
        budgeted.chat.completions.create(model="smol", messages=MESSAGES, max_tokens=2)
    assert refused.value.code == "budget_exhausted"
    assert 1 <= int(refused.value.response.headers["retry-after"]) <= DAY_S
    # The streamed call is refused alike, before its stream opens.
    with pytest.raises(openai.RateLimitError):
        _streamed(budgeted)

    spent = _usage(probe_node.api, budgeted_id, 3)["totals"]
    assert spent["requests"] == 3
    assert spent["errors"] == {"budget_exhausted": 2}
    assert spent["prompt_tokens"] == first.usage.prompt_tokens
    assert spent["completion_tokens"] == first.usage.completion_tokens
    # The first client's figures did not move.
    assert _usage(probe_node.api, client_id, 3)["totals"] == totals
