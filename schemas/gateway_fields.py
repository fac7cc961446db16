"""The scalar fields every gateway request and invoke share (chat, completions,
embeddings): the token bound, sampling, stop strings, the model's name. One definition,
imported by schemas/gateway.py and schemas/gateway_endpoints.py alike."""

from __future__ import annotations

from typing import Annotated, Final

from pydantic import BeforeValidator, Field, Strict

from schemas.base import Flag, Number, WireModel, json_integer

MAX_TOKENS_CEILING: Final = 8192
StopText = Annotated[str, Strict(), Field(min_length=1, max_length=64)]
Stop = StopText | Annotated[list[StopText], Field(max_length=4)]
StopList = Annotated[list[StopText], Field(max_length=4)]
TokenBound = Annotated[
    int, Strict(), Field(ge=1, le=MAX_TOKENS_CEILING), BeforeValidator(json_integer)
]
Seed = Annotated[int, Strict(), Field(ge=0, le=2**31 - 1), BeforeValidator(json_integer)]
# OpenAI's `n`: one choice is all ModelForge answers. An integer, not Literal[1]: a
# literal compares by equality, and `True == 1`.
Choices = Annotated[int, Strict(), Field(ge=1, le=1), BeforeValidator(json_integer)]
ModelField = Annotated[str, Strict(), Field(min_length=1, max_length=128)]
Temperature = Annotated[Number, Field(ge=0, le=2)]
TopP = Annotated[Number, Field(ge=0, le=1)]
Penalty = Annotated[Number, Field(ge=-2, le=2)]
# OpenAI's end-user id: accepted, never passed on.
EndUser = Annotated[str, Strict(), Field(max_length=256)]


class StreamOptions(WireModel):
    include_usage: Flag = False
