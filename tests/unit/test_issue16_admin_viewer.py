"""Issue 16, the admin's and viewer's parts: bugs 2, 3, 4, 5, 9, 11, 13, 14 and the triage, audit
and agent pages. Each bug test fails without its fix."""
from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from dashboards.clusters import cluster_get_default
from dashboards.ingest import apply_qstat_poll
from dashboards.models import Campaign, Task
from schedulers.base import QstatTask

pytestmark = pytest.mark.django_db

T0 = dt.datetime(2026, 11, 29, 12, 0, 0, tzinfo=dt.timezone.utc)


def qtask(job: int, task: int | None, code: str, state: str, *, host: str | None = None,
          submitted_at=T0, priority: float = 0.5) -> QstatTask:
    return QstatTask(job_number=job, task_number=task, name="tco-c1-demo", owner="tco", project="research",
                     state=state, state_code=code, restarted=False,
                     queue="agent.q" if host else None, host=host, slots=1,
                     submitted_at=submitted_at, started_at=T0 + dt.timedelta(seconds=5) if host else None,
                     priority=priority)


@pytest.fixture
def team_and_user(bootstrap, django_user_model):
    from dashboards.services import team_ensure

    team = team_ensure(name="research", project="research")
    user = django_user_model.objects.create_user("launcher1")
    return team, user


# --------------------------------------------------------------------------- bug 5

def test_bug5_campaign_status_follows_its_tasks_running_paused_submitted_finished(team_and_user):
    from tests.conftest import make_campaign

    team, user = team_and_user
    cluster = cluster_get_default()
    campaign = make_campaign(team=team, user=user, name="c5", job_number=505, tasks=[{}, {}])
    apply_qstat_poll(cluster, [qtask(505, 1, "r", "running", host="vm"), qtask(505, 2, "qw", "pending")],
                     observed_at=T0)
    assert Campaign.objects.get(pk=campaign.pk).status == "running"
    # The running task went back to the queue (rescheduled) and the other is held: nothing runs, all held.
    apply_qstat_poll(cluster, [qtask(505, 1, "hqw", "held"), qtask(505, 2, "hqw", "held")],
                     observed_at=T0 + dt.timedelta(seconds=1))
    assert Campaign.objects.get(pk=campaign.pk).status == "paused"
    apply_qstat_poll(cluster, [qtask(505, 1, "qw", "pending"), qtask(505, 2, "qw", "pending")],
                     observed_at=T0 + dt.timedelta(seconds=2))
    assert Campaign.objects.get(pk=campaign.pk).status == "submitted"


def test_bug5_a_running_or_paused_campaign_can_still_be_controlled_and_finished(team_and_user):
    from dashboards.ingest import _finish_campaigns
    from dashboards.models import CAMPAIGN_TRANSITIONS

    for state in ("running", "paused"):
        assert "finished" in CAMPAIGN_TRANSITIONS[state]
    from tests.conftest import make_campaign

    team, user = team_and_user
    campaign = make_campaign(team=team, user=user, name="c5b", job_number=506, status="running",
                             tasks=[{"state": "done"}])
    _finish_campaigns({campaign.pk})
    assert Campaign.objects.get(pk=campaign.pk).status == "finished"


# --------------------------------------------------------------------------- bug 2

def test_bug2_a_poll_replaces_tcos_late_submission_time_with_the_schedulers(team_and_user):
    from tests.conftest import make_campaign

    team, user = team_and_user
    cluster = cluster_get_default()
    drmaa_returned = T0 + dt.timedelta(seconds=1.766)  # tco's time: DRMAA returned after the qmaster's submit
    campaign = make_campaign(team=team, user=user, name="c2", job_number=202,
                             tasks=[{"submitted_at": drmaa_returned}])
    apply_qstat_poll(cluster, [qtask(202, 1, "qw", "pending", submitted_at=T0 + dt.timedelta(seconds=1))],
                     observed_at=T0 + dt.timedelta(seconds=2))
    task = Task.objects.get(campaign=campaign)
    assert task.submitted_at == T0 + dt.timedelta(seconds=1)


def test_bug2_queue_wait_is_never_negative_and_submit_ends_where_queue_wait_begins(team_and_user):
    from dashboards.stages import task_stages, timeline
    from tests.conftest import make_campaign

    team, user = team_and_user
    submitted = T0 + dt.timedelta(seconds=1.766)
    started = T0 + dt.timedelta(seconds=1)  # the runner started before DRMAA returned to tco
    campaign = make_campaign(team=team, user=user, name="c2b", job_number=203, launched_at=T0,
                             tasks=[{"submitted_at": submitted, "state": "running", "task_started_at": started}])
    Campaign.objects.filter(pk=campaign.pk).update(submitted_at=submitted)
    task = Task.objects.select_related("campaign").get(campaign=campaign)
    assert task_stages(task)["queue_wait"] == 0.0
    assert task.queue_wait_s == 0.0
    segments = {s["stage"]: s for s in timeline(task)}
    assert segments["queue_wait"]["seconds"] >= 0
    assert segments["submit"]["end"] <= segments["queue_wait"]["start"]
    assert segments["submit"]["seconds"] == pytest.approx(1.0)
