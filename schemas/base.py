"""Base model: every wire model rejects unknown fields."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, Field


class WireModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _require_timezone(value: datetime) -> datetime:
    # A naive timestamp is ambiguous across hosts; ordering rules need an instant.
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError("timestamp must carry a timezone offset (RFC 3339)")
    return value


AwareDatetime = Annotated[datetime, AfterValidator(_require_timezone)]
Label = Annotated[
    str, Field(min_length=1, max_length=63, pattern=r"^[A-Za-z0-9]([A-Za-z0-9_.-]*)$")
]
LabelValue = Annotated[str, Field(max_length=63, pattern=r"^[A-Za-z0-9_.-]*$")]
Labels = Annotated[dict[Label, LabelValue], Field(max_length=64)]
