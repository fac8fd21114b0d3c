"""Bills, budgets and forecasts (dashboards.billing)."""
from __future__ import annotations

import csv
import datetime as dt
from decimal import Decimal

import pytest

import zoneinfo
from dashboards.billing import bill_page, bills
from dashboards.billing import budgets
from dashboards.billing import costs
from dashboards.billing import periods
from dashboards.core import errors
from dashboards.models import AgentDefinition, Budget, BudgetAlert, Cluster, Team
from dashboards.core.clusters import cluster_get_default
from tests.support.history import make_campaign, make_task

pytestmark = pytest.mark.django_db

UTC = dt.timezone.utc


def at(*args) -> dt.datetime:
    return dt.datetime(*args, tzinfo=UTC)


def tokens(inp=0, read=0, w5=0, w1=0, out=0, reasoning=0) -> dict:
    return {"input_tokens": inp, "cache_read_tokens": read, "cache_write_5m_tokens": w5,
            "cache_write_1h_tokens": w1, "output_tokens": out, "reasoning_tokens": reasoning}


def test_periods_are_days_iso_weeks_from_monday_and_months():
    day = dt.date(2026, 3, 4)  # a Wednesday
    assert periods.period_start(day, "day") == day
    assert periods.period_start(day, "week") == dt.date(2026, 3, 2)
    assert periods.period_start(day, "month") == dt.date(2026, 3, 1)
    assert periods.next_period_start(dt.date(2026, 12, 1), "month") == dt.date(2027, 1, 1)
    assert periods.next_period_start(dt.date(2028, 2, 1), "month") == dt.date(2028, 3, 1)


def test_period_bounds_are_local_midnights_in_utc_and_qacct_times_are_local():
    ny = zoneinfo.ZoneInfo("America/New_York")
    begin, end = periods.period_bounds(dt.date(2026, 3, 8), "day", ny)  # the day DST starts: 23 hours
    assert begin == at(2026, 3, 8, 5) and end == at(2026, 3, 9, 4)
    assert periods.qacct_time(begin, ny) == "202603080000.00"
    assert periods.qacct_time(end - dt.timedelta(seconds=1), ny) == "202603082359.59"


def test_a_task_belongs_to_the_period_of_its_start_in_the_cluster_time_zone(bootstrap, ops_users):
    cluster = cluster_get_default()
    Cluster.objects.filter(pk=cluster.pk).update(time_zone="America/New_York")
    research = Team.objects.get(project="research")
    campaign = make_campaign(team=research, user=ops_users["launcher"])
    # 03:00 UTC on March 1st is 22:00 on February 28th in New York.
    make_task(campaign, task_number=1, started_at=at(2026, 3, 1, 3), wallclock_s=100, cost_usd="1.5",
              tokens=tokens(inp=10, out=5))
    make_task(campaign, task_number=2, started_at=at(2026, 3, 1, 6), wallclock_s=50, cost_usd="0.5",
              tokens=tokens(inp=1, out=1))
    result = bills.bill(teams=[research], period="month", first=dt.date(2026, 2, 1), last=dt.date(2026, 3, 31))
    rows = {r["period"]: r for r in result["rows"]}
    assert set(rows) == {dt.date(2026, 2, 1), dt.date(2026, 3, 1)}
    assert rows[dt.date(2026, 2, 1)]["wallclock_s"] == 100 and rows[dt.date(2026, 2, 1)]["cost_usd"] == Decimal("1.5")
    assert rows[dt.date(2026, 3, 1)]["wallclock_s"] == 50 and rows[dt.date(2026, 3, 1)]["total_tokens"] == 2
    assert result["time_zone"] == "America/New_York"


