"""Issue 16, the lead's and the launcher's bugs: each test fails without its fix."""
from __future__ import annotations

import datetime as dt
import html as html_lib
from decimal import Decimal

import pytest
from django.utils import timezone

from dashboards.billing import bills
from dashboards.billing import budgets
from dashboards.billing import costs as billing_costs
from dashboards.core import encoding
from dashboards.core import rollups
from dashboards.models import AgentDefinition, Budget, Campaign, Task, Team
from tests.support.history import make_campaign, make_task, timing
from tests.support.forms import launch_data

pytestmark = [pytest.mark.django_db]


# --------------------------------------------------------------------------- bug 7

def _small_budget(ops_users):
    research = Team.objects.get(project="research")
    spent = make_campaign(team=research, user=ops_users["launcher"])
    make_task(spent, started_at=timezone.now() - dt.timedelta(minutes=5), cost_usd="0.0072")
    budgets.budget_set(user=ops_users["lead"], team=research, period="month", amount_usd=Decimal("0.01"),
                       thresholds=[1.0], on_exceed="refuse", alert_emails=[])
    return research


def test_budget_refusal_shows_amounts_precisely_enough_to_see_why(ops_users):
    research = _small_budget(ops_users)
    verdict = budgets.budget_verdict(research, Decimal("0.009"))
    assert verdict["action"] == "refuse"
    # 0.0072 + 0.009 = 0.0162 > 0.01: every amount shown as itself, none rounded to "$0.01".
    assert "$0.0072" in verdict["message"] and "$0.0090" in verdict["message"]
    assert "$0.0100" in verdict["message"] and "$0.0162" in verdict["message"]
    assert "$0.01;" not in verdict["message"] and "$0.01 " not in verdict["message"]


@pytest.mark.parametrize("amounts, over, places", [
    ([Decimal("100"), Decimal("80")], None, 2),
    ([Decimal("0.0072"), Decimal("0.009")], None, 4),
    ([Decimal("9.996"), Decimal("10")], (Decimal("10.004"), Decimal("10")), 3),
])
def test_usd_places_keeps_each_amount_within_one_percent_and_the_excess_visible(amounts, over, places):
    assert encoding.usd_places(amounts, over=over) == places


def test_the_launch_button_is_not_offered_when_the_budget_would_refuse(as_user, ops_users):
    _small_budget(ops_users)
    client = as_user("launcher")
    # No history: the budget check uses the cost cap, 0.003 x 3 tasks = $0.009.
    html = client.post("/ops/launch/", {**launch_data(cost_cap_usd="0.003"), "preview": "1"}).content.decode()
    assert 'id="budget-verdict"' in html and "$0.0072" in html
    assert 'id="launch-submit"' not in html and 'id="launch-blocked"' in html
    Budget.objects.update(amount_usd=Decimal("1"))
    html = client.post("/ops/launch/", {**launch_data(cost_cap_usd="0.003"), "preview": "1"}).content.decode()
    assert 'id="launch-submit"' in html and not Campaign.objects.filter(name="sweep-1").exists()


# --------------------------------------------------------------------------- bug 8

def _half_spent(ops_users, emails):
    research = Team.objects.get(project="research")
    spent = make_campaign(team=research, user=ops_users["launcher"])
    make_task(spent, started_at=timezone.now() - dt.timedelta(minutes=5), cost_usd="60")
    budgets.budget_set(user=ops_users["lead"], team=research, period="month", amount_usd=Decimal("100"),
                       thresholds=[0.5], on_exceed="refuse", alert_emails=emails)
    return research


def test_an_alert_without_recipients_is_shown_as_not_sent(as_user, ops_users, mailoutbox,
                                                          django_capture_on_commit_callbacks):
    ops_users["lead"].__class__.objects.filter(pk=ops_users["lead"].pk).update(email="")
    research = _half_spent(ops_users, [])
    with django_capture_on_commit_callbacks(execute=True):
        assert len(budgets.budget_check_alerts(teams=[research])) == 1
    assert mailoutbox == []
    (alert, delivery), = budgets.budget_status(research)[0]["deliveries"]
    assert delivery["sent"] is False and "no recipients" in delivery["detail"]
    html = as_user("lead").get("/ops/budgets/").content.decode()
    assert 'data-sent="no"' in html and "e-mail failed" in html and 'data-sent="yes"' not in html


def test_an_alert_the_mail_server_refused_is_shown_as_failed(as_user, ops_users, monkeypatch,
                                                             django_capture_on_commit_callbacks):
    def refuse(*args, **kwargs):
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr("dashboards.billing.budgets.send_mail", refuse)
    research = _half_spent(ops_users, ["finance@example.org"])
    with django_capture_on_commit_callbacks(execute=True):
        budgets.budget_check_alerts(teams=[research])
    (alert, delivery), = budgets.budget_status(research)[0]["deliveries"]
    assert delivery["sent"] is False and "Connection refused" in delivery["detail"]
    html = as_user("lead").get("/ops/budgets/").content.decode()
    assert 'data-sent="no"' in html and "Connection refused" in html


