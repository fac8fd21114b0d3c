"""Waste on the bill (dashboards.billing.waste): failed tasks, failed verdicts, retries, idle model seats.

Every expected figure below is worked out by hand from the tasks and requests the test builds.
"""
from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest

from dashboards.billing import bills, waste
from dashboards.core import rollups
from dashboards.models import AccountingRecord, Campaign, ModelRequest, Team
from tests.support.history import make_campaign, make_task

pytestmark = pytest.mark.django_db

UTC = dt.timezone.utc
T0 = dt.datetime(2026, 5, 4, 10, 0, tzinfo=UTC)
DAY = dt.date(2026, 5, 4)


def s(seconds: float) -> dt.datetime:
    return T0 + dt.timedelta(seconds=seconds)


def request(task, seq: int, start: float, seconds: float) -> None:
    ModelRequest.objects.create(task=task, seq=seq, at=s(start), method="POST", path="/v1/messages", status=200,
                                latency_ms=seconds * 1000)


def earlier_attempt(task, start: float, wall: float) -> None:
    """An accounting record of an attempt before the task's last (a rerun on another host), stored
    as ingest stores one: into the usage and waste rollups."""
    with rollups.tasks_rolled([task.id], usage=False):
        record = AccountingRecord.objects.create(
            cluster=task.cluster, task=task, job_number=task.job_number, task_number=task.task_number,
            submission_us=int(task.submitted_at.timestamp()) * 1_000_000,
            start_us=int(s(start).timestamp()) * 1_000_000, end_us=int(s(start + wall).timestamp()) * 1_000_000,
            submitted_at=task.submitted_at, started_at=s(start), ended_at=s(start + wall), job_name="x", owner="tco",
            group="tco", project=task.project, queue="agent.q",
            hostname="lost-host", slots=1, wallclock_s=wall, cpu_s=0.0, maxvmem_bytes=0.0, failed=0, exit_status=0)
        rollups.records_added([record.id])


def set_verdict(task, verdict: str) -> None:
    """The runner record's verdict, as ingest writes it (the rollups follow)."""
    with rollups.tasks_rolled([task.id]):
        task.verdict = verdict
        task.save(update_fields=["verdict"])


@pytest.fixture
def campaigns(bootstrap, ops_users):
    research = Team.objects.get(project="research")
    engineering = Team.objects.get(project="engineering")
    a = make_campaign(team=research, user=ops_users["launcher"], name="sweep")
    Campaign.objects.filter(pk=a.pk).update(seats_per_task=2)
    a.refresh_from_db()
    t1 = make_task(a, task_number=1, started_at=s(0), wallclock_s=100, cost_usd="1.00", tokens={"output_tokens": 9})
    set_verdict(t1, "ok")
    request(t1, 1, 10, 20)
    request(t1, 2, 20, 20)   # overlaps the first: [10, 40] is 30 s in calls
    request(t1, 3, 86, 10)   # [86, 96]: 10 s more
    t2 = make_task(a, task_number=2, started_at=s(50), wallclock_s=50, state="failed", cost_usd="0.50",
                   tokens={"output_tokens": 5})
    request(t2, 1, 55, 30)   # [55, 85]
    t3 = make_task(a, task_number=3, started_at=s(100), wallclock_s=40, slots=2, cost_usd="0.25",
                   tokens={"output_tokens": 3})
    set_verdict(t3, "FAIL")
    request(t3, 1, 100, 40)  # [100, 140]
    t4 = make_task(a, task_number=4, started_at=s(200), wallclock_s=10, cost_usd=None, tokens={"output_tokens": 7})
    earlier_attempt(t4, 150, 20)
    b = make_campaign(team=research, user=ops_users["launcher"], name="sweep-retry")
    Campaign.objects.filter(pk=b.pk).update(retry_of=a)
    b.refresh_from_db()
    b1 = make_task(b, task_number=1, started_at=s(300), wallclock_s=30, cost_usd="0.30", tokens={"output_tokens": 1})
    request(b1, 1, 300, 10)
    make_task(b, task_number=2, started_at=s(330), wallclock_s=5, state="failed", cost_usd="0.10",
              tokens={"output_tokens": 1})
    # Not in research's view of May 4th: another team's campaign, and a task of the next day.
    c = make_campaign(team=engineering, user=ops_users["other"], name="other-team")
    make_task(c, task_number=1, started_at=s(0), wallclock_s=500, state="failed", cost_usd="9")
    make_task(a, task_number=5, started_at=s(86400), wallclock_s=70, state="failed", cost_usd="3")
    return {"research": research, "a": a, "b": b, "c": c, "t4": t4}