def test_a_bill_sums_tokens_by_bucket_usd_wallclock_and_slot_seconds_per_team(bootstrap, ops_users):
    research = Team.objects.get(project="research")
    engineering = Team.objects.get(project="engineering")
    r = make_campaign(team=research, user=ops_users["launcher"], model="claude-a")
    e = make_campaign(team=engineering, user=ops_users["other"], model="claude-b")
    day = at(2026, 5, 4, 10)
    make_task(r, task_number=1, started_at=day, wallclock_s=10, slots=2, cost_usd="0.10",
              tokens=tokens(100, 20, 3, 4, 50, reasoning=7))
    make_task(r, task_number=2, started_at=day + dt.timedelta(hours=1), wallclock_s=30, cost_usd="0.20",
              tokens=tokens(out=10))
    make_task(r, task_number=3, started_at=day, wallclock_s=5, cost_usd=None, tokens=tokens(out=9))  # unpriced
    make_task(e, task_number=1, started_at=day, wallclock_s=7, cost_usd="1", tokens=tokens(inp=1))
    make_task(r, task_number=4, started_at=None, state="deleted")  # never started: in no period
    result = bills.bill(teams=[research, engineering], period="day", first=dt.date(2026, 5, 4),
                          last=dt.date(2026, 5, 4))
    by_team = {row["team"]: row for row in result["rows"]}
    row = by_team["research"]
    assert row["tasks"] == 3 and row["records"] == 3
    assert (row["input_tokens"], row["cache_read_tokens"], row["cache_write_5m_tokens"], row["cache_write_1h_tokens"],
            row["output_tokens"], row["reasoning_tokens"]) == (100, 20, 3, 4, 69, 7)
    assert row["total_tokens"] == 100 + 20 + 3 + 4 + 69
    assert row["cost_usd"] == Decimal("0.30") and row["unpriced_tasks"] == 1
    assert row["wallclock_s"] == 45 and row["slot_s"] == 10 * 2 + 30 + 5
    assert by_team["engineering"]["cost_usd"] == Decimal("1")
    assert result["totals"]["wallclock_s"] == 52 and result["totals"]["cost_usd"] == Decimal("1.30")
    # Only the teams asked for.
    only = bills.bill(teams=[engineering], period="day", first=dt.date(2026, 5, 4), last=dt.date(2026, 5, 4))
    assert [r["team"] for r in only["rows"]] == ["engineering"]


def test_a_bill_per_model_and_per_campaign(bootstrap, ops_users):
    research = Team.objects.get(project="research")
    agent = AgentDefinition.objects.get(name="demo-agent")
    AgentDefinition.objects.filter(pk=agent.pk).update(default_model="default-model")
    a = make_campaign(team=research, user=ops_users["launcher"], name="alpha", model="m-1")
    b = make_campaign(team=research, user=ops_users["launcher"], name="beta")
    day = at(2026, 5, 4, 10)
    make_task(a, started_at=day, wallclock_s=3, cost_usd="1", tokens=tokens(out=1))
    make_task(b, started_at=day, wallclock_s=4, cost_usd="2", tokens=tokens(out=2))
    make_task(None, started_at=day, wallclock_s=5, project="research")  # a job tco did not launch
    # One tco only saw in qstat without -ext: its project comes from its accounting record.
    seen = make_task(None, task_number=2, started_at=day, wallclock_s=0, project="research")
    type(seen).objects.filter(pk=seen.pk).update(project="")
    per_model = bills.bill(teams=[research], period="week", first=dt.date(2026, 5, 4), last=dt.date(2026, 5, 4),
                             group_by="model")
    assert {r["label"]: r["wallclock_s"] for r in per_model["rows"]} == {
        "m-1": 3, "default-model": 4, bills.NOT_TCO: 5}
    assert per_model["first"] == dt.date(2026, 5, 4) and per_model["last"] == dt.date(2026, 5, 10)
    per_campaign = bills.bill(teams=[research], period="day", first=dt.date(2026, 5, 4), last=dt.date(2026, 5, 4),
                                group_by="campaign")
    assert {r["label"]: r["cost_usd"] for r in per_campaign["rows"]} == {
        f"alpha (#{a.pk})": Decimal("1"), f"beta (#{b.pk})": Decimal("2"), bills.NOT_TCO: Decimal("0")}
    assert {r["label"]: r["tasks"] for r in per_campaign["rows"]}[bills.NOT_TCO] == 2


