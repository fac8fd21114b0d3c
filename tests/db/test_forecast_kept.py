"""A campaign keeps its launch forecast and the campaign page sets it beside the outcome; the forecast
widens its ranges when the history does not fit the inputs (dashboards.launch.forecast_record)."""
from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from pathlib import Path

import pytest
from django.utils import timezone

from dashboards.core import enqueue
from dashboards.launch import forecast as launch_forecast
from dashboards.launch import spool
from dashboards.launch.forecast_record import forecast_outcome, forecast_record
from dashboards.launch.service import LaunchRequest, launch
from dashboards.models import AgentDefinition, Campaign, Task, Team
from tests.support.history import make_campaign, make_task

pytestmark = pytest.mark.django_db
UTC = dt.timezone.utc


@pytest.fixture
def sent(monkeypatch):
    calls = []
    monkeypatch.setattr(enqueue, "send", lambda name, *args, **kw: calls.append((name, args)))
    return calls


@pytest.fixture
def history(ops_users):
    """Five finished runs of demo-agent: $1 to $5 and 10 to 50 s, inputs task=1..5 duration_s=1."""
    research = Team.objects.get(project="research")
    done = make_campaign(team=research, user=ops_users["launcher"], name="before", count=5)
    for n in range(1, 6):
        make_task(done, task_number=n, started_at=timezone.now() - dt.timedelta(hours=1), wallclock_s=10 * n,
                  cost_usd=str(n), tokens={"output_tokens": 100})
    path = Path(spool.spool_layout().inputs_path(done.pk))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"task": n, "duration_s": 1}) + "\n" for n in range(1, 6)))
    return research


def _launch(user, team, inputs, name="kept") -> Campaign:
    agent = AgentDefinition.objects.get(name="demo-agent")
    return launch(user=user, request=LaunchRequest(team=team, agent_definition=agent, inputs=inputs, name=name)).campaign


def test_a_launch_keeps_its_forecast_start_finish_and_cost_range(history, ops_users, sent):
    before = timezone.now()
    campaign = _launch(ops_users["launcher"], history, [{"task": n, "duration_s": 1} for n in (1, 2, 3)])
    kept = Campaign.objects.get(pk=campaign.pk).forecast
    # Per task $1..$5: 10th percentile 1.4, median 3, 90th 4.6 (linear between ranks); x 3 tasks.
    assert kept["cost_usd"] == {"p10": "4.200000", "p50": "9.000000", "p90": "13.800000"}
    assert kept["tasks"] == 3 and kept["history_runs"] == 5 and kept["widened"] is None
    # Nothing else waits and nothing limits it below 3 at once: it starts at once and runs one wave
    # of the agent's run time, 30 s median and 46 s at the 90th percentile (10..50 s).
    start = dt.datetime.fromisoformat(kept["start_at"].replace("Z", "+00:00"))
    assert before <= start <= timezone.now()
    finish = {k: dt.datetime.fromisoformat(v.replace("Z", "+00:00")) for k, v in kept["finish_at"].items()}
    assert (finish["p50"] - start).total_seconds() == pytest.approx(30)
    assert (finish["p90"] - start).total_seconds() == pytest.approx(46)
    assert kept["run_s"] == {"p50": 30.0, "p90": 46.0}


def test_the_forecast_widens_when_the_history_does_not_fit_the_inputs(history, ops_users, sent):
    campaign = _launch(ops_users["launcher"], history, [{"task": n, "duration_s": 1.5} for n in (1, 2, 3)])
    kept = Campaign.objects.get(pk=campaign.pk).forecast
    # The history's inputs never had duration_s 1.5 (1.5 times its 1, less than the site's factor 2):
    # 10th percentiles / 2, 90th x 2, medians kept.
    assert kept["cost_usd"] == {"p10": "2.100000", "p50": "9.000000", "p90": "27.600000"}
    assert kept["run_s"] == {"p50": 30.0, "p90": 92.0}
    assert kept["widened"]["factor"] == 2.0 and kept["widened"]["inputs"] == ["duration_s"]
    assert "duration_s" in kept["widened"]["text"]


