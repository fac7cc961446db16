"""A job family is declared once (schemas/job_families.py): every kind the API serves is
declared in exactly one family, each declaration's types name its own kind, and the
capability a kind is handed for is the one the agent advertises. Fast: the app's routes
(its OpenAPI document) and the declarations only, nothing is served."""

from __future__ import annotations

from collections import Counter
from typing import get_args

import pytest

from agent import CAPABILITIES
from api.app import create_app
from api.settings import ApiSettings
from schemas.artifacts import ARTIFACT_FAMILY
from schemas.base import WireModel
from schemas.job_families import FAMILIES, capabilities, job_type
from schemas.jobs import JobKind
from schemas.protocol import AGENT_PREFIX
from store.jobs import RULES
from store.results import RESULTS

pytestmark = pytest.mark.fast

# Delivered on the runtime worker's channel with its lease, never claimed from a route.
NEVER_CLAIMED = {JobKind.DEPLOYMENT_INVOKE}


def _agent_routes() -> set[tuple[str, str]]:
    settings = ApiSettings(
        database_url="postgresql+asyncpg://unused/unused",
        nats_url="nats://unused:4222",
        operator_api_key="k" * 40,
    )
    paths = create_app(settings).openapi()["paths"]
    return {
        (method.upper(), path)
        for path, operations in paths.items()
        if path.startswith(AGENT_PREFIX)
        for method in operations
    }


def _kinds_of(model: type[WireModel]) -> set[str]:
    """The kinds a model's `kind` field admits (a Literal of one or more)."""
    return {str(value) for value in get_args(model.model_fields["kind"].annotation)}


def test_every_claimed_kind_is_declared_in_exactly_one_family() -> None:
    declared = Counter(kind for family in FAMILIES for kind in family.kinds)
    assert all(count == 1 for count in declared.values()), declared
    assert set(declared) == set(JobKind) - NEVER_CLAIMED
    assert len({family.name for family in FAMILIES}) == len(FAMILIES)
    for kind in declared:
        assert job_type(kind).kind == kind


def test_each_declaration_types_its_own_kind() -> None:
    for family in FAMILIES:
        for declared in family.types:
            assert declared.kind.value in _kinds_of(declared.claim), declared
            assert _kinds_of(declared.view) == {declared.kind.value}, declared
            if "kind" in declared.completion.model_fields:
                assert declared.kind.value in _kinds_of(declared.completion), declared


def test_the_api_serves_exactly_the_declared_families_job_routes() -> None:
    routes = _agent_routes()
    claims = {path for method, path in routes if method == "GET" and path.endswith("/next")}
    assert claims == {family.next for family in FAMILIES}
    for family in FAMILIES:
        for path in (family.progress_path, family.complete_path, family.fail_path):
            assert ("POST", path) in routes, path


def test_a_kinds_capability_is_the_one_the_agent_advertises() -> None:
    declared = capabilities()
    assert len(set(declared)) == len(declared)
    # Every job capability the agent advertises is a declared kind's, and back.
    advertised_jobs = {c for c in CAPABILITIES if c in {k.value for k in JobKind}}
    assert set(declared) == advertised_jobs
    for family in FAMILIES:
        for declared_type in family.types:
            if declared_type.capability is not None:
                assert declared_type.capability == declared_type.kind.value


def test_every_family_has_its_store_rules_and_every_kind_its_result() -> None:
    assert set(RULES) == {family.name for family in FAMILIES}
    for family in FAMILIES:
        assert RULES[family.name].family is family
    assert dict(RESULTS) == {t.kind: t.result for f in FAMILIES for t in f.types}


def test_a_result_is_what_the_completion_reports() -> None:
    """store/results.py: of_completion takes the result's fields from the completion; an
    acquisition's result is its spec's instead (store/artifacts.py: complete)."""
    for family in FAMILIES:
        if family is ARTIFACT_FAMILY:
            continue
        for declared in family.types:
            assert set(declared.result.model_fields) <= set(declared.completion.model_fields)
