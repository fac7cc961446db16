"""Hypothesis fuzzing of the wire parsers (the fast tier: pure functions, no services).

Whatever arrives, a request model either refuses it with a ValidationError (which the API
answers as 422) or accepts a value PostgreSQL can store: text without control characters
and valid as UTF-8, integers within the JSON-safe range, timestamps that convert to UTC.
Bodies are validated as FastAPI does (Python mode over the parsed JSON), and in JSON mode.
"""

from __future__ import annotations

import json
import math
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError

from schemas.admin import AuditQuery, CreateEnrollmentToken, NodePatch
from schemas.agent import EnrollRequest, HeartbeatRequest, InventoryReport, TelemetryReport
from schemas.base import SAFE_INT_MAX
from tests.flows import gpu, heartbeat_body, inventory_body, telemetry_body

pytestmark = pytest.mark.fast

NODE = "6f1c0c56-3b53-4b5a-9b1c-2d1d5c9b0a11"
CONTROL = {chr(c) for c in [*range(0x20), *range(0x7F, 0xA0)]}

VALID: dict[type[BaseModel], dict[str, Any]] = {
    InventoryReport: inventory_body(NODE, 7, gpus=[gpu(0), gpu(1)]),
    TelemetryReport: telemetry_body(NODE, 7, gpu_uuids=["GPU-a", "GPU-b"]),
    HeartbeatRequest: heartbeat_body(NODE, observed_at="2026-01-01T00:00:00+02:00"),
    EnrollRequest: {
        "enrollment_token": "mfe.x.y",
        "protocol_version": 1,
        "agent_version": "1.0",
        "hostname": "gpu-1",
    },
    CreateEnrollmentToken: {"expires_in_s": 60, "labels": {"rack": "a1"}, "note": "n"},
    NodePatch: {"display_name": "x", "labels": {"a": "b"}, "enabled": True},
}

# Values chosen to hit the edges the database cares about, plus anything else.
HOSTILE_TEXT = st.one_of(
    st.text(),
    st.text(alphabet=st.sampled_from(["\x00", "\x1f", "\x7f", "\x85", "\ud800", "a", "é"])),
)
HOSTILE_TIMESTAMPS = st.sampled_from(
    [
        "0001-01-01T00:00:00+14:00",
        "9999-12-31T23:59:59-14:00",
        "0001-01-02T00:00:00+23:59",
        "9999-12-30T23:59:59-23:59",
        "2026-02-30T00:00:00Z",
        "2026-01-01T00:00:00",
        "1700000000",
        "0.5",
        "2026-01-01T25:00:00Z",
    ]
)
HOSTILE_NUMBERS = st.one_of(
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([2**53, 2**53 - 1, 2**63, 2**63 - 1, -(2**63) - 1, 2**64 + 1]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(),
)
SCALARS = st.one_of(st.none(), HOSTILE_TEXT, HOSTILE_TIMESTAMPS, HOSTILE_NUMBERS)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every location in a JSON document, containers included."""
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found += _paths(item, (*prefix, key))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += _paths(item, (*prefix, index))
    return found


def _replace(document: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    copy = json.loads(json.dumps(document))
    target = copy
    for step in path[:-1]:
        target = target[step]
    target[path[-1]] = value
    return copy


def assert_storable(value: Any) -> None:
    """What asyncpg would send to PostgreSQL without an error."""
    if isinstance(value, str):
        assert not CONTROL & set(value), repr(value)
        value.encode("utf-8")  # no lone surrogate
    elif isinstance(value, bool) or value is None:
        pass
    elif isinstance(value, int):
        assert -SAFE_INT_MAX <= value <= SAFE_INT_MAX, value
    elif isinstance(value, float):
        assert math.isfinite(value), value
    elif isinstance(value, datetime):
        assert value.utcoffset() is not None
        value.astimezone(UTC)  # no OverflowError
    elif isinstance(value, dict):
        for key, item in value.items():
            assert_storable(key)
            assert_storable(item)
    elif isinstance(value, list | tuple):
        for item in value:
            assert_storable(item)


def parse(model: type[BaseModel], document: Any) -> BaseModel | None:
    """Both ways FastAPI and the agent read bodies; they must agree."""
    try:
        python = model.model_validate(document)
    except ValidationError:
        python = None
    try:
        raw = json.dumps(document)
    except ValueError:  # NaN/inf with allow_nan semantics aside, nothing to compare
        return python
    try:
        from_json = model.model_validate_json(raw)
    except ValidationError:
        from_json = None
    assert (python is None) == (from_json is None), (document, python, from_json)
    return python


MODELS = sorted(VALID, key=lambda m: m.__name__)
FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("model", MODELS, ids=[m.__name__ for m in MODELS])
def test_the_valid_documents_parse(model: type[BaseModel]) -> None:
    parsed = parse(model, VALID[model])
    assert parsed is not None
    assert_storable(parsed.model_dump())


@pytest.mark.parametrize("model", MODELS, ids=[m.__name__ for m in MODELS])
@FUZZ
@given(data=st.data())
def test_one_hostile_value_anywhere_is_refused_or_storable(
    model: type[BaseModel], data: st.DataObject
) -> None:
    document = VALID[model]
    path = data.draw(st.sampled_from(_paths(document)), label="path")
    mutated = _replace(document, path, data.draw(JSON_VALUES, label="value"))
    parsed = parse(model, mutated)
    if parsed is not None:
        assert_storable(parsed.model_dump())


@pytest.mark.parametrize("model", MODELS, ids=[m.__name__ for m in MODELS])
@FUZZ
@given(document=JSON_VALUES)
def test_arbitrary_json_is_refused_or_storable(model: type[BaseModel], document: Any) -> None:
    parsed = parse(model, document)
    if parsed is not None:
        assert_storable(parsed.model_dump())


@FUZZ
@given(
    query=st.dictionaries(
        st.sampled_from(["actor", "action", "since", "until", "before_id", "limit"]),
        st.one_of(HOSTILE_TEXT, HOSTILE_TIMESTAMPS, HOSTILE_NUMBERS.map(str)),
        max_size=6,
    )
)
def test_audit_query_strings_are_refused_or_storable(query: dict[str, str]) -> None:
    """Query parameters always arrive as text."""
    try:
        parsed = AuditQuery.model_validate(query)
    except ValidationError:
        return
    assert_storable(parsed.model_dump())