def test_failed_tasks_failed_verdicts_and_retries_are_counted_apart_per_campaign(campaigns):
    result = waste.waste(teams=[campaigns["research"]], first=DAY, last=DAY)
    rows = {r["campaign_id"]: r for r in result["rows"]}
    assert set(rows) == {campaigns["a"].pk, campaigns["b"].pk}
    a, b = rows[campaigns["a"].pk], rows[campaigns["b"].pk]
    # Campaign a: 4 tasks, $1.75 priced (+1 unpriced); slot-seconds 100 + 50 + 40 x 2 + 20 + 10 = 260.
    assert a["spent"] == {"tasks": 4, "cost_usd": Decimal("1.75"), "unpriced": 1, "slot_s": 260.0,
                          "slot_hours": 260 / 3600, "attempts": 0}
    assert (a["failed"]["tasks"], a["failed"]["cost_usd"], a["failed"]["slot_s"]) == (1, Decimal("0.50"), 50.0)
    assert (a["verdict_failed"]["tasks"], a["verdict_failed"]["cost_usd"], a["verdict_failed"]["slot_s"]) == (
        1, Decimal("0.25"), 80.0)
    # Retries of a: no retry campaign, one earlier attempt of task 4 (20 s, no dollars).
    assert (a["retries"]["tasks"], a["retries"]["cost_usd"], a["retries"]["slot_s"], a["retries"]["attempts"]) == (
        0, Decimal(0), 20.0, 1)
    # Wasted: failed + verdict failed + task 4's earlier attempt = $0.75 and 50 + 80 + 20 slot-seconds.
    assert (a["wasted"]["tasks"], a["wasted"]["cost_usd"], a["wasted"]["slot_s"], a["wasted"]["attempts"]) == (
        2, Decimal("0.75"), 150.0, 1)
    assert a["wasted_share"] == Decimal("0.75") / Decimal("1.75")
    # Campaign b retries a: both its tasks are retries ($0.40, 35 slot-seconds); the failed one is wasted.
    assert (b["retries"]["tasks"], b["retries"]["cost_usd"], b["retries"]["slot_s"]) == (2, Decimal("0.40"), 35.0)
    assert (b["wasted"]["tasks"], b["wasted"]["cost_usd"], b["wasted"]["slot_s"]) == (1, Decimal("0.10"), 5.0)
    assert b["retry_of"] == campaigns["a"].pk
    # The team row and the totals add the campaigns; the other team and the next day are not in them.
    (team,) = result["teams"]
    assert team["team"] == "research"
    assert (team["spent"]["cost_usd"], team["wasted"]["cost_usd"], team["wasted"]["slot_s"]) == (
        Decimal("2.15"), Decimal("0.85"), 155.0)
    assert result["totals"]["failed"]["tasks"] == 2 and result["totals"]["failed"]["cost_usd"] == Decimal("0.60")
    # Most wasted dollars first within the team.
    assert [r["campaign_id"] for r in result["rows"]] == [campaigns["a"].pk, campaigns["b"].pk]


def test_model_seats_held_against_seconds_in_calls_give_the_consumable_sizing(campaigns):
    result = waste.waste(teams=[campaigns["research"]], first=DAY, last=DAY)
    rows = {r["campaign_id"]: r for r in result["rows"]}
    seat = rows[campaigns["a"].pk]["seat"]
    # Held: (100 + 50 + 40 + 20 + 10) s x 2 seats = 440 seat-seconds; at most tasks 1 and 2 at once: 4 seats.
    assert seat["held_s"] == 440.0 and seat["peak_held"] == 4
    # In calls: task 1 [10, 40] + [86, 96] = 40 s, task 2 [55, 85] = 30 s, task 3 [100, 140] = 40 s; x 2 seats.
    assert seat["in_calls_s"] == pytest.approx(220.0)
    assert seat["utilization"] == pytest.approx(0.5)
    assert seat["requests"] == 5 and seat["tasks"] == 4 and not seat["partial"]
    # Never two tasks in a call at once: 2 seats; with 15 % headroom ceil(2.3) = 3.
    assert seat["peak_in_calls"] == 2 and seat["suggested"] == 3
    assert seat["text"] == "4 seats held, at most 2 in calls at once: 3 would have done"
    b = rows[campaigns["b"].pk]["seat"]
    assert (b["held_s"], b["in_calls_s"], b["peak_held"], b["peak_in_calls"], b["suggested"]) == (35.0, 10.0, 1, 1, 2)
    assert b["text"] == "1 seat held, at most 1 in calls at once: about right"
    team = result["teams"][0]["seat"]
    assert team["held_s"] == 475.0 and team["in_calls_s"] == pytest.approx(230.0)
    assert (team["peak_held"], team["peak_in_calls"]) == (4, 2)  # b ran after a ended


