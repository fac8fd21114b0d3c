"""Issue 16: the team lead's bills and the launcher's forecast, driven in Debian's Chromium.

The lead finds last week's spend per campaign and the most expensive campaign's costliest task;
the launcher sees the forecast's start and finish, launches, and watches the campaign live on
the page the launch lands on. Screenshots: var/test-output/issue16-*.png.
"""
from __future__ import annotations

import datetime as dt
import os
import time
from decimal import Decimal

import pytest
from django.utils import timezone

from dashboards.billing import budgets
from dashboards.core import rollups
from dashboards.models import AgentDefinition, Campaign, Task, Team
from tests.helpers import wait_until
from tests.support.history import make_campaign, make_task

from tests.support.stack import TEST_OUTPUT
from tests.support.browser import login

pytestmark = [pytest.mark.browser, pytest.mark.integration]

os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")


def shot(page, name: str) -> None:
    page.screenshot(path=str(TEST_OUTPUT / f"issue16-{name}.png"), full_page=True)


def text(page, selector: str) -> str:
    return " ".join((page.text_content(selector) or "").split())


def test_a_lead_finds_last_weeks_spend_per_campaign_and_the_costliest_task(ops_stack, browser_page, ops_logins):
    page = browser_page
    research = Team.objects.get(project="research")
    today = timezone.now().date()
    last_monday = today - dt.timedelta(days=today.weekday() + 7)
    started = dt.datetime.combine(last_monday + dt.timedelta(days=1), dt.time(10), tzinfo=dt.timezone.utc)
    cheap = make_campaign(team=research, user=ops_logins["launcher"], name="cheap-sweep", model="claude-x")
    dear = make_campaign(team=research, user=ops_logins["lead"], name="dear-sweep", model="claude-y")
    for n, cost in enumerate(("0.10", "0.20"), start=1):
        make_task(cheap, task_number=n, started_at=started, wallclock_s=30, cost_usd=cost,
                  tokens={"input_tokens": 100, "output_tokens": 10})
    for n, cost in enumerate(("0.50", "2.25", "0.75"), start=1):
        make_task(dear, task_number=n, started_at=started + dt.timedelta(days=1), wallclock_s=60, cost_usd=cost,
                  tokens={"input_tokens": 1000, "output_tokens": 100})
    with rollups.tasks_rolled(Task.objects.filter(campaign=dear).values_list("id", flat=True)):
        Task.objects.filter(campaign=dear).update(verdict="ok")  # as tco stores a verdict: bills count it
    unpriced = make_campaign(team=research, user=ops_logins["launcher"], name="unpriced-run", model="mystery")
    make_task(unpriced, task_number=1, started_at=started, wallclock_s=5, cost_usd=None,
              tokens={"output_tokens": 50})
    budgets.budget_set(user=ops_logins["lead"], team=research, period="month", amount_usd=Decimal("50"),
                       thresholds=[0.8, 1.0], on_exceed="hold", alert_emails=[])

    login(page, ops_stack, "lead")
    clock = time.monotonic()
    page.goto(ops_stack.url + "/ops/bills/")
    page.click('#bill-presets a[data-preset="last-week"]')
    page.wait_for_selector('#bill-presets a[data-preset="last-week"].on')
    page.click('#bill-group-tabs a[data-group="campaign"]')
    page.wait_for_selector('#bill-group-tabs a[data-group="campaign"].on')
    page.wait_for_selector("#bill-chart .main-svg")  # Plotly drew the stacked spend (served by tco)
    # Its periods' axis names the zone they are cut in (the bill's: the cluster's).
    zone = page.get_attribute("#bill-chart", "data-zone")
    assert zone and text(page, "#bill-chart .xtitle") == f"period ({zone})"
    dear_row = f'#bill tbody tr[data-key="dear-sweep (#{dear.pk})"]'
    assert text(page, f'{dear_row} td[data-col="cost_usd"]') == "$3.50"
    assert text(page, f'#bill tbody tr[data-key="cheap-sweep (#{cheap.pk})"] td[data-col="cost_usd"]') == "$0.3000"
    assert text(page, f'#bill tbody tr[data-key="unpriced-run (#{unpriced.pk})"] td[data-col="cost_usd"]') == "unpriced"
    assert "+ 1 unpriced task" in text(page, "#kpi-cost")
    # $3.80 over 6 finished tasks; 3 successful verdicts of dear-sweep.
    assert text(page, "#kpi-per-finished .value") == "$0.6333"
    assert text(page, "#kpi-per-verdict .value") == "$1.27"
    shot(page, "lead-bill-last-week")
    page.click(f"{dear_row} a.breakdown")
    page.wait_for_selector("#costliest")
    first = page.locator("#costliest tbody tr").first
    assert first.get_attribute("data-task") == "2" and "$2.25" in (first.text_content() or "")
    elapsed = time.monotonic() - clock
    shot(page, "lead-costliest-task")
    (TEST_OUTPUT / "issue16-lead-seconds.txt").write_text(f"{elapsed:.1f}\n")
    page.wait_for_selector("#burn-chart .main-svg")
    zone = page.get_attribute("#burn-chart", "data-zone")
    assert zone and text(page, "#burn-chart .xtitle") == f"day ({zone})"
    assert "projected" in text(page, "#burndown")


