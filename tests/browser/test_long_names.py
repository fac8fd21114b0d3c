"""A long name never widens a page: an agent's output file named with 250 characters (a file name may
have 255 bytes) wraps on the task page at 1,400 and 390 px; the page never scrolls sideways (a fresh
user's walk of make demo found the task page 1,516 px wide at a 1,400 px window).
Screenshots: var/test-output/uxb/long-name-*.png.
"""
from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pytest
from django.utils import timezone

from dashboards.models import Team
from execution.spool.layout import SpoolLayout
from tests.support.browser import shot, signed_in
from tests.support.history import make_campaign, make_task

pytestmark = [pytest.mark.browser, pytest.mark.integration]

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

VIEWPORTS = ({"width": 1400, "height": 900}, {"width": 390, "height": 844})
# No space, dash or dot before the end to break at: what an agent writes when it names a file after its input.
LONG_NAME = "result_" + "abcdefghij" * 24 + ".txt"

# Each element whose right edge passes the window, outermost first (the assertion's message: which one widens).
WIDER_THAN_WINDOW = """() => Array.from(document.querySelectorAll('body *'))
  .filter(e => e.getBoundingClientRect().right > window.innerWidth + 0.5)
  .slice(0, 8).map(e => e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') + (e.className ? '.' + e.className : '')
                    + ' ' + Math.round(e.getBoundingClientRect().right))"""


def test_a_long_output_file_name_wraps_on_the_task_page(ops_stack, browser, ops_logins):
    assert len(LONG_NAME) == 251
    research = Team.objects.get(project="research")
    campaign = make_campaign(team=research, user=ops_logins["launcher"], name="long-name", count=1)
    task = make_task(campaign, task_number=1, started_at=timezone.now() - dt.timedelta(minutes=2), wallclock_s=30)
    work = Path(SpoolLayout(ops_stack.spool).work_dir(campaign.pk, 1))
    work.mkdir(parents=True, exist_ok=True)
    (work / LONG_NAME).write_text("42\n")
    for viewport in VIEWPORTS:
        with signed_in(browser, ops_stack, "launcher", viewport=viewport) as page:
            page.goto(f"{ops_stack.url}/tasks/{task.pk}/")
            link = page.locator("#outputs a").first
            link.wait_for(state="visible", timeout=15_000)
            assert link.text_content() == LONG_NAME
            shot(page, f"long-name-{viewport['width']}")
            width, window = page.evaluate("[document.documentElement.scrollWidth, window.innerWidth]")
            assert window == viewport["width"]
            assert width <= window, f"the task page is {width} px wide at {window} px: {page.evaluate(WIDER_THAN_WINDOW)}"
            box = link.bounding_box()
            assert box is not None and box["x"] + box["width"] <= window
