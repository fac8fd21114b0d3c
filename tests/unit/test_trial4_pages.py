"""Trial 4 (session 4, /work/notes/trial4.md) findings 5, 6, 7, 9 and the lower items of 10 on the
agent, bill, queue and campaign pages: each test fails without its fix."""
from __future__ import annotations

import datetime as dt

import pytest

from dashboards import billing, selectors, stages
from dashboards.models import Task, Team
from tests.ops.fixtures import make_campaign, make_task, ops_users  # noqa: F401
from tests.unit.test_ops_views import as_user, launch_data  # noqa: F401

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
    detail = selectors.task_detail(ops_users["admin"], task.pk, with_scheduler=False)
    assert detail["task"]["state"] == "done" and detail["task"]["state_code"] == ""
    Task.objects.filter(pk=task.pk).update(state="held", active=True)
    assert selectors.task_detail(ops_users["admin"], task.pk, with_scheduler=False)["task"]["state_code"] == "hqw"


# --------------------------------------------------------------------------- finding 6

def test_jobs_not_launched_by_tco_are_counted_from_their_accounting_records_on_bill_and_api(as_user, ops_users):
    research = Team.objects.get(project="research")
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
    assert "each record is one finished task" in billing.USAGE_DEFINITION