def test_an_input_far_beyond_the_history_widens_the_range_as_far(history, ops_users, sent):
    """The users' day (issue 24): a campaign whose input was 6 times the history's ran about 6 times as
    long and finished past a range only twice as wide, which had itself warned that the history did not
    fit. The range now widens by how far the input lies beyond the history's values."""
    campaign = _launch(ops_users["launcher"], history, [{"task": n, "duration_s": 6} for n in (1, 2, 3)])
    kept = Campaign.objects.get(pk=campaign.pk).forecast
    # duration_s 6 against the history's 1: six times; the 90th percentile run time 46 s x 6, cost $13.80 x 6.
    assert kept["widened"]["factor"] == 6.0 and kept["widened"]["inputs"] == ["duration_s"]
    assert "up to 6 times beyond the history's values" in kept["widened"]["text"]
    assert kept["run_s"] == {"p50": 30.0, "p90": 276.0}
    assert kept["cost_usd"] == {"p10": "0.700000", "p50": "9.000000", "p90": "82.800000"}
    # Runs 6 times the history's (60 to 300 s, median 180 s, one wave of 3): the median one ends inside
    # the range it kept, where the old range (90th percentile 92 s) had it 88 s late.
    start = dt.datetime.fromisoformat(kept["start_at"].replace("Z", "+00:00"))
    p90 = dt.datetime.fromisoformat(kept["finish_at"]["p90"].replace("Z", "+00:00"))
    assert start + dt.timedelta(seconds=6 * 30) <= p90


def test_widening_keeps_medians_and_leaves_a_fitting_history_alone(settings):
    forecast = {"no_history": False, "duration_s": {"p10": 10.0, "p50": 20.0, "p90": 40.0},
                "tokens": {"p10": 100, "p50": 200, "p90": 300}, "tokens_per_task": {"p10": 10, "p50": 20, "p90": 30},
                "cost_usd": {"p10": Decimal("1.000000"), "p50": Decimal("2.000000"), "p90": Decimal("3.000000")},
                "cost_per_task": None}
    same, none = launch_forecast.widen_for_misfit(forecast, {"differs": []})
    assert same is forecast and none is None
    settings.TCO_FORECAST_MISFIT_FACTOR = 3
    wide, note = launch_forecast.widen_for_misfit(forecast, {"differs": [{"name": "size"}]})
    assert wide["duration_s"] == {"p10": 10 / 3, "p50": 20.0, "p90": 120.0}
    assert wide["tokens"] == {"p10": 33, "p50": 200, "p90": 900}
    assert wide["cost_usd"] == {"p10": Decimal("0.333333"), "p50": Decimal("2.000000"), "p90": Decimal("9.000000")}
    assert wide["cost_per_task"] is None and note["factor"] == 3.0
    assert forecast["duration_s"]["p90"] == 40.0  # the original is not changed


def _kept(campaign: Campaign, start: dt.datetime, *, p50: float, p90: float, cost=("1", "2", "3")) -> None:
    preview = {"count": campaign.task_count, "forecast": {"history": 4, "priced_by": "recorded cost",
                                                          "cost_usd": dict(zip(("p10", "p50", "p90"),
                                                                               map(Decimal, cost)))},
               "timing": {"start_at": start, "finish_at": {"p50": start + dt.timedelta(seconds=p50),
                                                          "p90": start + dt.timedelta(seconds=p90)},
                          "run_s": {"p50": p50, "p90": p90}, "at_once": 2, "limits": [{"what": "2 tasks", "tasks": 2}]},
               "widened": None}
    Campaign.objects.filter(pk=campaign.pk).update(forecast=forecast_record(preview, at=start))
    campaign.refresh_from_db()


