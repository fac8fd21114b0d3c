"""The live queue page in Debian's Chromium: a campaign launched from the test
changes state on the page without a reload."""
from __future__ import annotations

import os

import pytest

from dashboards.launch.service import LaunchRequest, launch
from dashboards.models import AgentDefinition, Cluster, Team

from tests.support.stack import TEST_OUTPUT
from tests.support.browser import cell, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.integration]

# Playwright's sync API runs an event loop in this thread; the ORM calls below
# are still plain synchronous calls between page actions.
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")



def test_queue_page_shows_a_campaign_go_from_pending_to_done_without_reload(live_stack, browser_page,
                                                                             django_user_model):
    page = browser_page
    page.goto(live_stack.url + "/")
    assert "/login/" in page.url
    page.fill("#id_username", "admin")
    page.fill("#id_password", "test-admin-pw-1")
    page.click("#login-submit")
    page.wait_for_selector("#live.on", timeout=15000)
    # The cluster card names each cluster's flavour and accounting file (from the cluster record).
    for cluster in Cluster.objects.all():
        page.wait_for_selector(f"#flavour-{cluster.name}", timeout=15000)
        card = page.text_content(f"#flavour-{cluster.name}") or ""
        assert f"Scheduler {cluster.flavour}" in card and cluster.accounting_path in card, card
    # A marker that a reload would wipe out.
    page.evaluate("window.__tcoNoReload = 'still here'")

    team = Team.objects.get(project="research")
    agent = AgentDefinition.objects.get(name="demo-agent")
    admin = django_user_model.objects.get(username="admin")
    count = 4
    campaign = launch(user=admin, request=LaunchRequest(team=team, agent_definition=agent, name="browser",
                               inputs=[{"task": n, "duration_s": 4.0} for n in range(1, count + 1)])).campaign
    row = f'tr[data-campaign="{campaign.pk}"]'
    page.wait_for_selector(row, timeout=20000)
    wait_for(lambda: cell(page, campaign.pk, "running") > 0, 60, "a running task on the page")
    page.screenshot(path=str(TEST_OUTPUT / "queue-running.png"), full_page=True)
    wait_for(lambda: cell(page, campaign.pk, "done") == count, 120, "every task done on the page")
    assert page.evaluate("window.__tcoNoReload") == "still here"
    finished = page.locator("#finished tbody tr")
    assert finished.count() >= count
    # Every finished row shows its accounting data (wall clock and exit status).
    first = finished.first
    assert first.locator("td").nth(5).text_content().strip() != ""
    assert first.locator("td").nth(6).text_content().strip() == "0"
    seats = page.text_content("#seats")
    assert seats and "of 96 in use" in seats
    page.screenshot(path=str(TEST_OUTPUT / "queue-done.png"), full_page=True)

    page.click(f"{row} a")
    page.wait_for_selector("h1")
    assert f"#{campaign.pk}" in page.text_content("h1")
    page.screenshot(path=str(TEST_OUTPUT / "campaign.png"), full_page=True)
