"""The value types of llama-server's allowed flags (schemas/llama_flags.py): each checks
a value from the wire and describes itself as JSON Schema, so the API's 422, the runtime
worker's own check and a client's validator agree."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

MILLION: Final = 1_000_000
_TOKENS: Final = 10_000_000


@dataclass(frozen=True)
class Whole:
    """An integer within [lo, hi]."""

    lo: int
    hi: int

    def check(self, value: object) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return "an integer"
        if not self.lo <= value <= self.hi:
            return f"an integer from {self.lo} to {self.hi}"
        return None

    def json_schema(self) -> dict[str, Any]:
        return {"type": "integer", "minimum": self.lo, "maximum": self.hi}


@dataclass(frozen=True)
class Real:
    """A finite number within [lo, hi]."""

    lo: float
    hi: float

    def check(self, value: object) -> str | None:
        if isinstance(value, bool) or not isinstance(value, int | float):
            return "a number"
        if not math.isfinite(value) or not self.lo <= value <= self.hi:
            return f"a number from {self.lo:g} to {self.hi:g}"
        return None

    def json_schema(self) -> dict[str, Any]:
        return {"type": "number", "minimum": self.lo, "maximum": self.hi}


@dataclass(frozen=True)
class Choice:
    """One of a fixed set of words."""

    values: tuple[str, ...]

    def check(self, value: object) -> str | None:
        if not isinstance(value, str) or value not in self.values:
            return "one of " + ", ".join(self.values)
        return None

    def json_schema(self) -> dict[str, Any]:
        return {"type": "string", "enum": list(self.values)}


@dataclass(frozen=True)
class Switch:
    """A flag without a value: true passes it, false leaves it out."""

    def check(self, value: object) -> str | None:
        return None if isinstance(value, bool) else "true or false"

    def json_schema(self) -> dict[str, Any]:
        return {"type": "boolean"}


ArgType = Whole | Real | Choice | Switch

SWITCH: Final = Switch()
ON_OFF: Final = Choice(("on", "off"))
ON_OFF_AUTO: Final = Choice(("on", "off", "auto"))
CACHE_TYPES: Final = Choice(
    ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
)
PROBABILITY: Final = Real(0.0, 1.0)
PENALTY: Final = Real(-100.0, 100.0)
TOKEN_COUNT: Final = Whole(0, _TOKENS)
# -1: "the context size", "all", or "the default", as llama.cpp reads it.
TOKEN_COUNT_OR_ALL: Final = Whole(-1, _TOKENS)
THREADS: Final = Whole(-1, 4096)
NGRAM: Final = Whole(1, 1024)