def test_costs_add_up_exactly_in_decimal(bootstrap, ops_users):
    research = Team.objects.get(project="research")
    campaign = make_campaign(team=research, user=ops_users["launcher"])
    for n in range(1, 301):
        make_task(campaign, task_number=n, started_at=at(2026, 5, 4, 10), cost_usd="0.00000001", account=False,
                  tokens=tokens(out=1))
    make_task(campaign, task_number=999, started_at=at(2026, 5, 4, 10), cost_usd="123456.12345678", account=False)
    result = bills.bill(teams=[research], period="day", first=dt.date(2026, 5, 4), last=dt.date(2026, 5, 4))
    assert result["rows"][0]["cost_usd"] == Decimal("123456.12345978")


def test_the_csv_export_has_every_row_and_exact_amounts(bootstrap, ops_users):
    research = Team.objects.get(project="research")
    campaign = make_campaign(team=research, user=ops_users["launcher"])
    make_task(campaign, task_number=1, started_at=at(2026, 5, 4, 10), wallclock_s=2.5, cost_usd="0.12345678",
              tokens=tokens(inp=3, out=4))
    make_task(campaign, task_number=2, started_at=at(2026, 5, 6, 10), wallclock_s=1, cost_usd="1")
    result = bills.bill(teams=[research], period="day", first=dt.date(2026, 5, 1), last=dt.date(2026, 5, 31))
    rows = list(csv.reader(["\t".join(r) for r in bill_page.bill_csv_rows(result)], delimiter="\t"))
    header, body = rows[0], rows[1:]
    assert header[:3] == ["period_start", "team", "project"] and "cost_usd" in header and "slot_s" in header
    assert [r[0] for r in body] == ["2026-05-04", "2026-05-06"]
    first = dict(zip(header, body[0]))
    assert first["cost_usd"] == "0.12345678" and first["wallclock_s"] == "2.500" and first["total_tokens"] == "7"


def test_bad_bill_requests_are_refused_with_a_reason():
    with pytest.raises(errors.BillError, match="period"):
        bills.bill(teams=[], period="year", first=dt.date(2026, 1, 1), last=dt.date(2026, 1, 2))
    with pytest.raises(errors.BillError, match="before"):
        bills.bill(teams=[], period="day", first=dt.date(2026, 1, 2), last=dt.date(2026, 1, 1))
    with pytest.raises(errors.BillError, match="at most"):
        bills.bill(teams=[], period="day", first=dt.date(2020, 1, 1), last=dt.date(2026, 1, 1))


def test_thresholds_are_percentages_with_clear_errors():
    assert budgets.parse_thresholds("50, 80%, 100") == [0.5, 0.8, 1.0]
    with pytest.raises(errors.BillError, match="not a number"):
        budgets.parse_thresholds("fifty")
    with pytest.raises(errors.BillError, match="1 to 1000"):
        budgets.parse_thresholds("-5")


def test_budget_verdict_refuses_or_holds_as_the_lead_chose(bootstrap, ops_users):
    research = Team.objects.get(project="research")
    campaign = make_campaign(team=research, user=ops_users["launcher"])
    now = at(2026, 5, 20, 12)
    make_task(campaign, started_at=at(2026, 5, 20, 1), cost_usd="80")
    budgets.budget_set(user=ops_users["lead"], team=research, period="month", amount_usd=Decimal("100"),
                       thresholds=[0.5, 1.0], on_exceed="refuse", alert_emails=[])
    assert budgets.budget_verdict(research, Decimal("10"), now=now)["action"] == "submit"
    verdict = budgets.budget_verdict(research, Decimal("30"), now=now)
    assert verdict["action"] == "refuse" and "$100.00" in verdict["message"] and "$80.00" in verdict["message"]
    Budget.objects.filter(team=research).update(on_exceed="hold")
    assert budgets.budget_verdict(research, Decimal("30"), now=now)["action"] == "hold"
    # Last month's spend does not count.
    assert budgets.budget_verdict(research, Decimal("30"), now=at(2026, 6, 2))["action"] == "submit"