def test_the_outcome_says_a_finish_past_the_worst_case_and_a_cost_inside_the_range(ops_users):
    t0 = dt.datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    campaign = make_campaign(team=Team.objects.get(project="research"), user=ops_users["launcher"], count=2)
    _kept(campaign, t0 + dt.timedelta(seconds=2), p50=60, p90=100)
    make_task(campaign, task_number=1, started_at=t0 + dt.timedelta(seconds=10), wallclock_s=50, cost_usd="1.25")
    make_task(campaign, task_number=2, started_at=t0 + dt.timedelta(seconds=6), wallclock_s=100, cost_usd="0.5")
    Campaign.objects.filter(pk=campaign.pk).update(finished_at=t0 + dt.timedelta(seconds=110))
    campaign.refresh_from_db()
    rows = {r["what"]: r for r in forecast_outcome(campaign)["rows"]}
    # The first task started 4 s after the forecast's start: within the 5 s a start "at once" takes.
    assert rows["start"]["actual"] == t0 + dt.timedelta(seconds=6)
    assert rows["start"]["verdict"] == "within the forecast" and rows["start"]["ok"] is True
    Task.objects.filter(campaign=campaign, task_number=2).update(started_at=t0 + dt.timedelta(seconds=12))
    rows = {r["what"]: r for r in forecast_outcome(campaign)["rows"]}
    # Now the first started at +10 s: 8 s after the forecast's start.
    assert rows["start"]["verdict"] == "8 s after the forecast" and rows["start"]["ok"] is False
    # Finished at +110 s; the worst case was +2 + 100 = +102 s: 8 s past it.
    assert rows["finish"]["verdict"] == "8 s after the forecast's latest" and rows["finish"]["ok"] is False
    # $1.75 is inside $1..$3.
    assert rows["cost"]["actual"] == Decimal("1.75") and rows["cost"]["ok"] is True
    assert rows["cost"]["verdict"] == "within the forecast"


def test_the_outcome_of_a_campaign_still_running_is_not_judged_early(ops_users):
    t0 = timezone.now() - dt.timedelta(seconds=30)
    campaign = make_campaign(team=Team.objects.get(project="research"), user=ops_users["launcher"], count=2,
                             status="running")
    _kept(campaign, t0, p50=60, p90=100, cost=("1", "2", "3"))
    make_task(campaign, task_number=1, started_at=t0, wallclock_s=10, cost_usd="4")
    make_task(campaign, task_number=2, started_at=t0, state="running", account=False)
    rows = {r["what"]: r for r in forecast_outcome(campaign)["rows"]}
    assert rows["start"]["verdict"] == "within the forecast"
    assert rows["finish"]["verdict"] == "running" and rows["finish"]["ok"] is None
    # Already over the highest: $4 - $3.
    assert rows["cost"]["verdict"] == "$1.0000 over the forecast's highest" and rows["cost"]["ok"] is False
    assert forecast_outcome(make_campaign(team=campaign.team, user=ops_users["launcher"], name="old")) is None


def test_a_late_running_campaign_marks_how_long_past_its_forecast_for_the_page_to_keep_moving(ops_users):
    """A campaign past its forecast's latest finish says by how much as of now; on a quiet campaign no
    snapshot comes to say it again, so the row carries the instant that count starts from and the page's
    clock moves it (static/js/clock.js, format "span")."""
    from dashboards.launch.forecast_record import outcome_view

    t0 = timezone.now() - dt.timedelta(minutes=20)
    campaign = make_campaign(team=Team.objects.get(project="research"), user=ops_users["launcher"], count=1,
                             status="running")
    _kept(campaign, t0, p50=60, p90=100)
    latest = t0 + dt.timedelta(seconds=100)  # the forecast's 90th percentile finish
    now = latest + dt.timedelta(seconds=725)
    rows = {r["what"]: r for r in forecast_outcome(campaign, now=now)["rows"]}
    assert rows["finish"]["verdict"] == "running, 12 min 05 s past the forecast's latest"
    assert rows["finish"]["relative"] == {"at": latest.timestamp(), "text": "12 min 05 s", "format": "span"}
    assert rows["start"]["verdict"].startswith("not started, ") and rows["start"]["relative"]["format"] == "span"
    assert "relative" not in rows["cost"]
    view = {r["what"]: r for r in outcome_view(forecast_outcome(campaign, now=now))["rows"]}
    assert view["finish"]["relative"] == rows["finish"]["relative"] and "relative" not in view["cost"]


