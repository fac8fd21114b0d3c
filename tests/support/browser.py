"""Driving Debian's Chromium in the browser tests: its flags, signing in, reading cells, screenshots."""
from __future__ import annotations

import time
from contextlib import contextmanager

from tests.support.history import PASSWORD
from tests.support.stack import TEST_OUTPUT

CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
SHOTS = TEST_OUTPUT / "uxb"


def cell(page, campaign_id: int, state: str) -> int:
    text = page.text_content(f'tr[data-campaign="{campaign_id}"] td[data-state="{state}"]')
    return int(text) if text and text.strip().isdigit() else 0


def wait_for(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


#: Where :func:`login` sends the browser once signed in: a light page every account may open. After a
#: sign-in tco shows the queue page, whose Plotly (4.8 MB) a fresh browser context downloads and parses
#: again (2-5 s a sign-in, about 40 in tests/browser) before the test goes on to its own pages.
SIGNED_IN_PAGE = "/account/token/"


def login(page, stack, username: str, password: str = PASSWORD) -> None:
    """Sign ``username`` in through the login form; the page is left on :data:`SIGNED_IN_PAGE`.
    Fails (15 s timeout) if the form sends the browser back to the login page (a refused sign-in)."""
    page.goto(stack.url + "/login/?next=" + SIGNED_IN_PAGE)
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    page.click("#login-submit")
    page.wait_for_url(lambda url: "/login/" not in url, timeout=15000)


@contextmanager
def signed_in(browser, stack, username: str, password: str = PASSWORD, **context_options):
    context = browser.new_context(**{"viewport": {"width": 1400, "height": 1000}, **context_options})
    page = context.new_page()
    login(page, stack, username, password)
    try:
        yield page
    finally:
        context.close()


def shot(page, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(SHOTS / f"{name}.png"), full_page=True)


def text(page, selector: str) -> str:
    return (page.text_content(selector) or "").strip()


def drawn_box(page, selector: str) -> dict:
    """The first match's box (x, y, width, height in CSS px), asserted drawn.

    A live page replaces parts of itself (landing.js swaps ``#tiles`` on each queue push): an element
    found and then replaced before it is measured has no box. So the element is awaited visible and
    measured again, three times at most; one never drawn still fails (the wait times out)."""
    element = page.locator(selector).first
    box = None
    for _ in range(3):
        element.wait_for(state="visible", timeout=10_000)
        box = element.bounding_box()
        if box is not None:
            break
    assert box is not None, f"{selector} is not drawn"
    return box


def inside(page, selector: str, width: int) -> dict:
    """The element's box, asserted to lie within the viewport's width (no sideways scroll to see it)."""
    box = drawn_box(page, selector)
    assert box["x"] >= 0 and box["x"] + box["width"] <= width, f"{selector} at x={box['x']:.0f}..{box['x'] + box['width']:.0f}, viewport {width}"
    return box
