"""Trial 4 (session 4, /work/notes/trial4.md) findings 5, 6, 7, 9 and the lower items of 10 on the
agent, bill, queue and campaign pages: each test fails without its fix."""
from __future__ import annotations

import datetime as dt

import pytest

from dashboards.core import stages
from dashboards.billing import bills
from dashboards.billing import budgets
from dashboards.live import task as live_task
from dashboards.models import Task, Team
from tests.support.history import make_campaign, make_task
from tests.support.forms import launch_data

pytestmark = [pytest.mark.django_db]

T0 = dt.datetime(2026, 11, 24, 10, 0, 0, tzinfo=dt.timezone.utc)


# --------------------------------------------------------------------------- finding 5

def _task_with_truncated_submission(ops_users) -> tuple[Task, float]:
    """A campaign launched at 10:00:00.500 whose DRMAA call returned at .786, and one of its tasks
    whose scheduler submission time reads 10:00:00 (qstat's whole seconds: before the launch)."""
    research = Team.objects.get(project="research")
    campaign = make_campaign(team=research, user=ops_users["launcher"], status="running")
    campaign.launched_at = T0 + dt.timedelta(microseconds=500_000)
    campaign.submitted_at = T0 + dt.timedelta(microseconds=786_000)
    campaign.save(update_fields=["launched_at", "submitted_at"])
    task = make_task(campaign, started_at=T0 + dt.timedelta(seconds=5), state="running", account=False)
    Task.objects.filter(pk=task.pk).update(submitted_at=T0, ended_at=None, wallclock_s=None,
                                           task_started_at=T0 + dt.timedelta(seconds=5, microseconds=100_000))
    return Task.objects.select_related("campaign").get(pk=task.pk), 0.286


def test_the_agent_pages_submit_stage_is_the_campaigns_and_never_negative(ops_users):
    task, expected = _task_with_truncated_submission(ops_users)
    segments = {s["stage"]: s for s in stages.timeline(task)}
    assert segments["submit"]["seconds"] == pytest.approx(expected)  # .786 - .500, not .000 - .500
    row, = [r for r in stages.campaign_stages(task.campaign)["rows"] if r["stage"] == "submit"]
    assert row["median_s"] == pytest.approx(expected)
    assert all(s["seconds"] is None or s["seconds"] >= 0 for s in segments.values())


def test_a_finished_task_shows_no_stale_qstat_state_letters(ops_users, as_user):
    task, _ = _task_with_truncated_submission(ops_users)
    Task.objects.filter(pk=task.pk).update(state="done", active=False, state_code="hqw")
    detail = live_task.task_detail(ops_users["admin"], task.pk, with_scheduler=False)
    assert detail["task"]["state"] == "done" and detail["task"]["state_code"] == ""
    Task.objects.filter(pk=task.pk).update(state="held", active=True)
    assert live_task.task_detail(ops_users["admin"], task.pk, with_scheduler=False)["task"]["state_code"] == "hqw"


# --------------------------------------------------------------------------- finding 6

def test_jobs_not_launched_by_tco_are_counted_from_their_accounting_records_on_bill_and_api(as_user, ops_users):
    research = Team.objects.get(project="research")  # noqa: F841 - the bootstrap team is there
    day = dt.datetime(2026, 11, 3, tzinfo=dt.timezone.utc)
    # Another account's job under research: 3 tasks ended (accounting records of 10, 20, 30 s)...
    for n, wall in ((1, 10), (2, 20), (3, 30)):
        make_task(None, task_number=n, job_number=77001, started_at=day + dt.timedelta(hours=1), wallclock_s=wall,
                  project="research")

    def figures():
        client = as_user("lead")
        html = client.get("/ops/bills/", {"period": "day", "first": "2026-11-03", "last": "2026-11-03",
                                          "group_by": "team"}).content.decode()
        not_tco = html.split('id="bill-not-tco"', 1)[1].split("</tr>", 1)[0]
        api = client.get("/api/usage/", {"since": "2026-11-03T00:00:00Z", "until": "2026-11-04T00:00:00Z"}).json()
        other, = api["not_launched_by_tco"]
        return not_tco, other

    not_tco, other = figures()
    assert (other["tasks"], other["finished_tasks"], other["records"], other["wallclock_s"]) == (3, 3, 3, 60)
    assert 'data-col="tasks">3<' in not_tco and 'data-col="finished_tasks">3<' in not_tco
    # ...then a qstat poll sees 40 more of its tasks running (no records yet): the figures stay.
    for n in range(4, 44):
        make_task(None, task_number=n, job_number=77001, started_at=day + dt.timedelta(hours=2), state="running",
                  project="research", account=False)
    assert figures() == (not_tco, other)
    assert "each record is one finished task" in bills.USAGE_DEFINITION