def _initial(html: str) -> dict:
    """The campaign page's first snapshot (the json_script ``initial-campaign`` the page draws from)."""
    return json.loads(html.split('<script id="initial-campaign" type="application/json">', 1)[1].split("</script>", 1)[0])


def test_the_campaign_page_shows_the_forecast_beside_the_outcome(client, ops_users):
    t0 = dt.datetime(2026, 6, 1, 12, 0, tzinfo=UTC)
    campaign = make_campaign(team=Team.objects.get(project="research"), user=ops_users["launcher"], count=1)
    _kept(campaign, t0, p50=60, p90=100)
    make_task(campaign, task_number=1, started_at=t0, wallclock_s=50, cost_usd="2")
    Campaign.objects.filter(pk=campaign.pk).update(finished_at=t0 + dt.timedelta(seconds=50))
    client.force_login(ops_users["viewer"])
    html = client.get(f"/campaigns/{campaign.pk}/").content.decode()
    assert '<section class="card" id="forecast-outcome">' in html  # shown: the campaign kept its forecast
    outcome = _initial(html)["outcome"]
    rows = {r["what"]: r for r in outcome["rows"]}
    assert rows["finish"]["forecast"] == "2026-06-01 12:01:00 UTC (median), by 12:01:40 UTC (90th percentile)"
    assert rows["finish"]["outcome"] == "2026-06-01 12:00:50 UTC" and rows["finish"]["verdict"] == "by the median"
    assert rows["cost"]["forecast"] == "$1.00 to $3.00 (median $2.00)" and rows["cost"]["outcome"] == "$2.00"
    assert outcome["note"] == ("The forecast at launch (2026-06-01 12:00:00 UTC, from 4 earlier runs; 2 at once, "
                               "limited by 2 tasks) beside what happened.")
    assert Task.objects.filter(campaign=campaign).count() == 1
    # A campaign that kept no forecast has the card hidden and no outcome.
    old = make_campaign(team=campaign.team, user=ops_users["launcher"], name="old", count=1)
    html = client.get(f"/campaigns/{old.pk}/").content.decode()
    assert _initial(html)["outcome"] is None
    assert '<section class="card" id="forecast-outcome" hidden>' in html


def test_the_live_campaign_view_carries_the_outcome_as_it_comes(ops_users):
    """The card is drawn from each of the campaign view's snapshots: a finish and a cost that come after
    the last task's state changed (the job leaving qstat, its runner record's usage) are in the next
    snapshot, whose counts are the same as before (a card that followed the counts stayed "running")."""
    from dashboards.ingest.campaign_status import finish_campaigns
    from dashboards.live import snapshots

    t0 = timezone.now() - dt.timedelta(seconds=30)
    campaign = make_campaign(team=Team.objects.get(project="research"), user=ops_users["launcher"], count=1,
                             status="running")
    _kept(campaign, t0, p50=60, p90=100)
    task = make_task(campaign, task_number=1, started_at=t0 + dt.timedelta(seconds=1), wallclock_s=20,
                     tokens={"output_tokens": 50})
    Task.objects.filter(pk=task.pk).update(active=True)  # ended, still in qstat: the campaign runs
    view = snapshots.campaign_view(campaign.pk)

    def snapshot() -> dict:
        data = snapshots.build(view)
        json.dumps(data)  # JSON-ready, as the producer sends it
        return data

    before = snapshot()
    rows = {r["what"]: r for r in before["outcome"]["rows"]}
    assert rows["finish"]["verdict"] == "running" and rows["finish"]["outcome"] == "–"
    assert rows["cost"]["outcome"] == "$0.00"
    assert rows["cost"]["verdict"] == "so far within the forecast; 1 task unpriced: at least this much"
    assert before["outcome"]["note"].endswith("beside what happened so far (1 of 1 ended).")

    Task.objects.filter(pk=task.pk).update(active=False)   # the job left qstat
    finish_campaigns({campaign.pk})
    Task.objects.filter(pk=task.pk).update(cost_usd=Decimal("1.5"))   # its usage, priced
    after = snapshot()
    assert after["states"] == before["states"]
    finished_at = Campaign.objects.get(pk=campaign.pk).finished_at
    rows = {r["what"]: r for r in after["outcome"]["rows"]}
    assert rows["finish"]["outcome"] == finished_at.strftime("%Y-%m-%d %H:%M:%S UTC")
    assert rows["finish"]["verdict"] == "by the median" and rows["finish"]["ok"] is True  # 30 s against 60 s
    assert rows["cost"]["outcome"] == "$1.50" and rows["cost"]["verdict"] == "within the forecast"
    assert after["outcome"]["finished"] is True and after["outcome"]["note"].endswith("beside what happened.")
    # The page reads the same from the database when the live store has no snapshot.
    from dashboards.launch.forecast_record import outcome_view
    assert outcome_view(forecast_outcome(Campaign.objects.get(pk=campaign.pk))) == after["outcome"]


