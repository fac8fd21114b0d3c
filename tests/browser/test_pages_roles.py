"""Every role in Debian's Chromium: a real campaign changes state on the queue, campaign and agent
pages without a reload, and nobody sees (or can subscribe to) another team's campaign.

Screenshots of each page go to ``var/test-output/roles/``.
"""
from __future__ import annotations

import os

import pytest
from django.utils import timezone

from dashboards.launch.service import LaunchRequest, launch
from dashboards.models import AgentDefinition, Task, Team

from tests.support.campaigns import DEMO_PASSWORD, make_campaign
from tests.support.stack import TEST_OUTPUT
from tests.support.browser import cell, wait_for

pytestmark = [pytest.mark.browser, pytest.mark.integration]

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

SHOTS = TEST_OUTPUT / "roles"


@pytest.fixture(autouse=True)
def _shots_dir():
    SHOTS.mkdir(parents=True, exist_ok=True)
ROLES = ("viewer", "lead", "launcher", "urgent", "eng-viewer", "admin")


def login(browser, url: str, username: str):
    """A new browser context signed in as ``username``; returns its page, on the queue page and live."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.goto(url + "/login/")
    page.fill("#id_username", username)
    page.fill("#id_password", "test-admin-pw-1" if username == "admin" else DEMO_PASSWORD)
    page.click("#login-submit")
    page.wait_for_selector("#live.on", timeout=15000)
    return page


def campaign_ids_on(page) -> set[int]:
    return {int(x) for x in page.eval_on_selector_all("#campaigns tbody tr[data-campaign]",
                                                      "rows => rows.map(r => r.dataset.campaign)")}


def socket_close_code(page, path: str) -> int | None:
    """Open a WebSocket from the page and return the code it is closed with (None if it stays open)."""
    return page.evaluate("""path => new Promise(resolve => {
        const ws = new WebSocket("ws://" + location.host + path);
        let opened = false;
        ws.onopen = () => { opened = true; };
        ws.onclose = ev => resolve(ev.code);
        setTimeout(() => { if (opened) { ws.close(); resolve(null); } }, 3000);
    })""", path)


def state_count(page, state: str) -> int:
    text = page.text_content(f'#states td[data-state="{state}"]')
    return int(text) if text and text.strip().isdigit() else 0


def test_each_role_watches_its_campaigns_live_and_nothing_else(live_stack, browser, role_users):
    from dashboards.live import history

    history.depth_clear()  # the test database's name is reused from run to run
    url = live_stack.url
    research = Team.objects.get(project="research")
    engineering = Team.objects.get(project="engineering")
    admin = role_users["admin"]
    # An engineering campaign that research must never see (finished; written straight to the database).
    eng = make_campaign(team=engineering, user=admin, name="eng-only", job_number=999_001, status="finished",
                        tasks=[{"state": "done", "exit_status": 0, "ended_at": timezone.now()}],
                        finished_at=timezone.now())

    pages = {role: login(browser, url, role) for role in ROLES}
    for page in pages.values():
        page.evaluate("window.__tcoNoReload = 'still here'")

    agent = AgentDefinition.objects.get(name="demo-agent")
    count = 3
    # At most one task at a time: the others pend with a reason the agent page explains.
    campaign = launch(user=role_users["launcher"], request=LaunchRequest(team=research, agent_definition=agent, name="roles",
                               concurrency_cap=1,
                               inputs=[{"task": n, "duration_s": 4.0} for n in range(1, count + 1)])).campaign

    viewer = pages["viewer"]
    row = f'tr[data-campaign="{campaign.pk}"]'
    for role in ("viewer", "lead", "launcher", "urgent", "admin"):
        pages[role].wait_for_selector(row, timeout=20000)
    wait_for(lambda: cell(viewer, campaign.pk, "running") > 0, 90, "a running task on the viewer's queue page")
    viewer.screenshot(path=str(SHOTS / "viewer-queue-running.png"), full_page=True)

    # The campaign page in a second tab of the viewer, live too.
    camp = viewer.context.new_page()
    camp.goto(f"{url}/campaigns/{campaign.pk}/")
    camp.wait_for_selector("#live.on", timeout=15000)
    camp.evaluate("window.__tcoNoReload = 'still here'")
    wait_for(lambda: state_count(camp, "pending") > 0 and state_count(camp, "running") > 0, 60,
             "pending and running tasks on the campaign page")
    camp.screenshot(path=str(SHOTS / "viewer-campaign-running.png"), full_page=True)

    # A pending task's agent page says why it waits (qstat -j through the web server, cached).
    pending = Task.objects.filter(campaign=campaign, state="pending").order_by("-task_number").first()
    assert pending is not None
    agent_page = viewer.context.new_page()
    agent_page.goto(f"{url}/tasks/{pending.pk}/")
    agent_page.wait_for_selector("#live.on", timeout=15000)
    agent_page.wait_for_selector("#pending-reasons li", timeout=15000)
    reasons = agent_page.text_content("#pending-reasons")
    assert "array task limit" in reasons or "waiting" in reasons, reasons
    agent_page.screenshot(path=str(SHOTS / "viewer-agent-pending.png"), full_page=True)
    # ... and the same page follows the task to the end without a reload.
    agent_page.evaluate("window.__tcoNoReload = 'still here'")
    wait_for(lambda: "done" in (agent_page.text_content('#facts tr[data-key="state"] td') or ""), 120,
             "the pending task done on its agent page")
    agent_page.wait_for_function("document.querySelector('#stdout').textContent.includes('demo agent')",
                                 timeout=30000)
    assert agent_page.evaluate("window.__tcoNoReload") == "still here"
    assert agent_page.locator('#timeline tr[data-stage="agent_work"]').count() == 1
    agent_page.screenshot(path=str(SHOTS / "viewer-agent-done.png"), full_page=True)

    wait_for(lambda: cell(viewer, campaign.pk, "done") == count, 120, "every task done on the queue page")
    wait_for(lambda: state_count(camp, "done") == count, 30, "every task done on the campaign page")
    camp.wait_for_function(
        "document.querySelector('#stage-table tr[data-stage=\"agent_work\"] td.median').textContent !== ''",
        timeout=30000)
    assert "100" in camp.text_content("#progress-text")
    for page in (viewer, camp):
        assert page.evaluate("window.__tcoNoReload") == "still here"
    # The queue-depth history arrived by push (a sample every TCO_DEPTH_SAMPLE_S) and is drawn by Plotly.
    viewer.wait_for_selector("#depth-chart .main-svg", timeout=30000)
    viewer.screenshot(path=str(SHOTS / "viewer-queue-done.png"), full_page=True)
    camp.screenshot(path=str(SHOTS / "viewer-campaign-done.png"), full_page=True)

    # Research roles see research only; the engineering viewer sees engineering only; the admin both.
    for role in ("viewer", "lead", "launcher", "urgent"):
        shown = campaign_ids_on(pages[role])
        assert campaign.pk in shown and eng.pk not in shown, role
        pages[role].screenshot(path=str(SHOTS / f"{role}-queue.png"), full_page=True)
    eng_page = pages["eng-viewer"]
    assert campaign_ids_on(eng_page) == {eng.pk}
    eng_page.screenshot(path=str(SHOTS / "eng-viewer-queue.png"), full_page=True)
    assert {campaign.pk, eng.pk} <= campaign_ids_on(pages["admin"])
    pages["admin"].screenshot(path=str(SHOTS / "admin-queue.png"), full_page=True)

    # Refusals, seen from the browser: pages are 404s and the sockets are closed with 4403.
    first_task = Task.objects.filter(campaign=campaign).order_by("task_number").first()
    for path in (f"/campaigns/{campaign.pk}/", f"/tasks/{first_task.pk}/"):
        response = eng_page.goto(url + path)
        assert response.status == 404, path
    eng_page.goto(url + "/")
    assert socket_close_code(eng_page, f"/ws/campaigns/{campaign.pk}/") == 4403
    assert socket_close_code(eng_page, f"/ws/tasks/{first_task.pk}/") == 4403
    assert socket_close_code(viewer, f"/ws/campaigns/{eng.pk}/") == 4403
    assert socket_close_code(viewer, f"/ws/campaigns/{campaign.pk}/") is None
    response = viewer.goto(f"{url}/campaigns/{eng.pk}/")
    assert response.status == 404

    # The admin opens the engineering campaign and an agent page of research; the screenshots show each role's view.
    admin_page = pages["admin"]
    admin_page.goto(f"{url}/campaigns/{eng.pk}/")
    admin_page.wait_for_selector("#live.on", timeout=15000)
    admin_page.screenshot(path=str(SHOTS / "admin-campaign-eng.png"), full_page=True)
    admin_page.goto(f"{url}/tasks/{first_task.pk}/")
    admin_page.wait_for_selector("#live.on", timeout=15000)
    admin_page.wait_for_function("document.querySelector('#accounting table') !== null", timeout=30000)
    admin_page.screenshot(path=str(SHOTS / "admin-agent.png"), full_page=True)
    for role in ("lead", "launcher", "urgent"):
        page = pages[role]
        page.goto(f"{url}/campaigns/{campaign.pk}/")
        page.wait_for_selector("#live.on", timeout=15000)
        page.screenshot(path=str(SHOTS / f"{role}-campaign.png"), full_page=True)


def test_the_api_token_page_and_the_api_work_from_the_live_server(live_stack, browser, role_users):
    import json
    import urllib.request

    page = login(browser, live_stack.url, "lead")
    page.goto(live_stack.url + "/account/token/")
    page.click("#token-rotate")
    key = page.text_content("#new-token").strip()
    page.screenshot(path=str(SHOTS / "lead-token.png"), full_page=True)

    def get(path: str, token: str | None = key):
        request = urllib.request.Request(live_stack.url + path,
                                         headers={"Authorization": f"Token {token}"} if token else {})
        try:
            with urllib.request.urlopen(request, timeout=10) as resp:
                return resp.status, json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return exc.code, None

    status, me = get("/api/me/")
    assert status == 200 and me["username"] == "lead" and me["capabilities"]["bill"] == ["research"]
    assert get("/api/usage/")[0] == 200
    assert get("/api/queue/", token=None)[0] == 401
    # /metrics needs its token, even from 127.0.0.1 (every local account connects from there; issue 11).
    from django.conf import settings

    assert settings.TCO_METRICS_TOKEN, "scripts/setup writes <state dir>/metrics-token"
    try:
        urllib.request.urlopen(live_stack.url + "/metrics", timeout=10)
        raise AssertionError("/metrics answered a local client without its token")
    except urllib.error.HTTPError as exc:
        assert exc.code == 403
    request = urllib.request.Request(live_stack.url + "/metrics",
                                     headers={"Authorization": f"Bearer {settings.TCO_METRICS_TOKEN}"})
    with urllib.request.urlopen(request, timeout=10) as resp:
        assert resp.status == 200 and b"tco_poll_age_seconds" in resp.read()
