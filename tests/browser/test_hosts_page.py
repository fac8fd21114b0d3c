"""Execution hosts on the pages, in Debian's Chromium, against the real multi-host dev cluster.

The queue page lists each host with its state, load, slots and tasks; when an
agent host's execd is killed (scripts/cluster-faults, started by scripts/test)
the page says at a glance that the host is unreachable and why, without a
reload, and shows it up again after it comes back. The campaign page filters
its tasks by host. Screenshots go to the test output directory.
"""
from __future__ import annotations

import os

import pytest

from dashboards.models import AgentDefinition, Team
from dashboards.launch.service import LaunchRequest, launch

from tests.support.stack import TEST_OUTPUT
from tests.support.hosts import agent_hosts, fault, qstat_tasks
from tests.support.browser import wait_for

pytestmark = [pytest.mark.browser, pytest.mark.integration]
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


def host_state(page, host: str) -> str | None:
    row = page.locator(f'#hosts tr[data-host="{host}"]')
    return row.get_attribute("data-state") if row.count() else None


def test_the_pages_show_hosts_a_lost_host_and_filter_tasks_by_host(live_stack, browser_page,
                                                                     django_user_model):
    names, _ = agent_hosts()
    if len(names) < 2:
        pytest.skip(f"agent.q spans {names}: the hosts page test needs at least two agent hosts")
    page = browser_page
    page.goto(live_stack.url + "/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "test-admin-pw-1")
    page.click("#login-submit")
    page.wait_for_selector("#live.on", timeout=15000)
    page.evaluate("window.__tcoNoReload = 'still here'")
    wait_for(lambda: all(host_state(page, h) == "up" for h in names), 60, "every agent host shown up")

    admin = django_user_model.objects.get(username="admin")
    campaign = launch(user=admin, request=LaunchRequest(
        team=Team.objects.get(project="research"), agent_definition=AgentDefinition.objects.get(name="demo-agent"),
        name="hosts-page", inputs=[{"task": n, "duration_s": 60.0} for n in range(1, 4)], rerunnable=True)).campaign
    wait_for(lambda: campaign.refresh_from_db() or campaign.job_number, 60, "the campaign submitted")
    wait_for(lambda: len([1 for s, h in qstat_tasks(campaign.job_number).values() if "r" in s and h]) == 3, 90,
             "three tasks running (qstat)")
    placed = {h for _, h in qstat_tasks(campaign.job_number).values()}
    lost = sorted(placed)[0]
    wait_for(lambda: page.locator(f'#hosts tr[data-host="{lost}"] td[data-col="tasks"] a').count() > 0, 60,
             f"the tasks on {lost} listed on the page")
    page.screenshot(path=str(TEST_OUTPUT / "hosts-up.png"), full_page=True)

    fault("down", lost)
    try:
        wait_for(lambda: host_state(page, lost) == "unreachable", 120, f"{lost} shown unreachable")
        alert = page.locator(f'#host-alerts li[data-instance="agent.q@{lost}"]')
        assert alert.count() == 1 and "u" in alert.get_attribute("data-states")
        assert "unknown" in alert.text_content()
        assert "unknown" in page.locator(f'#hosts tr[data-host="{lost}"] td[data-col="why"]').text_content()
        page.screenshot(path=str(TEST_OUTPUT / "hosts-lost.png"), full_page=True)
    finally:
        fault("up", lost)
    wait_for(lambda: host_state(page, lost) == "up", 120, f"{lost} shown up again")
    assert page.locator("#host-alerts li").count() == 0
    assert page.evaluate("window.__tcoNoReload") == "still here"

    # The campaign page: filter by host.
    page.goto(f"{live_stack.url}/campaigns/{campaign.pk}/")
    page.wait_for_selector("#live.on", timeout=15000)
    wait_for(lambda: page.locator("#host-filter a[data-host]").count() >= 2, 30, "host filter links")
    host_link = page.locator("#host-filter a[data-host]:not([data-host=''])").first
    chosen = host_link.get_attribute("data-host")
    host_link.click()
    wait_for(lambda: page.locator(f'#host-filter a.on[data-host="{chosen}"]').count() == 1, 30, "the filter on")
    wait_for(lambda: page.locator("#tasks tbody tr").count() > 0 and all(
        page.locator("#tasks tbody tr").nth(i).locator("td").nth(2).text_content() == chosen
        for i in range(page.locator("#tasks tbody tr").count())), 30, f"only tasks on {chosen}")
    page.screenshot(path=str(TEST_OUTPUT / "campaign-host-filter.png"), full_page=True)