def test_the_in_call_peak_counts_tasks_at_once_not_overlapping_requests_of_one_task():
    # Task x: two overlapping requests; task y one request overlapping both; weights are seats per task.
    calls = [(a, b, 3) for a, b in waste.merged([(0, 10), (5, 12)])] + [(11, 20, 3)]
    assert waste.merged([(0, 10), (5, 12), (20, 21)]) == [(0, 12), (20, 21)]
    assert waste.peak(calls) == 6
    assert waste.peak([(0, 10, 1), (10, 20, 1)]) == 1  # one ends as the other starts
    assert waste.peak([]) == 0
    assert waste.sizing_text(96, 41, 48) == "96 seats held, at most 41 in calls at once: 48 would have done"


def test_failing_verdicts_and_headroom_follow_the_settings(campaigns, settings):
    settings.TCO_FAILING_VERDICTS = ["ok"]
    settings.TCO_SEAT_HEADROOM = 0.5
    result = waste.waste(teams=[campaigns["research"]], first=DAY, last=DAY, campaign=campaigns["a"].pk)
    (a,) = result["rows"]
    assert (a["verdict_failed"]["tasks"], a["verdict_failed"]["cost_usd"]) == (1, Decimal("1.00"))  # task 1's "ok"
    assert a["seat"]["suggested"] == 3  # ceil(2 x 1.5)


def test_a_task_whose_requests_were_not_all_kept_makes_the_in_call_figures_a_lower_bound(campaigns):
    task = campaigns["t4"]
    task.usage_flags = ["requests_not_kept"]
    task.save(update_fields=["usage_flags"])
    result = waste.waste(teams=[campaigns["research"]], first=DAY, last=DAY, campaign=campaigns["a"].pk)
    assert result["rows"][0]["seat"]["partial"] is True


def test_without_seats_no_request_is_read_and_a_bad_range_is_refused(campaigns):
    result = waste.waste(teams=[campaigns["research"]], first=DAY, last=DAY, seats=False)
    assert all(r["seat"] is None for r in result["rows"])
    from dashboards.core.errors import BillError

    with pytest.raises(BillError):
        waste.waste(teams=[campaigns["research"]], first=DAY, last=DAY - dt.timedelta(days=1))


def test_a_range_with_more_tasks_than_the_seat_limit_leaves_out_the_seat_figures_only(campaigns):
    research = [campaigns["research"]]
    full = waste.waste(teams=research, first=DAY, last=DAY)
    started = full["totals"]["spent"]["tasks"]
    assert started >= 4 and full["seats_skipped"] == 0 and full["totals"]["seat"]["held_s"] > 0
    limited = waste.waste(teams=research, first=DAY, last=DAY, seat_limit=started - 1)
    assert limited["seats_skipped"] == started
    assert all(r["seat"] is None for r in limited["rows"]) and limited["totals"]["seat"] is None
    assert [(r["campaign_id"], r["wasted"], r["failed"], r["retries"]) for r in limited["rows"]] == [
        (r["campaign_id"], r["wasted"], r["failed"], r["retries"]) for r in full["rows"]]
    at_limit = waste.waste(teams=research, first=DAY, last=DAY, seat_limit=started)
    assert at_limit["seats_skipped"] == 0 and at_limit["totals"]["seat"] == full["totals"]["seat"]


# --------------------------------------------------------------------------- the page

@pytest.fixture
def as_user(client, ops_users):
    def login(name):
        client.force_login(ops_users[name])
        return client
    return login


def _cell(html: str, campaign_id: int, column: str) -> str:
    row = html.split(f'data-campaign="{campaign_id}"', 1)[1].split("</tr>", 1)[0]
    return row.split(f'data-col="{column}"', 1)[1].split("</td>", 1)[0]


def test_the_waste_page_shows_each_campaigns_figures_to_leads_only(campaigns, as_user):
    query = {"first": "2026-05-04", "last": "2026-05-04"}
    for name in ("viewer", "launcher", "other", "nobody"):
        assert as_user(name).get("/ops/waste/", query).status_code == 403, name
    html = as_user("lead").get("/ops/waste/", query).content.decode()
    a, b = campaigns["a"].pk, campaigns["b"].pk
    assert "$0.75" in _cell(html, a, "wasted") and "43%" in _cell(html, a, "wasted")  # 0.75 / 1.75
    assert "$0.50" in _cell(html, a, "failed") and "1 task " in _cell(html, a, "failed")
    assert "$0.25" in _cell(html, a, "verdict_failed")
    assert "$0.40" in _cell(html, b, "retries") and "retry of #%d" % a in html
    # 440 seat-seconds held (under an hour: in seconds); 220 in calls (50 %); the sizing in words.
    seats = html.split('id="seat-table"', 1)[1]
    assert "440 seat-s" in _cell(seats, a, "held") and "220 seat-s" in _cell(seats, a, "in_calls")
    assert "50%" in _cell(seats, a, "in_calls")
    assert "4 seats held, at most 2 in calls at once: 3 would have done" in _cell(seats, a, "sizing")
    assert "other-team" not in html  # engineering's campaign
    assert f'href="/campaigns/{a}/?sort=cost&amp;dir=desc"' in html
    assert 'id="seats-skipped"' not in html


