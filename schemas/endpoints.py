"""Which OpenAI endpoints a deployment or a service serves, and what its chat template can
do (issue 34).

A deployment declares its endpoints; the runtime worker loads the model accordingly
(`--embeddings` when embeddings are served) and checks each one at load; the gateway
routes an endpoint only to deployments that declared it. What the chat template can do
(tools) is not declared but reported by the node after the load, from llama-server's
`/props`, and stored on the deployment.
"""

from __future__ import annotations

from typing import Annotated, Final, Literal, get_args

from pydantic import AfterValidator, Field

from schemas.base import Flag, WireModel

Endpoint = Literal["chat", "completions", "embeddings"]
# Canonical order: a list is stored and shown in it, so two equal sets compare equal.
ENDPOINT_ORDER: Final[tuple[Endpoint, ...]] = get_args(Endpoint)
DEFAULT_ENDPOINTS: Final[tuple[Endpoint, ...]] = ("chat", "completions")


def _unique(endpoints: list[Endpoint]) -> list[Endpoint]:
    if len(set(endpoints)) != len(endpoints):
        raise ValueError("each endpoint at most once")
    return sorted(endpoints, key=ENDPOINT_ORDER.index)


# 1..3 endpoints, each once (kept in the canonical order).
Endpoints = Annotated[
    list[Endpoint],
    Field(min_length=1, max_length=3, json_schema_extra={"uniqueItems": True}),
    AfterValidator(_unique),
]


def default_endpoints() -> list[Endpoint]:
    return list(DEFAULT_ENDPOINTS)


class ChatTemplateCaps(WireModel):
    """What the loaded model's chat template can do, as llama-server's `/props` says
    (`chat_template_caps`); only these keys are read, whatever else it lists."""

    supports_tools: Flag = False
    supports_tool_calls: Flag = False
    supports_parallel_tool_calls: Flag = False

    @classmethod
    def from_props(cls, props: object) -> ChatTemplateCaps | None:
        """The caps from a `/props` answer; None when it has none we can read (an
        older server, or a value that is not a bool)."""
        caps = props.get("chat_template_caps") if isinstance(props, dict) else None
        if not isinstance(caps, dict):
            return None
        known = {name: caps[name] for name in cls.model_fields if name in caps}
        if not all(isinstance(value, bool) for value in known.values()):
            return None
        return cls.model_validate(known)
