"""A predecessor job (``-hold_jid_ad``) must be a job of a team the launcher may see, for the
forecast as for the launch (issue 23, the round-3 fresh attack: a research launcher's Forecast
took engineering's job 44 as ``predecessor_job`` and showed a forecast with a Launch button,
where Launch then refused it). Also the number Grid Engine holds on *now*: an older campaign of the
launcher's own team with the same job number does not make another team's current job
acceptable. Each test reproduces the attack and fails without its fix."""
from __future__ import annotations

import datetime as dt
import html
import re

import pytest
from django.utils import timezone

from dashboards.core.clusters import cluster_get_default
from dashboards.core.errors import LaunchError
from dashboards.launch import service
from dashboards.launch.predecessor import visible_predecessor
from dashboards.models import AgentDefinition, Campaign, Task, Team
from schedulers.fake import FakeScheduler
from tests.support.forms import launch_data
from tests.support.history import make_campaign, timing

pytestmark = pytest.mark.django_db

REFUSAL = "predecessor job {job}: not a campaign of a team you can see (nor a job tco recorded for one)"


@pytest.fixture(autouse=True)
def _fake_scheduler(monkeypatch):
    fake = FakeScheduler()
    monkeypatch.setattr("dashboards.core.clusters.scheduler_for", lambda cluster, **options: fake)
    return fake


def _running_job(team: Team, user, *, job: int, name: str, count: int = 3) -> Campaign:
    """A running campaign of ``team`` with job ``job``: task 1 running for 30 s, the others pending."""
    campaign = make_campaign(team=team, user=user, name=name, status="running", job_number=job, count=count)
    now = timezone.now()
    for n in range(1, count + 1):
        Task.objects.create(cluster=campaign.cluster, campaign=campaign, job_number=job, task_number=n,
                            is_array=True, project=team.project, state="running" if n == 1 else "pending",
                            submitted_at=now - dt.timedelta(seconds=60),
                            started_at=now - dt.timedelta(seconds=30) if n == 1 else None, active=True)
    return campaign


def _error_of(body: str, field: str) -> str:
    """The error text the launch template shows under ``field`` ("" when none)."""
    block = re.search(rf'<div class="field[^"]*" id="field-{field}".*?</div>', body, re.S).group(0)
    error = re.search(r'<span class="error field-error">(.*?)</span>', block, re.S)
    return html.unescape(" ".join(error.group(1).split())) if error else ""


@pytest.mark.parametrize("button", ["preview", "launch"])
def test_the_form_refuses_another_teams_job_as_predecessor_for_a_forecast_and_a_launch(client, ops_users, button):
    """/tmp/fresh-work/launch.py's last line: a research launcher, engineering's running job."""
    job = 7_710_001
    _running_job(Team.objects.get(project="engineering"), ops_users["other"], job=job, name="eng-secret-run")
    before = Campaign.objects.count()
    client.force_login(ops_users["launcher"])
    posted = {**launch_data(input_params="task=1..3", predecessor_job=str(job), name="atk-pred"), button: "1"}
    body = client.post("/ops/launch/", posted).content.decode()
    assert _error_of(body, "predecessor_job") == REFUSAL.format(job=job)
    # No forecast at all: nothing of the job's timing, no Launch button, no campaign.
    assert 'id="forecast-predecessor"' not in body and 'id="launch-submit"' not in body
    assert "eng-secret-run" not in body
    assert Campaign.objects.count() == before
    # A number no job has reads the same (no oracle for which numbers are other teams' jobs).
    unknown = client.post("/ops/launch/", {**posted, "predecessor_job": str(job + 1)}).content.decode()
    assert _error_of(unknown, "predecessor_job") == REFUSAL.format(job=job + 1)