# --------------------------------------------------------------------------- finding 9

def test_a_parameter_line_combines_a_range_with_fixed_values():
    from dashboards.launch import inputs

    items = inputs.inputs_from_params("task=1..24 duration_s=15\nfail=true task=30")
    assert len(items) == 25
    assert items[:24] == [{"task": n, "duration_s": 15} for n in range(1, 25)]
    assert items[24] == {"fail": True, "task": 30}
    inputs.check_inputs("demo-agent", items)  # task is an integer, duration_s a number
    assert inputs.inputs_from_params("label=x..y seed=2..3") == [{"label": "x..y", "seed": 2},
                                                                 {"label": "x..y", "seed": 3}]
    from dashboards.core.errors import LaunchError
    with pytest.raises(LaunchError, match="one range per line"):
        inputs.inputs_from_params("task=1..3 seed=1..2")
    with pytest.raises(LaunchError, match="at most 10 tasks; line 1 asks for 11"):
        inputs.inputs_from_params("task=0..10 duration_s=1", limit=10)


def test_the_launch_form_takes_a_range_with_fixed_values_and_never_claims_a_cap_of_one(as_user):
    client = as_user("launcher")
    html = client.post("/ops/launch/", {**launch_data(input_params="task=1..24 duration_s=15", concurrency_cap="4",
                                                      name="ranged"), "preview": "1"}).content.decode()
    assert "must be an integer" not in html and "at most the number of tasks" not in html
    assert "24 tasks" in html or "24 task" in html
    # Refused inputs are not one task: the cap is not judged against them.
    html = client.post("/ops/launch/", {**launch_data(input_params="task=abc duration_s=15", concurrency_cap="4",
                                                      name="refused"), "preview": "1"}).content.decode()
    assert "must be an integer" in html and "at most the number of tasks (1)" not in html


def test_the_agents_examples_show_duration_and_the_review_agent_has_one():
    from dashboards.launch import inputs

    demo = inputs.input_example("demo-agent")
    assert "duration_s=" in demo
    inputs.check_inputs("demo-agent", inputs.inputs_from_params(demo))
    review = inputs.input_example("sweep-review")
    items = inputs.inputs_from_params(review)
    assert items and all(isinstance(i["sweep_task"], int) and i["run_output"] for i in items)
    inputs.check_inputs("sweep-review", items)


# --------------------------------------------------------------------------- finding 10: the launch forecast

def test_budget_headroom_is_said_plainly_never_as_a_negative_amount(as_user, ops_users):
    from decimal import Decimal

    from django.utils import timezone

    assert budgets.headroom_text(Decimal("-0.0046")) == "over budget by $0.0046"
    assert budgets.headroom_text(Decimal("0")) == "no headroom"
    assert budgets.headroom_text(Decimal("0.0046")) == "$0.0046"
    research = Team.objects.get(project="research")
    done = make_campaign(team=research, user=ops_users["launcher"])
    for n in range(1, 11):  # $0.001 a task: $0.01 spent, the launch's 12 tasks $0.012
        make_task(done, task_number=n, started_at=timezone.now() - dt.timedelta(minutes=30), wallclock_s=5,
                  cost_usd="0.001", tokens={"output_tokens": 10})
    budgets.budget_set(user=ops_users["lead"], team=research, period="month", amount_usd=Decimal("0.02"),
                       thresholds=[1.0], on_exceed="hold", alert_emails=[])
    html = as_user("launcher").post("/ops/launch/", {**launch_data(input_params="task=1..12"),
                                                     "preview": "1"}).content.decode()
    after = html.split('id="forecast-budget"', 1)[1].split('data-col="after">', 1)[1].split("</td>", 1)[0]
    # $0.02 - $0.01 = $0.01 left now; after 12 x $0.001: $0.002 over.
    assert after.strip() == "over budget by $0.002"
    assert "$-" not in html.split('id="forecast-budget"', 1)[1].split("</table>", 1)[0]


