"""Trial 4 (session 4) in Debian's Chromium: the bill's USD column on screen at 1280 and 390 px, the
queue page's campaigns table inside 1280 px with one "campaign finished" notice, a readable "Updated"
time and a served favicon, the agent page's timeline labels not clipped, and the control page's facts
following the live reading. Screenshots: var/test-output/uxb/trial4-*.png.
"""
from __future__ import annotations

import datetime as dt
import os
import re

import pytest
from django.utils import timezone

from dashboards.models import Campaign, Task, Team
from tests.helpers import wait_until
from tests.support.history import make_campaign, make_task

from tests.support.browser import shot, signed_in
from tests.support.browser import inside, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.integration]

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

DESKTOP = {"width": 1280, "height": 900}
PHONE = {"width": 390, "height": 844}


def test_the_bills_usd_column_is_on_screen_at_1280_and_390_px(ops_stack, browser, ops_logins):
    research = Team.objects.get(project="research")
    monday = timezone.now().date() - dt.timedelta(days=timezone.now().date().weekday())
    started = dt.datetime.combine(monday, dt.time(9), tzinfo=dt.timezone.utc)
    for name in ("nightly-regression-sweep-long-name", "sweep-b"):
        campaign = make_campaign(team=research, user=ops_logins["launcher"], name=name, model="claude-x")
        for n in range(1, 3):
            make_task(campaign, task_number=n, started_at=started, wallclock_s=30, cost_usd="0.25",
                      tokens={"input_tokens": 123456, "output_tokens": 7890})
    for viewport in (DESKTOP, PHONE):
        with signed_in(browser, ops_stack, "lead", viewport=viewport) as page:
            for group in ("team", "campaign"):
                page.goto(ops_stack.url + f"/ops/bills/?period=day&first={monday}&last={monday + dt.timedelta(days=6)}"
                          f"&group_by={group}")
                page.wait_for_selector("#bill tbody tr")
                inside(page, '#bill thead th:has-text("USD")', viewport["width"])
                inside(page, '#bill tbody td[data-col="cost_usd"]', viewport["width"])
                inside(page, '#bill-total td[data-col="cost_usd"]', viewport["width"])
                shot(page, f"trial4-bills-{group}-{viewport['width']}")
    # A week with no data: one line, no empty chart box.
    with signed_in(browser, ops_stack, "lead", viewport=DESKTOP) as page:
        page.goto(ops_stack.url + "/ops/bills/?period=day&first=2025-01-06&last=2025-01-12&group_by=campaign")
        assert page.is_visible("#bill-chart-empty") and page.locator("#bill-chart").count() == 0


def test_the_queue_page_fits_1280_px_with_one_notice_a_readable_time_and_a_favicon(ops_stack, browser, ops_logins):
    research = Team.objects.get(project="research")
    now = timezone.now()
    finished = []
    for i in range(4):
        campaign = make_campaign(team=research, user=ops_logins["launcher"], name=f"trial4-finished-{i}", count=2)
        for n in (1, 2):
            make_task(campaign, task_number=n, started_at=now - dt.timedelta(minutes=10), wallclock_s=20)
        Campaign.objects.filter(pk=campaign.pk).update(finished_at=now - dt.timedelta(minutes=5 - i))
        finished.append(campaign)
    with signed_in(browser, ops_stack, "launcher", viewport=DESKTOP) as page:
        errors = []
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
        page.goto(ops_stack.url + "/")
        page.wait_for_selector(f'#campaigns tr[data-campaign="{finished[0].pk}"]')
        inside(page, "#campaigns", DESKTOP["width"])
        overflow = page.eval_on_selector("#campaigns", "t => t.closest('.card').scrollWidth - t.closest('.card').clientWidth")
        assert overflow <= 0, f"the campaigns card scrolls sideways by {overflow} px"
        # One notice: the latest finished campaign, the others counted.
        assert page.locator("#campaign-notices li").count() == 1
        assert f"trial4-finished-3 (#{finished[3].pk})" in page.text_content("#campaign-notices")
        assert "and 3 more" in page.text_content("#campaign-notices")
        # "Updated": a local time for people, the exact ISO time in the title.
        updated = page.locator("#generated-at")
        exact = updated.get_attribute("title")
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z", exact or ""), exact
        shown = (updated.text_content() or "").strip()
        assert shown and "T" not in shown.split()[0] and not re.search(r"\.\d{3}", shown), shown
        assert page.request.get(ops_stack.url + "/favicon.ico").status == 200
        page.reload()
        page.wait_for_selector("#campaigns tbody tr")
        assert not [e for e in errors if "favicon" in e or "404" in e], errors
        shot(page, "trial4-queue-1280")
        page.click("#campaign-notices button.dismiss")
        assert page.locator("#campaign-notices li").count() == 0


