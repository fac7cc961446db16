"""Where in the client's body a validation error is, as OpenAI names it (`param`).

pydantic's location of an error inside a union carries the union's own parts: a tagged
union's tag (`response_format.json_schema.json_schema.schema`: the first `json_schema` is
the tag) and a plain union's branch (`….default.bool`). A client wrote neither. The
location is walked against the body the client sent: a part that names a key or an
index there is kept, any other part is the union's and is dropped, except the last part
of a `missing` error (the field the client left out).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def input_location(location: Sequence[int | str], body: Any, error_type: str) -> list[int | str]:
    """`location` (after FastAPI's source part) with the union's parts taken out."""
    kept: list[int | str] = []
    node = body
    last = len(location) - 1
    for i, part in enumerate(location):
        if _holds(node, part):
            node = node[part]
        elif i == last and error_type == "missing":
            node = None
        else:
            continue
        kept.append(part)
    return kept


def _holds(node: Any, part: int | str) -> bool:
    if isinstance(node, dict):
        return isinstance(part, str) and part in node
    return isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node)