def test_an_alert_that_was_mailed_says_so(as_user, ops_users, mailoutbox, django_capture_on_commit_callbacks):
    research = _half_spent(ops_users, ["finance@example.org"])
    with django_capture_on_commit_callbacks(execute=True):
        budgets.budget_check_alerts(teams=[research])
    assert len(mailoutbox) == 1
    (alert, delivery), = budgets.budget_status(research)[0]["deliveries"]
    assert delivery["sent"] is True and "2 address" in delivery["detail"]
    html = as_user("lead").get("/ops/budgets/").content.decode()
    assert 'data-sent="yes"' in html and "e-mailed" in html


# --------------------------------------------------------------------------- bug 12

@pytest.mark.parametrize("params, message", [
    ("task=1 duration_s=abc", 'task 1: duration_s (seconds to think) must be a number >= 0, not "abc"'),
    ("task=1\ntask=2 duration_s=-3", "task 2: duration_s (seconds to think) must be a number >= 0, not -3"),
    ("task=x", 'task 1: task (the task\'s number) must be an integer, not "x"'),
    ("task=1 fail=yes", 'task 1: fail (exit 3 when true) must be true or false, not "yes"'),
    ("task=1 wait_s=soon", 'task 1: wait_s (seconds) must be a number >= 0, not "soon"'),
])
def test_a_parameter_list_with_values_the_agent_cannot_read_is_refused(as_user, params, message):
    client = as_user("launcher")
    for button in ("preview", "launch"):
        html = client.post("/ops/launch/", {**launch_data(input_params=params), button: "1"}).content.decode()
        field = html.split('id="field-input_params"', 1)[1].split('<div class="field"', 1)[0]
        assert "field-error" in field
        assert message in html_lib.unescape(field)
    assert not Campaign.objects.exists()


def test_good_demo_parameters_pass_and_jsonl_is_checked_the_same_way(ops_users):
    from dashboards.launch import inputs
    from dashboards.core.errors import LaunchError

    inputs.check_inputs("demo-agent", inputs.inputs_from_params("task=1 duration_s=2.5 fail=false\ntask=2"))
    with pytest.raises(LaunchError, match="task 2: duration_s"):
        inputs.check_inputs("demo-agent", inputs.inputs_from_jsonl('{"task": 1}\n{"task": 2, "duration_s": "abc"}'))
    # The service checks too (the API and the urgent page do not go through the form).
    from dashboards.launch import service
    from dashboards.models import AgentDefinition

    with pytest.raises(LaunchError, match="duration_s"):
        service.launch(user=ops_users["launcher"],
                      request=service.LaunchRequest(team=Team.objects.get(project="research"),
                                                   agent_definition=AgentDefinition.objects.get(name="demo-agent"),
                                                   inputs=[{"duration_s": "abc"}], name="bad-1"))
    assert not Campaign.objects.exists()


# --------------------------------------------------------------------------- bug 10

def test_sixty_finished_runs_without_tokens_are_history_not_none(as_user, ops_users):
    research = Team.objects.get(project="research")
    earlier = make_campaign(team=research, user=ops_users["launcher"])
    for n in range(1, 61):
        make_task(earlier, task_number=n, started_at=timezone.now() - dt.timedelta(hours=1), wallclock_s=10 + n)
    agent = AgentDefinition.objects.get(name="demo-agent")
    result = billing_costs.forecast(agent_definition=agent, count=5)
    assert result["history"] == 60 and not result["no_history"] and result["metered_history"] == 0
    assert result["tokens"] == {"p10": 0, "p50": 0, "p90": 0}
    assert result["cost_usd"] == {"p10": 0, "p50": 0, "p90": 0}  # no tokens, nothing to pay: $0, known
    # Wall clock 11..70 s: the median of 60 values is (40 + 41) / 2.
    assert result["duration_s"]["p50"] == pytest.approx(40.5)
    html = as_user("launcher").post("/ops/launch/", {**launch_data(), "preview": "1"}).content.decode()
    assert "No history" not in html and "60 earlier tasks" in html and "none used model tokens" in html


# --------------------------------------------------------------------------- bug 6

