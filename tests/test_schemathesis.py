"""schemathesis over every operation of the API, with operator and node credentials and
every check, against a real server on loopback (real PostgreSQL, real NATS).

The OpenAPI document is the contract: each operation is fuzzed with valid and invalid
data (its coverage phase walks every boundary of every parameter and body field, its
fuzzing phase adds `MAX_EXAMPLES` random cases), and every response must be declared,
well-formed and conformant: no 5xx, no undocumented status, no valid input refused, no
invalid input accepted, 405 with a true `Allow`. Bounded so it fits CI: derandomized,
so a run is repeatable, and `MAX_EXAMPLES` per operation.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.config import OperationConfig, OperationsConfig
from schemathesis.core.failures import AcceptedNegativeData
from schemathesis.openapi.checks import RejectedPositiveData

from api.app import create_app
from api.settings import ApiSettings
from schemas.protocol import (
    ADMIN_EVENTS,
    ADMIN_PREFIX,
    AGENT_PREFIX,
    ENROLL,
    GATEWAY_CHAT_COMPLETIONS,
    NOTIFICATIONS,
    RUNTIME_CHANNEL,
)
from tests.api_server import OPERATOR_KEY, RunningApi
from tests.flows import enroll

MAX_EXAMPLES = 150

# The document under test comes from the app itself; no server is needed to collect.
# test_served_document_is_the_one_under_test ties it to what the server really serves.
_DOCUMENT = create_app(
    ApiSettings(
        database_url="postgresql+asyncpg://unused/unused",
        nats_url="nats://unused:4222",
        operator_api_key=OPERATOR_KEY,
    )
).openapi()
schema = schemathesis.openapi.from_dict(_DOCUMENT)
schema.config.checks.update(included_check_names=["all"], max_response_time=10.0)
# A body past the API's 1 MiB bound is refused 413 before it is read (the gateway's
# embeddings: 257 inputs of 32,768 characters is invalid and also too large).
schema.config.checks.negative_data_rejection.expected_statuses = [
    *schema.config.checks.negative_data_rejection.expected_statuses,
    "413",
]
schema.config.generation.update(max_examples=MAX_EXAMPLES)
# The chat request carries two recursive JSON Schemas (a tool's `parameters`, a
# response_format's `schema`): the coverage phase, which walks every case the schema
# defines, generated over 48,000 of them for this one operation and was still going past
# the 300 s bound. Chat is fuzzed instead, with four times the examples. Its scalar
# fields are the shared ones of schemas/gateway_fields.py, whose every boundary the
# coverage phase still walks on /v1/completions; the JSON Schema's own bounds are walked
# in tests/test_json_schema_bounds.py.
schema.config.operations = OperationsConfig(
    operations=[
        OperationConfig.from_dict(
            {
                "include-path": GATEWAY_CHAT_COMPLETIONS,
                "phases": {"coverage": {"enabled": False}},
                "generation": {"max-examples": 4 * MAX_EXAMPLES},
            }
        )
    ]
)


# Rules the wire types state in their descriptions that JSON Schema cannot express:
# uniqueness within a list (GPU UUIDs and indexes, storage paths), a path segment's
# length in UTF-8 bytes (its length in characters is in the pattern), and a bound that is
# another field's value (a service's autoscale maximum, a usage range's start).
_INEXPRESSIBLE = (
    "may appear once",
    "bytes (UTF-8)",
    "must be at least min_replicas",
    "since must be before until",
)


@schema.hook
def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
    """Keep every failure but four kinds: a negative case whose only invalid header is
    the credential every call sends anyway (_credential_restored); a body valid by the
    schema, refused only for a rule JSON Schema cannot express (_INEXPRESSIBLE; any other
    detail in the same answer keeps the failure); a query value generated as a non-string
    whose text is valid (_query_coerced); and a "valid" case whose body schemathesis
    itself generated as invalid (_negative_part)."""
    if isinstance(failure, AcceptedNegativeData) and (
        _query_coerced(case) or _credential_restored(case)
    ):
        return False
    if not isinstance(failure, RejectedPositiveData) or response.status_code != 422:
        return True
    if _negative_part(case):
        return False
    details = response.json().get("details") or [{}]
    return not all(
        any(rule in detail.get("message", "") for rule in _INEXPRESSIBLE) for detail in details
    )


def _negative_part(case: Any) -> bool:
    """schemathesis's coverage phase varies one parameter at a time; where it found no
    valid body to pair a valid header variant with, it pairs an invalid one (the body
    `0`) and still calls the whole case valid. Its own metadata says which part it
    generated as invalid: such a case is no valid request."""
    components = getattr(case.meta, "components", None) or {}
    return any(info.mode.name == "NEGATIVE" for info in components.values())


_CREDENTIAL_HEADERS = {"x-modelforge-admin-token", "authorization"}


def _credential_restored(case: Any) -> bool:
    """A negative case whose header part is invalid only by lacking the credential: the
    security schemes put the credential headers in the document, and schemathesis drops
    one to make a case invalid, but every call here sends the credential
    (call_kwargs), so what reaches the server is not the invalid request it meant.
    What else such a case varies (an unknown query parameter, which the API ignores as
    it always has) is then all that is left of it."""
    components = getattr(case.meta, "components", None) or {}
    header_negative = any(
        getattr(kind, "value", kind) == "header" and info.mode.name == "NEGATIVE"
        for kind, info in components.items()
    )
    sent = {name.lower() for name in (case.headers or {})}
    return header_negative and not (_CREDENTIAL_HEADERS & sent)


def _query_coerced(case: Any) -> bool:
    """A query value generated as a JSON non-string (false, 0, null) reaches the server
    as its text ("false"), which may well be a valid value of a string parameter: the
    server cannot tell, and accepting it is right. Only such cases are dropped; a
    non-string whose text is invalid is still refused (422) and never gets here."""
    for value in (case.query or {}).values():
        items = value if isinstance(value, list) else [value]
        # The coverage phase may hand the value over already as its text.
        if any(not isinstance(item, str) or item in ("true", "false", "null") for item in items):
            return True
    return False


FUZZ = settings(
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@pytest.fixture(scope="module")
def credentials(shared_api: RunningApi) -> dict[str, str]:
    """Module scope: hypothesis refuses function-scoped fixtures in a fuzzed test."""
    with shared_api.client() as client:
        node = enroll(client, shared_api, hostname="schemathesis-node")
    return {"base_url": shared_api.base_url, "node": node.credential}


def call_kwargs(path: str, credentials: dict[str, str]) -> dict[str, Any]:
    """Operator key on admin routes, the node credential on agent routes."""
    headers: dict[str, str] = {}
    if path.startswith(ADMIN_PREFIX):
        headers = {"X-ModelForge-Admin-Token": OPERATOR_KEY}
    elif path.startswith(AGENT_PREFIX) and path != ENROLL:
        headers = {"Authorization": f"Bearer {credentials['node']}"}
    return {"base_url": credentials["base_url"], "headers": headers, "timeout": 30}


def test_served_document_is_the_one_under_test(credentials: dict[str, str]) -> None:
    served = httpx.get(f"{credentials['base_url']}/openapi.json", timeout=30).json()
    assert served == _DOCUMENT


# Every operation but the held streams (notifications, the runtime channel, the admin
# events): a fuzzer waits on its answer, which never ends by design.
# tests/test_job_notifications.py, tests/test_gateway_relay.py and
# tests/test_admin_events.py hold their contracts instead.
@pytest.mark.slow
@schema.exclude(path=[NOTIFICATIONS, RUNTIME_CHANNEL, ADMIN_EVENTS]).parametrize()
@FUZZ
def test_every_operation_honours_its_contract(case: Any, credentials: dict[str, str]) -> None:
    case.call_and_validate(**call_kwargs(case.path, credentials))