def test_the_waste_page_says_when_it_leaves_the_seat_figures_out(campaigns, as_user, settings):
    settings.TCO_WASTE_SEAT_TASKS = 2
    html = as_user("lead").get("/ops/waste/", {"first": "2026-05-04", "last": "2026-05-04"}).content.decode()
    note = html.split('id="seats-skipped"', 1)[1].split("</p>", 1)[0]
    started = waste.waste(teams=[campaigns["research"]], first=DAY, last=DAY)["totals"]["spent"]["tasks"]
    assert f"{started} started (more than 2)" in note and 'id="seat-table"' not in html
    assert "$0.75" in _cell(html, campaigns["a"].pk, "wasted")  # the rest of the page as before


def test_the_bill_says_what_was_wasted_and_links_the_waste_view_and_tasks_by_cost(campaigns, as_user):
    query = {"period": "day", "first": "2026-05-04", "last": "2026-05-04", "group_by": "campaign"}
    html = as_user("lead").get("/ops/bills/", query).content.decode()
    kpi = html.split('id="kpi-wasted"', 1)[1].split("</div>", 1)[0]
    assert "$0.85" in kpi  # a's $0.75 + b's failed $0.10
    assert 'href="/ops/waste/?first=2026-05-04&amp;last=2026-05-04"' in kpi
    a = campaigns["a"].pk
    assert f'href="/campaigns/{a}/?sort=cost&amp;dir=desc" class="campaign-page"' in html
    assert f"/ops/campaigns/{a}/" not in html


def test_a_bill_of_more_tasks_than_the_limit_links_the_waste_view_without_adding_it_up(campaigns, as_user,
                                                                                       settings):
    query = {"period": "day", "first": "2026-05-04", "last": "2026-05-04", "group_by": "campaign"}
    bill = bills.bill(teams=[campaigns["research"]], period="day", first=DAY, last=DAY)
    counted = bill["totals"]["tasks"] + bill["not_tco_totals"]["tasks"]
    settings.TCO_BILL_WASTE_TASKS = counted
    kpi = as_user("lead").get("/ops/bills/", query).content.decode().split('id="kpi-wasted"', 1)[1]
    assert "$0.85" in kpi.split("</div>", 1)[0]
    settings.TCO_BILL_WASTE_TASKS = counted - 1
    kpi = as_user("lead").get("/ops/bills/", query).content.decode().split('id="kpi-wasted"', 1)[1]
    kpi = kpi.split("</div>", 1)[0]
    assert "$" not in kpi and "Too many tasks" in kpi
    assert 'href="/ops/waste/?first=2026-05-04&amp;last=2026-05-04"' in kpi


def test_the_waste_view_exports_its_campaign_rows_as_csv(campaigns, as_user):
    import csv
    import io

    response = as_user("lead").get("/ops/waste/", {"first": "2026-05-04", "last": "2026-05-04", "format": "csv"})
    body = b"".join(response.streaming_content) if response.streaming else response.content
    rows = list(csv.DictReader(io.StringIO(body.decode())))
    a = next(r for r in rows if r["campaign_id"] == str(campaigns["a"].pk))
    assert (a["wasted_cost_usd"], a["wasted_slot_s"], a["earlier_attempts"]) == ("0.75", "150.000", "1")
    assert (a["seat_held_s"], a["seat_in_calls_s"], a["seat_suggested"]) == ("440.000", "220.000", "3")
    assert len(rows) == 2


def test_a_review_agents_bad_verdict_is_its_finding_not_a_failure(campaigns):
    task = campaigns["t4"]
    set_verdict(task, "bad")
    result = waste.waste(teams=[campaigns["research"]], first=DAY, last=DAY, campaign=campaigns["a"].pk)
    assert result["rows"][0]["verdict_failed"]["tasks"] == 1  # task 3's "FAIL" only
    assert "bad" not in result["failing_verdicts"]


def test_slot_and_seat_time_read_in_seconds_under_an_hour_and_in_hours_from_one():
    from dashboards.templatetags.ops import hours

    assert (hours(0, "slot"), hours(0.4, "seat"), hours(120, "slot"), hours(3599, "slot")) == (
        "0 slot-h", "< 1 seat-s", "120 slot-s", "3,599 slot-s")
    assert (hours(3600, "slot"), hours(9000, "seat"), hours(None)) == ("1.00 slot-h", "2.50 seat-h", "")