def test_the_bill_and_the_usage_api_agree_for_a_team_and_day_and_say_their_definition(as_user, ops_users):
    research = Team.objects.get(project="research")
    campaign = make_campaign(team=research, user=ops_users["launcher"])
    day = dt.datetime(2026, 11, 3, tzinfo=dt.timezone.utc)
    make_task(campaign, task_number=1, started_at=day + dt.timedelta(hours=1), wallclock_s=300, cost_usd="0.25",
              tokens={"input_tokens": 1000, "output_tokens": 50})
    make_task(campaign, task_number=2, started_at=day + dt.timedelta(hours=2), wallclock_s=258, cost_usd="0.5",
              tokens={"input_tokens": 2000, "output_tokens": 70})
    # Another account's qsub -P research the same day: apart on both, never in the team's figures.
    make_task(None, task_number=1, started_at=day + dt.timedelta(hours=3), wallclock_s=218, project="research")
    make_task(campaign, task_number=3, started_at=day + dt.timedelta(days=1, hours=1), wallclock_s=999)  # next day
    client = as_user("lead")
    html = client.get("/ops/bills/", {"period": "day", "first": "2026-11-03", "last": "2026-11-03",
                                      "group_by": "team"}).content.decode()
    total = html.split('id="bill-total"', 1)[1].split("</tr>", 1)[0]
    not_tco = html.split('id="bill-not-tco"', 1)[1].split("</tr>", 1)[0]
    api = client.get("/api/usage/", {"since": "2026-11-03T00:00:00Z", "until": "2026-11-04T00:00:00Z"}).json()
    team_row, = api["teams"]
    other_row, = api["not_launched_by_tco"]
    # Computed here: 2 tco tasks, 300 + 258 s, $0.75, 3,120 tokens; the other job 1 task, 218 s.
    assert (team_row["tasks"], team_row["wallclock_s"], team_row["tokens"]) == (2, 558, 3120)
    assert Decimal(team_row["cost_usd"]) == Decimal("0.75")
    assert (other_row["tasks"], other_row["wallclock_s"]) == (1, 218)
    assert 'data-col="tasks">2<' in total and 'data-col="wallclock_s">558<' in total and "$0.75" in total
    assert 'data-col="tasks">1<' in not_tco and 'data-col="wallclock_s">218<' in not_tco
    assert api["definition"] == bills.USAGE_DEFINITION
    definition = html.split('id="usage-definition">', 1)[1].split("<", 1)[0]
    assert html_lib.unescape(definition).strip() == bills.USAGE_DEFINITION


# --------------------------------------------------------------------------- feature 4: when it will run

@pytest.fixture(autouse=True)
def _no_live_scheduler(monkeypatch):
    """The forecast asks the scheduler for the queue's slots now; here it does not answer, so the
    figures are the cluster status the tests store (never the dev cluster's)."""
    from schedulers.fake import FakeScheduler

    fake = FakeScheduler()
    fake.unavailable = True
    monkeypatch.setattr("dashboards.core.clusters.scheduler_for", lambda cluster, **options: fake)
    return fake


def _cluster_status(cluster, **overrides):
    status = {
        "queues": [{"name": "agent.q", "used": 10, "resv": 0, "available": 0, "total": 10}],
        "hosts": [{"name": "global", "resources": {"anthropic_api": {"value": "0.000000"}}}],
        "global_capacity": {"anthropic_api": 8.0},
        "quotas": [{"rule": "per_project/1", "resource": "slots", "limit": 6, "used": 6,
                    "filters": {"projects": ["research"]}},
                   {"rule": "batch_only/1", "resource": "slots", "limit": 1, "used": 0,
                    "filters": {"projects": ["batch"]}}],
        "share_tree": [{"node": "/", "project": None, "shares": 1},
                       {"node": "/research", "project": "research", "shares": 1},
                       {"node": "/engineering", "project": "engineering", "shares": 3}],
    }
    status.update(overrides)
    cluster.__class__.objects.filter(pk=cluster.pk).update(status=status, status_at=timezone.now())
    cluster.refresh_from_db()
    return cluster


def test_the_launch_forecast_says_when_from_the_schedulers_figures_and_history(ops_users):
    from dashboards.core.clusters import cluster_get_default

    research = Team.objects.get(project="research")
    cluster = _cluster_status(cluster_get_default())
    done = make_campaign(team=research, user=ops_users["launcher"])
    for n in range(1, 11):
        make_task(done, task_number=n, started_at=timezone.now() - dt.timedelta(hours=2), wallclock_s=60)
    waiting = make_campaign(team=research, user=ops_users["launcher"], status="submitted")
    for n in range(1, 5):
        make_task(waiting, task_number=n, started_at=None, state="pending")
    for n in range(1, 21):
        make_task(None, task_number=n, started_at=None, state="pending", project="engineering", job_number=777)
    now = timezone.now()
    agent = AgentDefinition.objects.get(name="demo-agent")
    durations = billing_costs.forecast(agent_definition=agent, count=12)["duration_s"]
    t = timing(cluster=cluster, team=research, count=12, queue="agent.q", seats_per_task=1,
                                        concurrency_cap=None, priority=0, duration_s=durations, now=now)
    # Limits: 12 tasks, 10 slots, 8 seats, research's quota 6 (batch's does not apply); while
    # engineering waits, research's share is 1 of 4 shares of min(10 slots, 8 seats) = 2 at once.
    assert [lim["tasks"] for lim in t["limits"]] == [2, 6, 8, 10, 12]
    assert t["at_once"] == 2 and t["free_now"] == 0 and t["share"] == 0.25
    # Only agent.q's work is ahead: the campaign's 4 tasks; job 777 (not launched by tco, queue unknown) apart.
    assert t["ahead"] == 4 and t["ahead_all"] == 4 and t["ahead_unknown"] == 20
    # Start: (4 ahead + 1) x 60 s / (0.25 x 8) = 150 s; run: ceil(12 / 2) = 6 waves x 60 s.
    assert t["wait_s"] == pytest.approx(150)
    assert t["finish_at"]["p50"] == now + dt.timedelta(seconds=150 + 360)
    assert t["slot_hours"]["p50"] == pytest.approx(12 * 60 / 3600)