def test_a_launcher_sees_start_and_finish_then_watches_the_campaign_live(ops_stack, browser_page, ops_logins):
    page = browser_page
    research = Team.objects.get(project="research")
    agent = AgentDefinition.objects.get(name="demo-agent")
    history = make_campaign(team=research, user=ops_logins["launcher"], name="earlier", agent=agent)
    for n in range(1, 11):
        make_task(history, task_number=n, started_at=timezone.now() - dt.timedelta(hours=3), wallclock_s=4 + n,
                  cost_usd="0.002", tokens={"input_tokens": 300, "output_tokens": 40})
    budgets.budget_set(user=ops_logins["lead"], team=research, period="month", amount_usd=Decimal("5"),
                       thresholds=[1.0], on_exceed="refuse", alert_emails=[])
    login(page, ops_stack, "launcher")
    page.goto(ops_stack.url + "/ops/launch/")
    # Only the chosen input type's box is shown; the agent's example is offered.
    assert page.is_visible("#field-input_params") and not page.is_visible("#field-input_jsonl")
    page.check('input[name="input_kind"][value="jsonl"]')
    assert page.is_visible("#field-input_jsonl") and not page.is_visible("#field-input_params")
    page.check('input[name="input_kind"][value="params"]')
    assert "task=1..20 duration_s=5" in text(page, "#input-example")  # the example shows duration_s (trial 4)
    page.click("#use-example")
    assert page.input_value("#id_input_params") == "task=1..20 duration_s=5"
    models = page.locator("#id_model option").all_text_contents()
    assert "stand-in-review" in models, models  # from the price table
    page.fill("#id_name", "watched")
    page.fill("#id_input_params", "task=1 duration_s=abc")
    page.click("#launch-preview")
    page.wait_for_selector("#field-input_params .field-error")
    assert "duration_s" in text(page, "#field-input_params .field-error")
    page.fill("#id_input_params", "task=1 duration_s=1\ntask=2 duration_s=1\ntask=3 duration_s=1")
    page.click("#launch-preview")
    page.wait_for_selector("#forecast-when")
    start, finish = text(page, "#forecast-start"), text(page, "#forecast-finish")
    assert start and "unknown" not in start and "UTC" in finish
    assert "$5.00" in text(page, "#forecast-budget")
    assert text(page, "#forecast-slot-hours")
    assert "10 finished runs of demo-agent v" in text(page, "#forecast-basis")  # what the forecast rests on
    shot(page, "launcher-forecast")
    page.click("#launch-submit")
    # Launch lands on the live campaign page, which keeps the forecast beside the outcome.
    page.wait_for_url("**/campaigns/*/", timeout=15000)
    campaign = Campaign.objects.get(name="watched")
    assert page.url.endswith(f"/campaigns/{campaign.pk}/") and "/ops/" not in page.url
    page.wait_for_selector("#forecast-outcome")
    assert "UTC" in text(page, '#forecast-outcome tr[data-what="finish"]')
    assert "$" in text(page, '#forecast-outcome tr[data-what="cost"]')
    shot(page, "launcher-landed-on-campaign")
    page.click("#campaign-control-link")
    page.wait_for_url(f"**/ops/campaigns/{campaign.pk}/", timeout=15000)
    page.wait_for_selector("#progress-live:not([hidden])", timeout=15000)
    # Controls sit beside progress: pause while tasks wait, else the reason it is not offered.
    assert page.is_visible("#control") and page.is_visible("#progress-bar")
    assert page.is_visible("#control-pause") or "Pause: not offered" in text(page, "#controls-unavailable")
    shot(page, "launcher-live-start")
    # The page's CSP forbids eval, so poll from here: the status is redrawn by the page's own script.
    wait_until(lambda: text(page, "#progress-status") == "finished", 180, "the live page to show finished", 0.5)
    assert page.eval_on_selector("#progress-bar", "b => b.value") == 100
    assert "3 of 3 tasks ended" in text(page, "#progress-text")
    # The Control box follows the campaign too, without a reload (issue 16 trial: it stayed "submitting").
    wait_until(lambda: "Pause: not offered (the campaign is finished)" in text(page, "#controls-unavailable"), 30,
               "the Control box to follow the finished campaign", 0.5)
    assert "submitting" not in text(page, "#controls-unavailable").lower()
    shot(page, "launcher-live-finished")
    assert Campaign.objects.get(pk=campaign.pk).status == "finished"
