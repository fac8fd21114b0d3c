"""One Chromium for the browser tests, a fresh context (cookies, storage, viewport) for each test.

Playwright's synchronous API keeps an event loop running in this thread from its start to its stop:
while it runs, the ORM needs DJANGO_ALLOW_ASYNC_UNSAFE, ``async_to_sync`` cannot be called, and
Django's connections are another set than before it started (asgiref keys them by the running loop).
So the browser is started before any test's database work (package scope: pytest sets it up before a
test's function fixtures; a test asks for ``browser`` or ``browser_page`` as a parameter, never later),
lives as long as this package's tests, and is stopped, with the connections opened while it ran,
before any other kind's tests.
"""
from __future__ import annotations

import os

import pytest

from tests.support.browser import CHROMIUM_ARGS

# Playwright's sync API runs an event loop in this thread; the ORM calls of the tests are still plain
# synchronous calls between page actions.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


@pytest.fixture(scope="package")
def chromium():
    """Debian's Chromium, headless, started once for tests/browser."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path="/usr/bin/chromium", args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            from django.db import connections

            connections.close_all()
            browser.close()


@pytest.fixture
def browser(chromium):
    """The shared Chromium, for a test that opens its own contexts; whatever it leaves open is closed after it."""
    before = set(chromium.contexts)
    yield chromium
    for context in chromium.contexts:
        if context not in before:
            context.close()


@pytest.fixture
def browser_page(browser):
    """A page in a fresh context (1400 x 1000) of the shared Chromium."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    yield context.new_page()
    context.close()
