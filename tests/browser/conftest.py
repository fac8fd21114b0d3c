"""One Chromium for the browser tests, a fresh context (cookies, storage, viewport) for each test.

Playwright's synchronous API keeps an event loop running in this thread from its start to its stop:
while it runs, the ORM needs DJANGO_ALLOW_ASYNC_UNSAFE, ``async_to_sync`` cannot be called, and
Django's connections are another set than before it started (asgiref keys them by the running loop).
So the browser is started before any test's database work (package scope: pytest sets it up before a
test's function fixtures; a test asks for ``browser`` or ``browser_page`` as a parameter, never later),
lives as long as this package's tests, and is stopped, with the connections opened while it ran,
before any other kind's tests.

One live stack serves the whole package (``browser_stack_server``: both ``live_stack`` and
``ops_stack``, mail written to files), started for the first test that asks for it and stopped after
the package's last test: each test still gets a fresh database and an empty live store
(tests/conftest.py), as the tests of one module always did on their module's stack. Starting one
per module cost 6-15 s each (a broker purge, uvicorn's workers, the producer, a Celery worker and
beat, each importing Django) and as much CPU, 15 times. No module may start a second stack beside
it (two producers would publish into the one live store): test_live_resync.py kills a web process of
this one, which uvicorn replaces, as it would at a site.
"""
from __future__ import annotations

import os

import pytest

from tests.support.browser import CHROMIUM_ARGS
from tests.support.stack_serving import MAIL_SETTINGS, serving_stack

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


@pytest.fixture(scope="package")
def browser_stack_server(django_db_setup, tmp_path_factory):
    """The browser tests' live stack (tests/support/stack_serving.py), mail to files under
    ``var/test-output/mail``; its logs in ``var/test-output/browser-stack-logs``."""
    with serving_stack("browser-stack", tmp_path_factory, MAIL_SETTINGS, "browser") as stack:
        yield stack


@pytest.fixture(scope="package")
def live_stack_server(browser_stack_server):
    return browser_stack_server


@pytest.fixture(scope="package")
def ops_stack_server(browser_stack_server):
    return browser_stack_server