def test_an_idle_cluster_starts_at_once_and_the_cap_limits(ops_users):
    from dashboards.core.clusters import cluster_get_default

    research = Team.objects.get(project="research")
    cluster = _cluster_status(cluster_get_default(),
                              queues=[{"name": "agent.q", "used": 0, "resv": 0, "available": 10, "total": 10}],
                              hosts=[{"name": "global", "resources": {"anthropic_api": "8.000000"}}], quotas=[])
    now = timezone.now()
    t = timing(cluster=cluster, team=research, count=9, queue="agent.q", seats_per_task=2,
                                        concurrency_cap=3, priority=0,
                                        duration_s={"p10": 10.0, "p50": 20.0, "p90": 40.0}, now=now)
    # 8 seats / 2 per task = 4, the cap 3: three at once, 3 waves of 20 s (40 s at the 90th percentile).
    assert t["at_once"] == 3 and t["free_now"] == 3 and t["wait_s"] == 0
    assert t["finish_at"] == {"p50": now + dt.timedelta(seconds=60), "p90": now + dt.timedelta(seconds=120)}


def test_the_launch_page_shows_start_finish_slot_hours_and_headroom(as_user, ops_users):
    from dashboards.core.clusters import cluster_get_default

    research = Team.objects.get(project="research")
    _cluster_status(cluster_get_default(), queues=[{"name": "agent.q", "used": 0, "resv": 0, "available": 10,
                                                    "total": 10}], quotas=[],
                    hosts=[{"name": "global", "resources": {"anthropic_api": "8.000000"}}])
    done = make_campaign(team=research, user=ops_users["launcher"])
    for n in range(1, 11):
        make_task(done, task_number=n, started_at=timezone.now() - dt.timedelta(hours=2), wallclock_s=60,
                  cost_usd="0.5", tokens={"output_tokens": 100})
    budgets.budget_set(user=ops_users["lead"], team=research, period="month", amount_usd=Decimal("20"),
                       thresholds=[1.0], on_exceed="refuse", alert_emails=[])
    html = as_user("launcher").post("/ops/launch/", {**launch_data(), "preview": "1"}).content.decode()
    assert "at once (next scheduling run)" in html.split('id="forecast-start"', 1)[1].split("</dd>", 1)[0]
    assert "UTC" in html.split('id="forecast-finish"', 1)[1].split("</dd>", 1)[0]
    assert 'id="forecast-slot-hours"' in html
    # $20 budget, $5 spent (10 x $0.50), this launch 3 x $0.50: $15.00 left now, $13.50 after.
    budget_row = html.split('id="forecast-budget"', 1)[1].split("</table>", 1)[0]
    assert "$15.00" in budget_row and "$13.50" in budget_row


def test_after_launch_the_launcher_lands_on_the_live_campaign_page_with_its_forecast(as_user, ops_users):
    client = as_user("launcher")
    response = client.post("/ops/launch/", {**launch_data(), "launch": "1"}, follow=True)
    campaign = Campaign.objects.get(name="sweep-1")
    assert response.redirect_chain[-1][0] == f"/campaigns/{campaign.pk}/"
    html = response.content.decode()
    assert 'id="live"' in html and 'id="forecast-outcome"' in html and 'id="campaign-control-link"' in html
    assert "launched with 3 tasks" in html
    # The control page keeps the controls beside the progress.
    html = client.get(f"/ops/campaigns/{campaign.pk}/").content.decode()
    live = html.split('class="campaign-live"', 1)[1].split('<section class="card">', 1)[0]
    assert 'id="progress"' in live and 'id="control"' in live and 'id="progress-bar"' in live
    assert f'data-api="/api/campaigns/{campaign.pk}/"' in live and "0 of 3 tasks ended" in html.replace("<strong>", "").replace("</strong>", "")


# --------------------------------------------------------------------------- feature 1: bills a lead reads in a minute

