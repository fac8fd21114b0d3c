"""Attack review 5: a parameter line that expands to far more than its size, and the launch
forecast telling a launcher about other teams' jobs and inputs (/work/attack5: params_dos.py,
amplify_offline.py, launch_amplify_small.py, forecast_leak.py, forecast_leak_running.py,
cross_pred.py). Each test reproduces the attack and fails without its fix."""
from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

import pytest
from django.utils import timezone

from dashboards.launch import inputs
from dashboards.launch import forecast as launch_forecast
from dashboards.core import limits
from dashboards.launch import service
from dashboards.launch import spool
from dashboards.core.clusters import cluster_get_default
from dashboards.models import AgentDefinition, Campaign, Cluster, Task, Team
from dashboards.core.errors import LaunchError
from schedulers.fake import FakeScheduler
from tests.support.history import make_campaign, make_task, timing
from tests.support.forms import launch_data

pytestmark = pytest.mark.django_db

MB = 1024 * 1024


@pytest.fixture(autouse=True)
def _fake_scheduler(monkeypatch):
    fake = FakeScheduler()
    monkeypatch.setattr("dashboards.core.clusters.scheduler_for", lambda cluster, **options: fake)
    return fake


def _spool_bytes() -> int:
    root = Path(spool.spool_layout().inputs_path(1)).parent.parent
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file()) if root.exists() else 0


# --------------------------------------------------------------------------- 1. expansion of a parameter line

def test_a_line_of_many_keys_is_refused_naming_the_limit():
    """params_dos.py: ``task=1..75000 k0=1 ... k199=1`` copies 200 keys into every task."""
    line = "task=1..3 " + " ".join(f"k{n}=1" for n in range(inputs.PARAM_MAX_KEYS))  # one pair too many
    with pytest.raises(LaunchError, match=rf"at most {inputs.PARAM_MAX_KEYS}\b"):
        inputs.inputs_from_params(line)
    # One key fewer is a line of the limit's size, and is read.
    assert len(inputs.inputs_from_params(" ".join(line.split()[:-1]))) == 3


def test_a_range_whose_expanded_inputs_exceed_the_input_limit_is_refused_before_it_is_built():
    """amplify_offline.py: ``task=1..N pad=<S bytes>`` is a body of S bytes and N x S bytes of inputs."""
    pad = "x" * 300
    line = f"task=1..75000 pad={pad}"
    assert len(line) < 400  # a 0.3 KB body
    widest = len(json.dumps({"pad": pad, "task": 75000}, separators=(",", ":")))
    assert widest * 75000 > limits.INPUT_MAX_BYTES  # 22 MB of inputs, counted independently
    with pytest.raises(LaunchError, match=rf"at most {limits.INPUT_MAX_BYTES // MB} MB") as refused:
        inputs.inputs_from_params(line)
    assert "parameter line 1" in str(refused.value) and "75000 tasks" in str(refused.value)
    # The largest range of that line under the limit is read, and is what the spool would write.
    fits = limits.INPUT_MAX_BYTES // widest
    items = inputs.inputs_from_params(f"task=1..{fits} pad={pad}")
    assert len(items) == fits
    assert sum(len(json.dumps(i, separators=(",", ":"), sort_keys=True)) for i in items) <= limits.INPUT_MAX_BYTES


def test_the_expanded_size_is_summed_over_the_lines():
    """launch_amplify_small.py: lines each under the limit, together over it."""
    pad = "y" * (200 * 1024)
    line = f"task=1..50 pad={pad}"  # 10 MB each, two are 20 MB; the body is 400 KB
    assert len(inputs.inputs_from_params(line)) == 50
    with pytest.raises(LaunchError, match=r"parameter line 2: .*at most 16 MB"):
        inputs.inputs_from_params(line + "\n" + line.replace("task=1..50", "task=51..100"))