def test_the_agent_pages_timeline_labels_are_not_clipped_and_its_submit_stage_not_negative(ops_stack, browser,
                                                                                            ops_logins):
    research = Team.objects.get(project="research")
    campaign = make_campaign(team=research, user=ops_logins["launcher"], name="trial4-agent", status="running", count=1)
    now = timezone.now()
    # DRMAA returned 0.286 s after the launch; the scheduler's whole-second submission time reads before it.
    Campaign.objects.filter(pk=campaign.pk).update(launched_at=now - dt.timedelta(seconds=30.5),
                                                   submitted_at=now - dt.timedelta(seconds=30.214))
    task = make_task(campaign, started_at=now - dt.timedelta(seconds=20), state="running", account=False)
    Task.objects.filter(pk=task.pk).update(submitted_at=(now - dt.timedelta(seconds=31)).replace(microsecond=0),
                                           ended_at=None, wallclock_s=None, state_code="r")
    for viewport in (DESKTOP, PHONE):
        with signed_in(browser, ops_stack, "launcher", viewport=viewport) as page:
            page.goto(ops_stack.url + f"/tasks/{task.pk}/")
            page.wait_for_selector("#timeline-chart .ytick text")
            assert page.text_content("#timeline-chart .xtitle") == "time (UTC)"  # the ticks' zone
            labels = page.locator("#timeline-chart .ytick text")
            drawn = {}

            def both_drawn() -> bool:
                # The page redraws its chart (Plotly.react) when the task's stages arrive by push: the labels
                # are read again until a whole drawing has both (one CI run read a drawing without "queue wait").
                drawn.clear()
                for i in range(labels.count()):
                    box = labels.nth(i).bounding_box()
                    if box is not None:  # Plotly keeps undrawn tick texts without a box
                        drawn[labels.nth(i).text_content()] = box
                return {"submit", "queue wait"} <= set(drawn)
            try:
                wait_for(both_drawn, 10, "the timeline's submit and queue wait labels")
            except AssertionError as exc:
                raise AssertionError(f"{exc}: drawn {drawn}") from None
            chart = page.locator("#timeline-chart").bounding_box()
            for label, box in drawn.items():
                assert box["x"] >= chart["x"] - 0.5, f"label {label!r} clipped at x={box['x']:.0f}"
            submit = page.locator('#timeline tr[data-stage="submit"] td.num').text_content().strip()
            assert float(submit) == pytest.approx(0.286, abs=0.002)
            shot(page, f"trial4-agent-{viewport['width']}")


def test_the_control_pages_facts_follow_the_live_reading(ops_stack, browser, ops_logins):
    research = Team.objects.get(project="research")
    campaign = make_campaign(team=research, user=ops_logins["launcher"], name="trial4-facts", status="submitted",
                             count=3)
    tasks = [make_task(campaign, task_number=n, started_at=None, state="pending", account=False) for n in (1, 2, 3)]
    with signed_in(browser, ops_stack, "launcher", viewport=DESKTOP) as page:
        page.goto(ops_stack.url + f"/ops/campaigns/{campaign.pk}/")
        before = page.text_content("#task-count")
        assert "done" not in before, before
        # The tasks end after the page was drawn (done: no poll changes them again).
        Task.objects.filter(pk__in=[t.pk for t in tasks]).update(state="done", active=False)

        def facts_follow():
            progress = page.text_content("#progress-states") or ""
            return "3 done" in progress and "3 (3 done)" == (page.text_content("#task-count") or "").strip()
        wait_until(facts_follow, 30, "the facts table to say 3 done as the progress does", 0.5)
        shot(page, "trial4-control-facts-live")