def _bill_history(ops_users):
    research = Team.objects.get(project="research")
    day = dt.datetime(2026, 11, 10, 9, tzinfo=dt.timezone.utc)  # a Tuesday
    big = make_campaign(team=research, user=ops_users["launcher"], name="big", model="claude-x")
    small = make_campaign(team=research, user=ops_users["lead"], name="small", model="claude-y")
    costs = ["1.5", "0.25", "4", "0.75"]
    for n, cost in enumerate(costs, start=1):
        t = make_task(big, task_number=n, started_at=day, wallclock_s=10, cost_usd=cost,
                      tokens={"output_tokens": 10 * n}, state="done" if n != 2 else "failed")
        if n in (1, 3):
            with rollups.tasks_rolled([t.pk]):  # as tco stores a verdict: bills count it
                Task.objects.filter(pk=t.pk).update(verdict="ok")
    make_task(small, task_number=1, started_at=day + dt.timedelta(days=1), wallclock_s=5, cost_usd=None,
              tokens={"output_tokens": 99})  # tokens, no price: unpriced, never $0
    return research, big, small


def test_bills_break_down_by_launcher_and_link_every_campaign_to_its_costliest_tasks(as_user, ops_users):
    research, big, small = _bill_history(ops_users)
    client = as_user("lead")
    query = {"period": "day", "first": "2026-11-09", "last": "2026-11-15"}
    html = client.get("/ops/bills/", {**query, "group_by": "launcher"}).content.decode()
    rows = {r.split('data-key="', 1)[1].split('"', 1)[0]: r for r in html.split("<tr data-period=")[1:]}
    assert set(rows) == {"launcher", "lead"}
    assert "$6.50" in rows["launcher"] and "unpriced" in rows["lead"] and "$0.00" not in rows["lead"]
    # Cost per finished task and per successful verdict: $6.50 / 5 finished, / 2 verdicts (tasks 1 and 3).
    assert "$1.30" in html.split('id="kpi-per-finished"', 1)[1].split("</div>", 1)[0]
    assert "$3.25" in html.split('id="kpi-per-verdict"', 1)[1].split("</div>", 1)[0]
    assert "+ 1 unpriced task" in html.split('id="kpi-cost"', 1)[1].split("</div>", 1)[0]
    assert 'id="bill-chart-data"' in html and "plotly" in html
    html = client.get("/ops/bills/", {**query, "group_by": "campaign"}).content.decode()
    link = html.split('class="breakdown"', 1)[0].rsplit('href="', 1)[1].split('"', 1)[0]
    assert f"campaign={big.pk}" in html_lib.unescape(link)
    html = client.get("/ops/bills/" + html_lib.unescape(link)).content.decode()
    costliest = html.split('id="costliest"', 1)[1].split("</table>", 1)[0]
    order = [int(part.split('"', 1)[0]) for part in costliest.split('data-task="')[1:]]
    assert order == [3, 1, 4, 2]  # $4, $1.50, $0.75, $0.25
    csv_link = html_lib.unescape(html.split('id="costliest-csv"', 1)[0].rsplit('href="', 1)[1].split('"', 1)[0])
    body = client.get(csv_link).content.decode().splitlines()
    assert body[0].startswith("campaign,task_number") and [line.split(",")[1] for line in body[1:]] == ["3", "1", "4", "2"]


def test_the_bill_opens_on_the_spend_the_costliest_campaign_and_its_costliest_task(as_user, ops_users, monkeypatch):
    """The lead's question ("this week's spend, the costliest campaign and its costliest task") answered
    beside the spend, before the chart, whatever the bill is grouped by."""
    from dashboards.web import forms

    monkeypatch.setattr(forms, "cluster_today", lambda: dt.date(2026, 11, 12))  # the Thursday of that week
    research, big, small = _bill_history(ops_users)
    other = make_campaign(team=research, user=ops_users["launcher"], name="other")
    make_task(other, task_number=1, started_at=dt.datetime(2026, 11, 11, 9, tzinfo=dt.timezone.utc), wallclock_s=5,
              cost_usd="6")  # $6 in one task, less than big's $6.50 in four
    costliest = Task.objects.get(campaign=big, task_number=3)
    client = as_user("lead")
    for group_by in ("team", "campaign", "model"):
        html = client.get("/ops/bills/", {"preset": "this-week", "group_by": group_by}).content.decode()
        tile = html.split('id="kpi-top-campaign"', 1)[1].split("</div>", 1)[0]
        assert "Costliest campaign" in tile and "$6.50" in tile and f"big (#{big.pk})" in tile, group_by
        assert "52% of the spend" in tile  # $6.50 of $12.50
        assert f'href="/tasks/{costliest.pk}/"' in tile and f">{costliest.task_id}</a> $4.00" in tile
        assert f'href="/campaigns/{big.pk}/?sort=cost&amp;dir=desc"' in tile
        link = html_lib.unescape(tile.split('class="top-campaign"', 1)[0].rsplit('href="', 1)[1].split('"', 1)[0])
        assert f"campaign={big.pk}" in link and "group_by=campaign" in link
        # On the first screen: the spend, then this tile, both before the chart, the presets and the form.
        assert html.index('id="kpi-cost"') < html.index('id="kpi-top-campaign"') < html.index('id="bill-chart"') \
            < html.index('id="bill-presets"') < html.index('id="bill-form"')
    # A campaign's breakdown names its own costliest task.
    html = client.get("/ops/bills/", {"preset": "this-week", "group_by": "campaign", "campaign": other.pk}).content.decode()
    tile = html.split('id="kpi-top-campaign"', 1)[1].split("</div>", 1)[0]
    assert "This campaign" in tile and "$6.00" in tile and "of the spend" not in tile
    # Nothing priced: no tile.
    html = client.get("/ops/bills/", {"first": "2025-01-06", "last": "2025-01-12"}).content.decode()
    assert 'id="kpi-top-campaign"' not in html