def test_the_launch_page_says_its_ranges_are_widened(history, ops_users, client):
    from tests.support.forms import launch_data

    client.force_login(ops_users["launcher"])
    html = client.post("/ops/launch/", {**launch_data(input_params="task=1..3 duration_s=60"),
                                        "preview": "1"}).content.decode()
    note = html.split('id="forecast-misfit"', 1)[1].split("</p>", 1)[0]
    # duration_s 60 against the history's 1: the ranges 60 times wider, not the site's factor 2.
    assert "duration_s" in note and "60 times wider" in note
    # Per task $1..$5 x 3 tasks: 10th percentile $4.20 / 60, 90th $13.80 x 60.
    cost = html.split('id="forecast-cost"', 1)[1].split("</tr>", 1)[0]
    assert "$0.07" in cost and "$828.00" in cost


def _ran(team, user, name: str, inputs: list[dict], agent: str = "demo-agent") -> Campaign:
    """A finished campaign of ``agent`` with these inputs, as its spool keeps them."""
    done = make_campaign(team=team, user=user, name=name, count=len(inputs),
                         agent=AgentDefinition.objects.get(name=agent))
    for n in range(1, len(inputs) + 1):
        make_task(done, task_number=n, started_at=timezone.now() - dt.timedelta(hours=1), wallclock_s=5 + n % 10,
                  cost_usd="0.01", tokens={"output_tokens": 10})
    path = Path(spool.spool_layout().inputs_path(done.pk))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(item) + "\n" for item in inputs))
    return done


def test_the_launch_forms_example_fits_the_demos_history(ops_users, client):
    """The example the form offers (inputs.INPUT_EXAMPLES) against the history `make demo` leaves
    (tco_demo_campaign's 60 tasks, 3 to 15 s each): duration_s=5 lies inside the history's 3.x to 14.x s,
    which a value-by-value match called a misfit ("5 here, 3.1, 3.3, 3.4 in the history") and widened
    the ranges for. A number outside the span, or a value the history never had, still warns; the task's
    own number does not (a longer campaign is no misfit)."""
    from dashboards.launch.inputs import input_example
    from demo.management.commands.tco_demo_campaign import demo_inputs
    from tests.support.forms import launch_data

    research = Team.objects.get(project="research")
    demo = demo_inputs(60)
    durations = sorted(item["duration_s"] for item in demo)
    # 5 lies inside; as JSON text ("5") it is none of the history's values ("5.0" is one of them).
    assert 3 <= durations[0] < 5 < durations[-1] <= 15 and json.dumps(5) not in {json.dumps(d) for d in durations}
    _ran(research, ops_users["admin"], "demo", demo)
    client.force_login(ops_users["launcher"])

    def misfit(params: str) -> str | None:
        html = client.post("/ops/launch/", {**launch_data(input_params=params), "preview": "1"}).content.decode()
        assert 'id="forecast-basis"' in html, html[:2000]
        if 'id="forecast-misfit"' not in html:
            return None
        return " ".join(html.split('id="forecast-misfit"', 1)[1].split("</p>", 1)[0].split())

    example = input_example("demo-agent")
    assert example == "task=1..20 duration_s=5"
    assert misfit(example) is None
    assert misfit("task=1..100 duration_s=5") is None   # the task's number names it, it is no work
    assert misfit("task=1..3 duration_s=12.5") is None
    low, high = f"{durations[0]:g}", f"{durations[-1]:g}"
    assert f"<code>duration_s</code> is 60 here, {low} to {high} in the history" in misfit("task=1..3 duration_s=60")
    assert f"<code>duration_s</code> is 1 to 60 here, {low} to {high}" in misfit("task=1 duration_s=1\ntask=2 duration_s=60")
    assert "<code>fail</code> is true here, not in the history's inputs" in misfit("task=1 duration_s=5 fail=true")