def test_the_form_forecasts_a_wait_on_a_job_of_the_launchers_own_team(client, ops_users):
    """The rule refuses only what the user may not see: research's own running job is forecast."""
    job = 7_710_011
    _running_job(Team.objects.get(project="research"), ops_users["launcher"], job=job, name="own-run")
    client.force_login(ops_users["launcher"])
    body = client.post("/ops/launch/", {**launch_data(input_params="task=1..3", predecessor_job=str(job)),
                                        "preview": "1"}).content.decode()
    assert _error_of(body, "predecessor_job") == ""
    line = re.search(r'id="forecast-predecessor">(.*?)</dd>', body, re.S).group(1)
    assert " ".join(line.split()).startswith(f"waits for predecessor job {job} (campaign own-run): 1 of its tasks "
                                             "running, 2 waiting")
    assert 'id="launch-submit"' in body


def test_an_old_campaign_of_ones_own_team_does_not_vouch_for_another_teams_job_of_the_same_number(ops_users):
    """Job numbers start again (a wrap, a new cluster spool): research's finished campaign had job N
    and engineering's running job has N now. Grid Engine would hold research's new campaign on
    engineering's job, and its tasks' starts would tell research when engineering's tasks end."""
    job = 7_710_021
    research, engineering = Team.objects.get(project="research"), Team.objects.get(project="engineering")
    old = make_campaign(team=research, user=ops_users["launcher"], name="old-research", status="finished",
                        job_number=job, count=3)
    Campaign.objects.filter(pk=old.pk).update(launched_at=timezone.now() - dt.timedelta(days=30))
    _running_job(engineering, ops_users["other"], job=job, name="eng-now")
    cluster = cluster_get_default()
    assert visible_predecessor(ops_users["launcher"], job, cluster)[0] is None
    request = service.LaunchRequest(team=research, agent_definition=AgentDefinition.objects.get(name="demo-agent"),
                                    inputs=[{"task": n} for n in (1, 2, 3)], name="atk-reuse", predecessor_job=job,
                                    cluster=cluster)
    with pytest.raises(LaunchError) as refused:
        service.launch(user=ops_users["launcher"], request=request)
    assert str(refused.value) == REFUSAL.format(job=job)
    assert not Campaign.objects.filter(name="atk-reuse").exists()
    # The forecast tells nothing of engineering's job either.
    before = timing(cluster=cluster, team=research, count=3, queue="agent.q", seats_per_task=0, concurrency_cap=None,
                    priority=0, duration_s={"p10": 2.0, "p50": 2.0, "p90": 3.0}, now=timezone.now(),
                    predecessor_job=job, user=ops_users["launcher"])["predecessor"]
    assert not before["visible"] and before["running"] == before["waiting"] == 0 and before["campaign"] == ""
    # Engineering's own launcher is told of its job, not of research's old campaign.
    assert visible_predecessor(ops_users["other"], job, cluster)[0].name == "eng-now"


def test_active_rows_of_another_teams_project_make_the_number_another_teams_job(ops_users):
    """A job tco recorded without a campaign (a sweep submitted by hand under engineering's project)
    now has the number of research's finished campaign: refused for research's launcher."""
    job = 7_710_031
    research = Team.objects.get(project="research")
    old = make_campaign(team=research, user=ops_users["launcher"], name="old-research-2", status="finished",
                        job_number=job, count=2)
    Campaign.objects.filter(pk=old.pk).update(launched_at=timezone.now() - dt.timedelta(days=30))
    for n in (1, 2):
        Task.objects.create(cluster=old.cluster, campaign=None, job_number=job, task_number=n, is_array=True,
                            project="engineering", state="pending", submitted_at=timezone.now(), active=True)
    request = service.LaunchRequest(team=research, agent_definition=AgentDefinition.objects.get(name="demo-agent"),
                                    inputs=[{"task": 1}, {"task": 2}], name="atk-reuse-2", predecessor_job=job,
                                    cluster=old.cluster)
    with pytest.raises(LaunchError, match=re.escape(REFUSAL.format(job=job))):
        service.launch(user=ops_users["launcher"], request=request)
    # Once those rows end, research's own campaign is the number's latest job again and is accepted.
    Task.objects.filter(job_number=job, campaign=None).update(active=False, state="done")
    assert service.launch(user=ops_users["launcher"], request=request).campaign.predecessor_job == job