def _same_rows(one: list[dict], other: list[dict], what: str) -> None:
    """Two bills' rows field by field: every count, token and dollar exact, wall clock and slot-seconds
    to float rounding (summed in another order)."""
    assert [(r["period"], r["team"], r["label"]) for r in one] == [(r["period"], r["team"], r["label"]) for r in other], what
    for a, b in zip(one, other):
        assert set(a) == set(b), what
        for field in a:
            if field in ("wallclock_s", "slot_s"):
                assert a[field] == pytest.approx(b[field], rel=1e-12), (what, field)
            else:
                assert a[field] == b[field], (what, field, a["label"])


def test_a_bill_with_its_campaigns_reads_once_and_sums_as_each_grouping_alone(ops_users):
    """``bills.bill(with_campaigns=True)`` (the bill page): the usage read once per campaign and summed into
    the page's grouping gives the rows that grouping's own bill gives, for every grouping, and the
    campaigns' bill beside them; two clusters, two teams, a job tco did not launch, a task still running,
    and a range that starts and ends inside an hour (the detail rows) around whole hours (the rollups)."""
    from dashboards.core.clusters import cluster_get_default
    from dashboards.models import Cluster

    research, engineering = Team.objects.get(project="research"), Team.objects.get(project="engineering")
    home = cluster_get_default()
    second = Cluster.objects.create(name="second", sge_root="/var/lib/gridengine", sge_cell="second",
                                    accounting_path="/nonexistent", qmaster_port=6544, execd_port=6545)
    day = dt.datetime(2026, 11, 10, 9, 30, tzinfo=dt.timezone.utc)
    plan = [(research, "launcher", "claude-x", home, ["1.5", "0.25"]), (research, "lead", "", home, ["4"]),
            (research, "launcher", "claude-y", second, ["0.75", None]), (engineering, "launcher", "claude-x", home, ["2"])]
    for n, (team, who, model, cluster, costs) in enumerate(plan):
        campaign = make_campaign(team=team, user=ops_users[who], name=f"c{n}", model=model)
        Campaign.objects.filter(pk=campaign.pk).update(cluster=cluster)
        campaign.refresh_from_db()
        for k, cost in enumerate(costs, start=1):
            make_task(campaign, task_number=k, started_at=day + dt.timedelta(hours=7 * n + k, minutes=k),
                      wallclock_s=10.1 * (n + k), slots=n + 1, cost_usd=cost, tokens={"output_tokens": 7 * k})
    running = make_campaign(team=research, user=ops_users["launcher"], name="running", model="claude-x")
    make_task(running, started_at=day + dt.timedelta(days=1, minutes=3), state="running", cost_usd="0.5",
              account=False)
    make_task(None, started_at=day + dt.timedelta(hours=2), wallclock_s=33.3, project="research")  # not tco's
    teams = [research, engineering]
    for period, first, last in (("day", dt.date(2026, 11, 9), dt.date(2026, 11, 15)),
                                ("week", dt.date(2026, 11, 9), dt.date(2026, 11, 22))):
        campaigns = bills.bill(teams=teams, period=period, first=first, last=last, group_by="campaign")
        assert {r["label"] for r in campaigns["rows"]} >= {"c0 (#%d)" % Campaign.objects.get(name="c0").pk,
                                                          bills.NOT_TCO}
        for group_by in bills.GROUPS:
            alone = bills.bill(teams=teams, period=period, first=first, last=last, group_by=group_by)
            shared = bills.bill(teams=teams, period=period, first=first, last=last, group_by=group_by,
                                with_campaigns=True)
            _same_rows(shared["rows"], alone["rows"], f"{period} {group_by}")
            _same_rows([shared["totals"], shared["not_tco_totals"]], [alone["totals"], alone["not_tco_totals"]],
                       f"{period} {group_by} totals")
            _same_rows(shared["by_campaign"]["rows"], campaigns["rows"], f"{period} {group_by}: its campaigns")
            assert shared["by_campaign"]["group_by"] == "campaign" and "by_campaign" not in alone
        # $1.75 + $4 + $0.75 + $0.50 (running) for research, $2 for engineering: the campaigns' bill sums them.
        assert campaigns["totals"]["cost_usd"] == Decimal("9.00")


