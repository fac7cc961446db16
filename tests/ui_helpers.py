"""The dashboard's browser for the UI tests (tests/test_ui_*.py), a pytest plugin listed in
tests/conftest.py: headless Debian chromium driven by Playwright (`browser_page`), and a
page signed in with its event stream open (`signed_in`).

Without chromium or Playwright a test that asks for the browser skips on a developer's
machine and fails under CI=true, where .ci/run installs both.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from schemas.ui import UI_LOGIN, UI_PREFIX
from tests.api_server import OPERATOR_KEY, RunningApi

CHROMIUM = "/usr/bin/chromium"
# An event reaches the page within the relay's poll (0.5 s in tests) plus a coalesced
# GET; the bound leaves room for a loaded machine. Never a fixed sleep.
ARRIVAL_MS = 20_000


def _missing(what: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is required under CI (.ci/run installs it)")
    pytest.skip(f"{what} is not installed")


@pytest.fixture
def browser_page() -> Iterator[Any]:
    if not os.access(CHROMIUM, os.X_OK):
        _missing("Debian's chromium (/usr/bin/chromium)")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("Playwright (the dev extra)")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True)
        context = browser.new_context(viewport={"width": 1280, "height": 760})
        try:
            yield context.new_page()
        finally:
            context.close()
            browser.close()


def signed_in(page: Any, api: RunningApi) -> None:
    """The page at /ui, signed in, its event stream open."""
    from playwright.sync_api import expect

    page.goto(f"{api.base_url}{UI_LOGIN}")
    page.fill("#operator_key", OPERATOR_KEY)
    page.click("#login")
    page.wait_for_url(f"{api.base_url}{UI_PREFIX}")
    expect(page.locator("#live")).to_have_text("live", timeout=ARRIVAL_MS)