def test_the_review_agents_example_fits_a_history_of_other_runs(ops_users, client):
    """Each sweep reviewed brings new run files: a new run_output is no misfit (inputs.INPUT_IDENTIFIERS),
    a model the history never asked is."""
    from dashboards.launch import forecast as launch_forecast
    from dashboards.launch.inputs import input_example, inputs_from_params

    from demo.sweep import DEFAULT_MODEL, review_agent_definition

    review_agent_definition()
    engineering = Team.objects.get(project="engineering")
    # As demo.sweep.sweep_review_launch launches them: every other review streams.
    _ran(engineering, ops_users["other"], "review", [
        {"sweep_task": n, "run_output": f"/srv/sweeps/7/run-{n}.txt", "model": DEFAULT_MODEL, "stream": n % 2 == 0}
        for n in range(1, 9)], agent="sweep-review")
    agent = AgentDefinition.objects.get(name="sweep-review")
    forecast = {"history": 8, "duration_s": {"p10": 5.0, "p50": 8.0, "p90": 14.0}}

    def differs(params: str) -> list[dict]:
        return launch_forecast.history_basis(agent_definition=agent, inputs=inputs_from_params(params),
                                             forecast=forecast, user=ops_users["other"])["differs"]

    assert differs(input_example("sweep-review")) == []
    assert differs("sweep_task=12 run_output=/srv/sweeps/8/run-12.txt") == []
    assert differs("sweep_task=1 run_output=/x model=other") == [
        {"name": "model", "now": ['"other"'], "history": [json.dumps(DEFAULT_MODEL)], "ratio": None}]


def test_a_hostile_launchers_inputs_against_the_history_say_nothing_raw_and_submit_nothing(ops_users, client):
    """The fit check compares a launcher's input values with the history's (cb33089): values meant to break
    it (markup, a number out of float range, NaN, a 300-digit number, a 5,000-character text) give a
    preview whose misfit note is escaped and bounded, and a preview launches nothing."""
    from demo.management.commands.tco_demo_campaign import demo_inputs
    from tests.support.forms import launch_data

    research = Team.objects.get(project="research")
    _ran(research, ops_users["admin"], "demo", demo_inputs(20))
    client.force_login(ops_users["launcher"])
    hostile = ("task=1 duration_s=5 note=<script>alert(1)</script>\n"
               "task=2 duration_s=5 big=1e999\n"
               "task=3 duration_s=5 big=NaN\n"
               f"task=4 duration_s=5 big={'9' * 300}\n"
               f"task=5 duration_s=5 mode={'x' * 5000}")
    before = Campaign.objects.count()
    response = client.post("/ops/launch/", {**launch_data(input_params=hostile), "preview": "1"})
    html = response.content.decode()
    assert response.status_code == 200 and 'class="error field-error"' not in html
    note = html.split('id="forecast-misfit"', 1)[1].split("</p>", 1)[0]
    assert "<script>" not in note and "&lt;script&gt;" in note   # said, escaped
    assert "x" * 201 not in note and len(note) < 3000             # each value cut, the note bounded
    assert "<script>alert(1)</script>" not in html.split("</textarea>", 1)[1]
    assert Campaign.objects.count() == before