def test_the_bill_page_reads_the_bill_once_for_its_rows_and_its_costliest_campaign(as_user, ops_users, monkeypatch):
    """The costliest campaign beside a bill grouped by team, model, launcher or cluster came from a second
    bill grouped by campaign: the page read the usage tables twice. Now as often as one bill does."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from dashboards.web import forms

    monkeypatch.setattr(forms, "cluster_today", lambda: dt.date(2026, 11, 12))
    research, big, _small = _bill_history(ops_users)  # no budget: no burn-down reads the usage besides

    def bill_reads(queries) -> int:
        """A bill's reads of the usage (``bills._accumulate``): the rollups' sums, and the detail rows' grouped
        by the team's project (``tp``)."""
        return sum(1 for q in queries if q["sql"].lstrip().startswith("SELECT") and (
            'FROM "dashboards_usagerollup"' in q["sql"] or 'FROM "dashboards_usagedayrollup"' in q["sql"]
            or ' AS "tp"' in q["sql"]))

    with CaptureQueriesContext(connection) as one:
        bills.bill(teams=[research], period="day", first=dt.date(2026, 11, 9), last=dt.date(2026, 11, 15),
                   group_by="campaign")
    once = bill_reads(one.captured_queries)
    assert once >= 2  # the rollups and the detail rows at least
    client = as_user("lead")
    for group_by in ("campaign", "team", "model", "launcher", "cluster"):
        with CaptureQueriesContext(connection) as page:
            html = client.get("/ops/bills/", {"preset": "this-week", "group_by": group_by}).content.decode()
        assert f"big (#{big.pk})" in html.split('id="kpi-top-campaign"', 1)[1].split("</div>", 1)[0], group_by
        assert bill_reads(page.captured_queries) == once, group_by


def test_bill_presets_are_last_week_and_friends(as_user, ops_users, monkeypatch):
    from dashboards.web import forms

    monkeypatch.setattr(forms, "cluster_today", lambda: dt.date(2026, 11, 18))  # a Wednesday
    _bill_history(ops_users)
    client = as_user("lead")
    html = client.get("/ops/bills/", {"preset": "last-week", "group_by": "campaign"}).content.decode()
    assert 'value="2026-11-09"' in html and 'value="2026-11-15"' in html  # Monday to Sunday before
    assert 'data-preset="last-week" class="on"' in html
    assert "$6.50" in html.split('id="bill-total"', 1)[1].split("</tr>", 1)[0]
    csv_body = client.get("/ops/bills.csv", {"preset": "last-week", "group_by": "campaign"}).content.decode()
    assert "2026-11-10" in csv_body and "big (#" in csv_body


def test_a_budgets_burn_down_projects_the_spend_to_the_period_end(ops_users):
    research = Team.objects.get(project="research")
    campaign = make_campaign(team=research, user=ops_users["launcher"])
    budget = budgets.budget_set(user=ops_users["lead"], team=research, period="month", amount_usd=Decimal("100"),
                                thresholds=[1.0], on_exceed="hold", alert_emails=[])
    make_task(campaign, task_number=1, started_at=dt.datetime(2026, 11, 2, 12, tzinfo=dt.timezone.utc),
              cost_usd="10")
    make_task(campaign, task_number=2, started_at=dt.datetime(2026, 11, 5, 12, tzinfo=dt.timezone.utc),
              cost_usd="20")
    now = dt.datetime(2026, 11, 11, 0, tzinfo=dt.timezone.utc)  # 10 of November's 30 days gone
    burn = budgets.budget_burndown(budget, now=now)
    assert burn["days"][0] == "2026-11-01" and burn["days"][-1] == "2026-11-11"
    assert burn["cumulative_usd"][0] == 0 and burn["cumulative_usd"][1] == 10 and burn["cumulative_usd"][-1] == 30
    assert burn["projected_usd"] == Decimal("90") and not burn["over"]  # $30 in 10 days -> $90 in 30