def test_budget_alerts_are_recorded_and_mailed_once_per_threshold_and_period(bootstrap, ops_users, mailoutbox,
                                                                             django_capture_on_commit_callbacks):
    research = Team.objects.get(project="research")
    campaign = make_campaign(team=research, user=ops_users["launcher"])
    now = at(2026, 5, 20, 12)
    make_task(campaign, started_at=at(2026, 5, 20, 1), cost_usd="60")
    budgets.budget_set(user=ops_users["lead"], team=research, period="month", amount_usd=Decimal("100"),
                       thresholds=[0.5, 0.8, 1.0], on_exceed="refuse", alert_emails=["finance@example.org"])
    with django_capture_on_commit_callbacks(execute=True):
        created = budgets.budget_check_alerts(now=now)
    assert [float(a.threshold) for a in created] == [0.5]
    assert len(mailoutbox) == 1
    assert set(mailoutbox[0].to) == {"finance@example.org", "lead@example.org"}
    assert "50%" in mailoutbox[0].subject and "$60.00" in mailoutbox[0].subject
    with django_capture_on_commit_callbacks(execute=True):
        assert budgets.budget_check_alerts(now=now) == []
    assert len(mailoutbox) == 1
    make_task(campaign, task_number=2, started_at=at(2026, 5, 20, 2), cost_usd="45")
    with django_capture_on_commit_callbacks(execute=True):
        created = budgets.budget_check_alerts(now=now)
    assert sorted(float(a.threshold) for a in created) == [0.8, 1.0]
    assert len(mailoutbox) == 3 and BudgetAlert.objects.count() == 3
    status = budgets.budget_status(research, now=now)[0]
    assert status["spent_usd"] == Decimal("105") and len(status["alerts"]) == 3


def test_only_team_leads_and_admins_set_budgets(bootstrap, ops_users):
    research = Team.objects.get(project="research")
    for role in ("viewer", "launcher", "urgent", "other", "nobody"):
        with pytest.raises(PermissionError):
            budgets.budget_set(user=ops_users[role], team=research, period="month", amount_usd=Decimal("1"),
                               thresholds=[1.0], on_exceed="refuse", alert_emails=[])
    assert not Budget.objects.exists()
    budgets.budget_set(user=ops_users["admin"], team=research, period="day", amount_usd=Decimal("1"),
                       thresholds=[1.0], on_exceed="hold", alert_emails=[])
    assert Budget.objects.get().on_exceed == "hold"


def test_a_forecast_says_no_history_when_there_is_none(bootstrap):
    agent = AgentDefinition.objects.get(name="demo-agent")
    result = costs.forecast(agent_definition=agent, count=10)
    assert result["no_history"] and result["cost_usd"] is None and result["tokens"] is None


def test_a_forecast_is_median_tokens_times_count_times_price_with_a_10_90_range(bootstrap, ops_users, settings):
    research = Team.objects.get(project="research")
    agent = AgentDefinition.objects.get(name="demo-agent")
    campaign = make_campaign(team=research, user=ops_users["launcher"], agent=agent)
    for n, (out, cost) in enumerate([(100, "1"), (200, "2"), (300, "3"), (400, "4"), (500, "5"), (600, "6"),
                                     (700, "7"), (800, "8"), (900, "9"), (1000, "10"), (1100, "11")], start=1):
        make_task(campaign, task_number=n, started_at=at(2026, 5, 4, 10), cost_usd=cost, tokens=tokens(out=out))
    make_task(campaign, task_number=99, started_at=at(2026, 5, 4, 10), state="running", tokens=tokens(out=10**6))
    result = costs.forecast(agent_definition=agent, count=10)
    assert result["history"] == 11
    assert result["tokens_per_task"] == {"p10": 200, "p50": 600, "p90": 1000}
    assert result["tokens"] == {"p10": 2000, "p50": 6000, "p90": 10000}
    assert result["priced_by"] == "recorded cost"
    assert result["cost_usd"] == {"p10": Decimal("20.000000"), "p50": Decimal("60.000000"), "p90": Decimal("100.000000")}
    # With a price table, every earlier task is priced at today's price of the chosen model.
    settings.TCO_PRICES = {"m": {"input": 3, "output": 15}}  # USD per million tokens
    priced = costs.forecast(agent_definition=agent, count=10, model="m")
    assert priced["priced_by"] == "price table"
    assert priced["cost_usd"]["p50"] == Decimal("0.090000")  # 600 tokens x 10 x $15/M


# --- issue 11, finding 7 (issue 16, bug 6): another account's qsub -P is never billed to the team ----