def test_a_launch_of_an_amplifying_parameter_list_records_and_writes_nothing(client, ops_users):
    """launch_amplify_small.py through the launch page: refused with the limit named; no campaign,
    no inputs file."""
    pad = "z" * (400 * 1024)
    before, written = Campaign.objects.count(), _spool_bytes()
    client.force_login(ops_users["launcher"])
    response = client.post("/ops/launch/", {**launch_data(input_params=f"task=1..50 pad={pad}", name="atk5"),
                                            "launch": "1"})
    assert response.status_code == 200
    assert "at most 16 MB" in response.content.decode()
    assert Campaign.objects.count() == before and _spool_bytes() == written


def test_the_forecast_encodes_a_value_shared_by_every_task_once(monkeypatch):
    """params_dos.py: ``_input_values`` json.dumps'ed every fixed value once per task."""
    items = inputs.inputs_from_params("task=1..1000 pad=" + "p" * 1000)
    calls = []
    real = json.dumps

    def counting(value, *args, **kwargs):
        calls.append(value)
        return real(value, *args, **kwargs)

    monkeypatch.setattr(json, "dumps", counting)
    values = launch_forecast._input_values(items)
    assert values["pad"].texts == {('"' + "p" * 1000 + '"')[:200]} and values["pad"].low is None
    assert (values["task"].low, values["task"].high, values["task"].texts) == (1, 1000, set())  # numbers: no text
    assert sum(1 for v in calls if v == "p" * 1000) == 1  # not 1000


# --------------------------------------------------------------------------- 2. another team's predecessor job

def _engineering_job(ops_users, *, job: int, name: str = "eng-secret-campaign") -> Campaign:
    engineering = Team.objects.get(project="engineering")
    campaign = make_campaign(team=engineering, user=ops_users["other"], name=name, status="running",
                             job_number=job, count=3)
    now = timezone.now()
    for n in (1, 2, 3):
        Task.objects.create(cluster=campaign.cluster, campaign=campaign, job_number=job, task_number=n,
                            is_array=True, project="engineering", state="running" if n == 1 else "pending",
                            submitted_at=now - dt.timedelta(seconds=60),
                            started_at=now - dt.timedelta(seconds=30) if n == 1 else None, active=True)
    history = make_campaign(team=engineering, user=ops_users["other"], name="eng-history")
    make_task(history, started_at=now - dt.timedelta(hours=1), wallclock_s=77)
    return campaign


def test_the_forecast_tells_nothing_of_another_teams_predecessor_job(ops_users):
    """forecast_leak.py / forecast_leak_running.py: a research launcher names an engineering job."""
    job = 7_700_001
    _engineering_job(ops_users, job=job)
    research = Team.objects.get(project="research")
    args = dict(cluster=cluster_get_default(), team=research, count=3, queue="agent.q", seats_per_task=0,
                concurrency_cap=None, priority=0, duration_s={"p10": 2.0, "p50": 2.0, "p90": 3.0},
                now=timezone.now())
    seen = timing(**args, predecessor_job=job, user=ops_users["launcher"])
    unknown = timing(**args, predecessor_job=job + 1, user=ops_users["launcher"])
    before = seen["predecessor"]
    assert before["text"] == f"predecessor job {job}: not a job of a team you can see; no wait for it is counted"
    assert before["campaign"] == "" and before["running"] == before["waiting"] == 0 and before["task_s"] is None
    assert not before["ended"] and before["first_end_at"] is None
    # An unknown number reads the same: no oracle for which numbers are other teams' jobs.
    assert unknown["predecessor"]["text"].replace(str(job + 1), str(job)) == before["text"]
    assert seen["start_at"] == unknown["start_at"]
    # Its own team's launcher still gets the forecast of it.
    own = timing(**{**args, "team": Team.objects.get(project="engineering")},
                                          predecessor_job=job, user=ops_users["other"])["predecessor"]
    assert own["campaign"] == "eng-secret-campaign" and own["running"] == 1 and own["waiting"] == 2
    assert own["task_s"] == 77