def test_the_costliest_tasks_come_a_page_at_a_time(as_user, ops_users):
    """A campaign's costliest tasks, 20 a page, costliest first, unpriced ones with tokens last."""
    research = Team.objects.get(project="research")
    campaign = make_campaign(team=research, user=ops_users["launcher"], name="wide")
    day = dt.datetime(2026, 11, 10, 9, tzinfo=dt.timezone.utc)
    for n in range(1, 46):  # task n costs $n/100; task 45 has tokens and no price
        make_task(campaign, task_number=n, started_at=day, wallclock_s=1, cost_usd=None if n == 45 else n / 100,
                  tokens={"output_tokens": n})
    client = as_user("lead")
    query = {"period": "day", "first": "2026-11-10", "last": "2026-11-10", "group_by": "campaign",
             "campaign": campaign.pk}

    def page(number: int | None) -> tuple[list[int], str]:
        html = client.get("/ops/bills/", {**query, **({"tasks_page": number} if number else {})}).content.decode()
        section = html.split('id="costliest"', 1)[1].split("</section>", 1)[0]
        return [int(p.split('"', 1)[0]) for p in section.split('data-task="')[1:]], section

    first, html = page(None)
    assert first == list(range(44, 24, -1)) and 'rel="next"' in html and 'rel="prev"' not in html
    second, html = page(2)
    assert second == list(range(24, 4, -1)) and 'rel="next"' in html and 'rel="prev"' in html
    third, html = page(3)
    assert third == [4, 3, 2, 1, 45] and 'rel="next"' not in html
    assert page(4)[0] == [] and "No more tasks" in page(4)[1]


def test_a_long_bill_shows_its_rows_a_page_at_a_time_with_the_total_of_all(as_user, ops_users, monkeypatch):
    from dashboards.billing import bill_page

    monkeypatch.setattr(bill_page, "ROWS_PER_PAGE", 2)
    research = Team.objects.get(project="research")
    campaign = make_campaign(team=research, user=ops_users["launcher"], name="daily")
    for day in range(1, 6):  # one task a day, $1 each
        make_task(campaign, task_number=day, started_at=dt.datetime(2026, 11, day, 9, tzinfo=dt.timezone.utc),
                  wallclock_s=1, cost_usd="1")
    client = as_user("lead")
    query = {"period": "day", "first": "2026-11-01", "last": "2026-11-05"}

    def page(number=None):
        html = client.get("/ops/bills/", {**query, **({"rows_page": number} if number else {})}).content.decode()
        return [r.split('"', 1)[0] for r in html.split("<tr data-period=\"")[1:]], html

    first, html = page()
    assert first == ["2026-11-01", "2026-11-02"] and 'rel="next"' in html.split('id="bill-pager"')[1]
    assert "$5.00" in html.split('id="bill-total"', 1)[1].split("</tr>", 1)[0]  # the total of every row
    assert page(3)[0] == ["2026-11-05"] and 'rel="prev"' in page(3)[1].split('id="bill-pager"')[1]


def test_a_chart_of_many_campaigns_stacks_the_costliest_and_sums_the_rest():
    from dashboards.billing import bill_page

    rows = [{"period": dt.date(2026, 11, 1), "label": f"c{n}", "team": "t", "launched_by_tco": True,
             "cost_usd": Decimal(n), "unpriced_tasks": 0} for n in range(1, 31)]
    chart = bill_page.bill_chart({"rows": rows, "group_by": "campaign"}, top=5)
    assert [s["label"] for s in chart["series"]] == ["c30", "c29", "c28", "c27", "c26", "(25 others)"]
    assert chart["series"][-1]["cost_usd"] == [float(sum(range(1, 26)))]


def test_the_launch_pages_preview_forecasts_the_cost_once(as_user, ops_users, monkeypatch):
    # The refusal check read its own forecast of the same request: the preview forecast twice (review, round 3).
    _small_budget(ops_users)
    calls = []
    real = billing_costs.forecast
    monkeypatch.setattr(billing_costs, "forecast", lambda **kw: calls.append(kw) or real(**kw))
    client = as_user("launcher")
    html = client.post("/ops/launch/", {**launch_data(cost_cap_usd="0.003"), "preview": "1"}).content.decode()
    assert 'id="launch-blocked"' in html and "over budget" in html  # the refusal is still said
    assert len(calls) == 1, calls
    Budget.objects.update(amount_usd=Decimal("1"))
    calls.clear()
    html = client.post("/ops/launch/", {**launch_data(cost_cap_usd="0.003"), "preview": "1"}).content.decode()
    assert 'id="launch-submit"' in html and len(calls) == 1


@pytest.mark.parametrize("url", ["/ops/launch/", "/ops/urgent/"])
def test_with_one_cluster_the_forms_show_no_cluster_label_without_a_control(as_user, url):
    # A fresh user saw "Cluster — the Grid Engine cell it runs on" with nothing under it (the field is hidden).
    html = as_user("urgent").get(url).content.decode()
    assert 'type="hidden" name="cluster"' in html
    assert "the Grid Engine cell it runs on" not in html and 'id="field-cluster"' not in html
    assert '<label for="id_cluster"' not in html