def test_the_forecasts_misfit_notice_is_styled_as_a_warning_not_as_success():
    import re
    from pathlib import Path

    from django.conf import settings

    template = (Path(settings.BASE_DIR) / "dashboards/templates/dashboards/launch.html").read_text()
    tag = re.search(r'<p id="forecast-misfit"[^>]*>', template).group(0)
    assert "warning" in tag.split('class="', 1)[1].split('"', 1)[0].split()
    css = (Path(settings.BASE_DIR) / "static/css/tco.css").read_text()
    rule = re.search(r"p\.notice\.warning[^{]*\{([^}]*)\}", css).group(1)
    assert "var(--warn-bg)" in rule and "var(--warn)" in rule and "--ok" not in rule


# --------------------------------------------------------------------------- finding 10: every page, campaign page

def test_the_favicon_is_served_locally_and_linked_from_every_page(client, ops_users):
    response = client.get("/favicon.ico")
    assert response.status_code == 200
    body = b"".join(response.streaming_content) if response.streaming else response.content
    assert body[:4] == b"\x00\x00\x01\x00"  # an ICO header (Microsoft's ICONDIR: reserved 0, type 1)
    client.force_login(ops_users["viewer"])
    assert '<link rel="icon" href="/favicon.ico"' in client.get("/").content.decode()


def test_a_viewers_campaign_page_offers_no_control_link_and_says_why(client, ops_users):
    research = Team.objects.get(project="research")
    campaign = make_campaign(team=research, user=ops_users["launcher"], status="running")
    client.force_login(ops_users["viewer"])
    html = client.get(f"/campaigns/{campaign.pk}/").content.decode()
    assert 'id="campaign-control-link"' not in html and f"/ops/campaigns/{campaign.pk}/" not in html
    assert "need the launcher role on team research" in html
    client.force_login(ops_users["launcher"])
    html = client.get(f"/campaigns/{campaign.pk}/").content.decode()
    assert 'id="campaign-control-link"' in html and f"/ops/campaigns/{campaign.pk}/" in html


def test_a_bill_period_without_spend_draws_no_empty_chart_box(as_user, ops_users):
    html = as_user("lead").get("/ops/bills/", {"period": "day", "first": "2026-11-03", "last": "2026-11-09",
                                               "group_by": "campaign"}).content.decode()
    assert 'id="bill-chart"' not in html and 'id="bill-chart-empty"' in html


def test_the_bill_tables_usd_column_comes_before_the_token_buckets(as_user, ops_users):
    research = Team.objects.get(project="research")
    campaign = make_campaign(team=research, user=ops_users["launcher"])
    make_task(campaign, started_at=dt.datetime(2026, 11, 3, 9, tzinfo=dt.timezone.utc), wallclock_s=10, cost_usd="0.5",
              tokens={"input_tokens": 10, "output_tokens": 5})
    html = as_user("lead").get("/ops/bills/", {"period": "day", "first": "2026-11-03", "last": "2026-11-03",
                                               "group_by": "team"}).content.decode()
    head = html.split('<table class="grid" id="bill">', 1)[1].split("</thead>", 1)[0]
    columns = [c.strip() for c in __import__("re").findall(r"<th>([^<]*)</th>", head)]
    assert columns.index("USD") == 2 and columns.index("USD") < columns.index("Total tokens")
    row = html.split('data-project="research"', 1)[1].split("</tr>", 1)[0]
    cells = __import__("re").findall(r'<td class="num[^"]*"(?: data-col="([a-z_]+)")?', row)
    assert cells[0] == "cost_usd"