def test_a_job_not_launched_by_tco_is_shown_apart_and_not_in_the_teams_total(bootstrap, ops_users):
    research = Team.objects.get(project="research")
    campaign = make_campaign(team=research, user=ops_users["launcher"])
    day = at(2026, 5, 4, 10)
    make_task(campaign, task_number=1, started_at=day, wallclock_s=10, cost_usd="0.5", tokens=tokens(out=5))
    make_task(campaign, task_number=2, started_at=day, wallclock_s=20, cost_usd="0.25", tokens=tokens(out=5))
    # `qsub -P research` by an unrelated account: its record names research's project.
    make_task(None, started_at=day, wallclock_s=1000, project="research")
    result = bills.bill(teams=[research], period="day", first=dt.date(2026, 5, 4), last=dt.date(2026, 5, 4))
    ours = [r for r in result["rows"] if r["launched_by_tco"]]
    theirs = [r for r in result["rows"] if not r["launched_by_tco"]]
    assert [(r["label"], r["tasks"], r["wallclock_s"]) for r in ours] == [("research", 2, 30)]
    assert [(r["team"], r["label"], r["tasks"], r["wallclock_s"]) for r in theirs] == [
        ("research", bills.NOT_TCO, 1, 1000)]
    assert result["totals"]["wallclock_s"] == 30 and result["totals"]["tasks"] == 2
    assert result["not_tco_totals"]["wallclock_s"] == 1000


def test_the_bill_and_the_usage_api_agree_for_the_same_team_and_day(bootstrap, ops_users):
    from rest_framework.test import APIClient

    from dashboards.core.accounts import api_token_rotate

    research = Team.objects.get(project="research")
    campaign = make_campaign(team=research, user=ops_users["launcher"])
    day = at(2026, 5, 4, 10)
    for n in range(1, 4):
        make_task(campaign, task_number=n, started_at=day, wallclock_s=7 * n, cost_usd="0.125",
                  tokens=tokens(inp=n, out=2 * n))
    make_task(None, started_at=day, wallclock_s=500, project="research")  # not tco's
    make_task(campaign, task_number=9, started_at=at(2026, 5, 5, 1), wallclock_s=99)  # the next day
    result = bills.bill(teams=[research], period="day", first=dt.date(2026, 5, 4), last=dt.date(2026, 5, 4))
    page = result["totals"]
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {api_token_rotate(user=ops_users['lead']).key}")
    body = client.get("/api/usage/", {"since": "2026-05-04T00:00:00Z", "until": "2026-05-05T00:00:00Z"}).json()
    [api] = body["teams"]
    # Computed here: 3 tasks, 7+14+21 s, 3 x $0.125, 6 input + 12 output tokens.
    assert (page["tasks"], page["wallclock_s"], page["cost_usd"], page["total_tokens"]) == (3, 42, Decimal("0.375"), 18)
    assert (api["tasks"], api["wallclock_s"], Decimal(api["cost_usd"]), api["tokens"]) == (3, 42, Decimal("0.375"), 18)
    [other] = body["not_launched_by_tco"]
    assert other["wallclock_s"] == 500 == result["not_tco_totals"]["wallclock_s"]


def test_an_unknown_cost_is_never_taken_as_zero_by_a_budget(bootstrap, ops_users):
    research = Team.objects.get(project="research")
    campaign = make_campaign(team=research, user=ops_users["launcher"])
    now = at(2026, 5, 20, 12)
    make_task(campaign, started_at=at(2026, 5, 20, 1), cost_usd="1")
    budgets.budget_set(user=ops_users["lead"], team=research, period="month", amount_usd=Decimal("100"),
                       thresholds=[1.0], on_exceed="refuse", alert_emails=[])
    assert budgets.budget_verdict(research, Decimal("1"), now=now)["action"] == "submit"
    unknown_forecast = budgets.budget_verdict(research, None, now=now)
    assert unknown_forecast["action"] == "refuse" and "unknown cost" in unknown_forecast["message"]
    # A task that used tokens but has no price: the spend is not known either.
    make_task(campaign, task_number=2, started_at=at(2026, 5, 20, 2), cost_usd=None, tokens=tokens(inp=1000))
    verdict = budgets.budget_verdict(research, Decimal("1"), now=now)
    assert verdict["action"] == "refuse" and "1 task(s) of unknown cost" in verdict["message"]
