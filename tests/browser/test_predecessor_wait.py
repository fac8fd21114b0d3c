"""Trial 4 (issue 16), finding 2 and triage item 10 in Chromium on the real dev cluster: a campaign
launched with a -hold_jid_ad predecessor waits for it (not paused, no resume, its own triage group
without a release), and the triage table's Action column fits a 1280 px window.

Screenshots go to ``var/test-output/uxb/``.
"""
from __future__ import annotations

import os

import pytest

from dashboards.launch.service import LaunchRequest, launch
from dashboards.models import AgentDefinition, Campaign, Task, Team
from tests.helpers import wait_until
from tests.support.cluster import qdel_quietly

from tests.support.browser import shot, signed_in, text

pytestmark = [pytest.mark.browser, pytest.mark.integration]

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

WIDE = {"width": 1280, "height": 900}


def test_a_campaign_waiting_for_its_predecessor_is_not_paused_anywhere(ops_stack, browser, ops_logins):
    research = Team.objects.get(project="research")
    agent = AgentDefinition.objects.get(name="demo-agent")
    tag = f"uxb-pred-{os.getpid()}"
    pred = launch(user=ops_logins["launcher"], request=LaunchRequest(
        team=research, agent_definition=agent, name=f"{tag}-a",
        inputs=[{"task": n, "duration_s": 60.0} for n in (1, 2)])).campaign
    jobs = []
    try:
        pred = wait_until(lambda: Campaign.objects.filter(pk=pred.pk, job_number__isnull=False).first(), 60,
                          "the predecessor submitted", 0.5)
        jobs.append(pred.job_number)
        succ = launch(user=ops_logins["launcher"], request=LaunchRequest(
            team=research, agent_definition=agent, name=f"{tag}-b", predecessor_job=pred.job_number,
            inputs=[{"task": n, "duration_s": 1.0} for n in (1, 2)])).campaign
        succ = wait_until(lambda: Campaign.objects.filter(pk=succ.pk, job_number__isnull=False).first(), 60,
                          "the successor submitted", 0.5)
        jobs.append(succ.job_number)
        wait_until(lambda: Task.objects.filter(campaign=succ, state="held", active=True).count() == 2, 60,
                   "the successor's tasks seen held (hqw)", 0.5)
        wait_until(lambda: Campaign.objects.get(pk=succ.pk).status == "waiting", 30, "the successor waiting", 0.5)
        with signed_in(browser, ops_stack, "launcher", viewport=WIDE) as page:
            page.goto(f"{ops_stack.url}/ops/campaigns/{succ.pk}/")
            page.wait_for_selector("#control-waiting")
            assert f"wait for predecessor job {pred.job_number}" in text(page, "#control-waiting")
            assert text(page, "#progress-status") == "waiting"
            assert page.locator("#control-resume").count() == 0
            page.wait_for_selector('#progress-states [data-state="waiting"]')
            assert page.locator('#progress-states [data-state="held"]').count() == 0
            shot(page, "launcher-succ-waiting")
        with signed_in(browser, ops_stack, "admin", os.environ["TCO_ADMIN_PASSWORD"], viewport=WIDE) as page:
            page.goto(ops_stack.url + "/ops/triage/")
            group = f'div.group[data-group="predecessor:{pred.job_number}"]'
            page.wait_for_selector(group)
            assert f"wait for predecessor job {pred.job_number} (campaign {tag}-a)" in text(page, f"{group} h3")
            assert page.locator(f"{group} button").count() == 0
            row = f'tr[data-job="{succ.job_number}"]'
            assert page.get_attribute(row, "data-group") == f"predecessor:{pred.job_number}"
            assert "user/operator/system" not in text(page, row)
            shot(page, "admin-triage-predecessor-1280")
            # Every row's Action column is inside the 1280 px window (it was clipped).
            rights = page.eval_on_selector_all(
                "#triage td.action", "cells => cells.map(c => c.getBoundingClientRect().right)")
            assert rights and max(rights) <= WIDE["width"], rights
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= WIDE["width"], f"triage renders {width} px wide"
    finally:
        for job in reversed(jobs):
            qdel_quietly(job)