def test_the_launch_page_preview_shows_no_name_or_states_of_another_teams_job(client, ops_users):
    job = 7_700_011
    _engineering_job(ops_users, job=job)
    client.force_login(ops_users["launcher"])
    html = client.post("/ops/launch/", {**launch_data(input_params="task=1..3", predecessor_job=str(job)),
                                        "preview": "1"}).content.decode()
    # Since round 3's fresh attack the form refuses the job outright (tests/db/test_predecessor_scope.py):
    # no forecast line at all, the launch's own refusal under the field.
    assert 'id="forecast-predecessor"' not in html
    assert (f"predecessor job {job}: not a campaign of a team you can see (nor a job tco recorded for one)"
            in " ".join(html.split()))
    assert "eng-secret-campaign" not in html


def test_a_predecessor_must_be_on_the_cluster_the_campaign_is_launched_on(ops_users):
    """cross_pred.py's check, by cluster: a research job of the same number on another cluster is
    not this cluster's job."""
    default = cluster_get_default()
    other = Cluster.objects.create(name="attack5-other", sge_root="/opt/sge", accounting_path="/dev/null")
    research = Team.objects.get(project="research")
    job = 7_700_021
    elsewhere = make_campaign(team=research, user=ops_users["launcher"], name="elsewhere", status="running",
                              job_number=job, count=2)
    Campaign.objects.filter(pk=elsewhere.pk).update(cluster=other)
    agent = AgentDefinition.objects.get(name="demo-agent")
    request = service.LaunchRequest(team=research, agent_definition=agent, inputs=[{"task": 1}, {"task": 2}],
                                      name="atk5-cluster", predecessor_job=job, cluster=default)
    with pytest.raises(LaunchError, match="not a campaign of a team you can see"):
        service.launch(user=ops_users["launcher"], request=request)
    assert not Campaign.objects.filter(name="atk5-cluster").exists()
    # The same job on the launch's own cluster is accepted.
    Campaign.objects.filter(pk=elsewhere.pk).update(cluster=default)
    assert service.launch(user=ops_users["launcher"], request=request).campaign.predecessor_job == job


# --------------------------------------------------------------------------- 3. another team's input history

def test_the_history_note_shows_no_input_values_of_another_teams_campaigns(ops_users):
    """forecast_leak.py, last part: engineering's run paths shown to a research launcher."""
    agent = AgentDefinition.objects.get(name="demo-agent")
    started = timezone.now() - dt.timedelta(hours=2)
    secret = "/srv/engineering/private/run-1.txt"
    campaigns = {}
    for project, user, value in (("engineering", "other", secret), ("research", "launcher", "/research/ok.txt")):
        campaign = make_campaign(team=Team.objects.get(project=project), user=ops_users[user], name=f"h-{project}",
                                 count=1)
        make_task(campaign, started_at=started, wallclock_s=5)
        path = Path(spool.spool_layout().inputs_path(campaign.pk))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"run_output": value}) + "\n", encoding="utf-8")
        campaigns[project] = campaign
    forecast = {"history": 2, "duration_s": {"p10": 5.0, "p50": 5.0, "p90": 5.0}}
    mine = launch_forecast.history_basis(agent_definition=agent, inputs=[{"run_output": "/new"}], forecast=forecast,
                                         user=ops_users["launcher"])
    shown = json.dumps(mine)
    assert secret not in shown and "/research/ok.txt" in shown
    assert mine["campaigns"] == 1 and mine["runs"] == 2  # run time: every team's, no values
    # Engineering's own launcher sees its own values.
    theirs = launch_forecast.history_basis(agent_definition=agent, inputs=[{"run_output": "/new"}],
                                           forecast=forecast, user=ops_users["other"])
    assert secret in json.dumps(theirs) and "/research/ok.txt" not in json.dumps(theirs)
