"""The runbooks (ops/runbooks/) call only routes the API has, with the method it takes,
and their index lists every page. The routes come from the app's own OpenAPI document,
so a renamed or removed route fails here instead of in an operator's incident."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import pytest

from api.app import create_app
from api.settings import ApiSettings

pytestmark = pytest.mark.fast

RUNBOOKS = Path(__file__).resolve().parent.parent / "ops" / "runbooks"
PAGES = sorted(p for p in RUNBOOKS.glob("*.md") if p.name != "README.md")
# `c -X POST $API/api/v1/...`, `c "$API/api/v1/...?q=..."`: the method, then the path
# up to its query string.
CALL = re.compile(r"(?:-X (?P<method>[A-Z]+) +)?\"?\$API(?P<path>/api/v1/[^\s\"'?)`]*)")


@functools.cache
def operations() -> set[tuple[str, tuple[str, ...]]]:
    settings = ApiSettings(database_url="postgresql+asyncpg://unused/unused", nats_url="nats://x")
    paths = create_app(settings).openapi()["paths"]
    return {
        (method.upper(), tuple(path.strip("/").split("/")))
        for path, item in paths.items()
        for method in item
    }


def calls(page: Path) -> list[tuple[str, str]]:
    return [(match["method"] or "GET", match["path"]) for match in CALL.finditer(page.read_text())]


def known(method: str, path: str, ops: set[tuple[str, tuple[str, ...]]]) -> bool:
    segments = path.strip("/").split("/")
    for op_method, template in ops:
        if op_method != method or len(template) != len(segments):
            continue
        # A shell variable stands for a path parameter; every other segment is literal.
        if all(
            t == s or (t.startswith("{") and s.startswith("$"))
            for t, s in zip(template, segments, strict=True)
        ):
            return True
    return False


def test_the_calls_are_found() -> None:
    # The pattern must see the pages' calls, or the test below checks nothing.
    found = [call for page in PAGES for call in calls(page)]
    assert len(found) > 30
    assert ("POST", "/api/v1/admin/fleet/incidents/$INCIDENT/acknowledge") in found
    assert not known("POST", "/api/v1/admin/fleet/incidents/$INCIDENT/acknowledged", operations())


def test_the_index_lists_every_page() -> None:
    index = (RUNBOOKS / "README.md").read_text()
    for page in PAGES:
        assert f"]({page.name})" in index, page.name


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_call_is_a_route_the_api_has(page: Path) -> None:
    ops = operations()
    unknown = [f"{m} {path}" for m, path in calls(page) if not known(m, path, ops)]
    assert not unknown, f"{page.name}: {unknown}"
