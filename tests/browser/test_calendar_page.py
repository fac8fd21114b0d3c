"""A queue calendar on the queue page, in Debian's Chromium, against the real dev cluster.

The test queue cal.q is closed by its calendar for 40 s
(tests/support/calendar_window.py: scripts/cluster-faults ->
dev-cluster --calendar-window; agent.q is never touched). The page says the
queue's calendar, that it is closed and until when, and, without a reload,
that it is open once the window has passed. Screenshot in the test output.
"""
from __future__ import annotations

import os

import pytest

from tests.support.stack import TEST_OUTPUT
from tests.support.calendar_window import CALENDAR, closed_window, QUEUE
from tests.support.browser import login
from tests.support.browser import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.integration]
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


def calendar_line(page) -> str | None:
    line = page.locator(f'#clusters p.calendar[data-queue="{QUEUE}"]')
    return line.inner_text() if line.count() else None


def test_the_queue_page_shows_the_calendar_closed_then_open(live_stack, browser_page):
    page = browser_page
    login(page, live_stack, "admin", "test-admin-pw-1")
    page.goto(live_stack.url + "/")
    page.wait_for_selector("#live.on", timeout=15000)
    page.evaluate("window.__tcoNoReload = 'still here'")
    with closed_window(40) as opens:  # the page shows it within a status poll or two (TCO_STATUS_INTERVAL_S 5 s)
        closed = f"{QUEUE}: calendar {CALENDAR}, closed until {opens:%H:%M:%S} UTC"
        wait_for(lambda: calendar_line(page) == closed, 45, f"'{closed}' on the page")
        page.screenshot(path=str(TEST_OUTPUT / "queue-calendar-closed.png"), full_page=True)
        opened = f"{QUEUE}: calendar {CALENDAR}, open, no change ahead"
        wait_for(lambda: calendar_line(page) == opened, 120, f"'{opened}' on the page")
        assert page.evaluate("window.__tcoNoReload") == "still here"
