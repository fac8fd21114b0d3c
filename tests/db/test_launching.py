"""Launching, urgent agents, campaign control, triage and the audit log (dashboards.launch, .control,
.triage, .audit, .inputs, .notices, .agents)."""
from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal

import pytest
from django.utils import timezone

from dashboards.launch import agents
from dashboards.core import audit
from dashboards.launch import inputs
from dashboards.launch import notices
from dashboards.control import triage
from dashboards.control import actions
from dashboards.core import ranges
from dashboards.launch import policy
from dashboards.launch import service
from dashboards.launch import spool
from dashboards.core.errors import ActionRefused
from dashboards.models import AgentDefinition, AuditEntry, Budget, Campaign, Task, Team
from dashboards.core.errors import LaunchError
from dashboards.launch.submit import campaign_job_spec, campaign_submit
from dashboards.core.clusters import cluster_get_default
from tests.support.history import make_campaign, make_task
from schedulers.fake import FakeScheduler

pytestmark = pytest.mark.django_db


def launch(user, team, agent, **kwargs):
    kwargs.setdefault("inputs", [{"task": 1}, {"task": 2}])
    kwargs.setdefault("name", "ok-name")
    return service.launch(user=user, request=service.LaunchRequest(team=team, agent_definition=agent, **kwargs))


# ------------------------------------------------------------------ inputs

def test_a_parameter_list_is_one_task_per_line_or_a_range():
    assert inputs.inputs_from_params("task=1 duration_s=2.5 label=a\nfail=true") == [
        {"task": 1, "duration_s": 2.5, "label": "a"}, {"fail": True}]
    assert inputs.inputs_from_params("seed=3..5") == [{"seed": 3}, {"seed": 4}, {"seed": 5}]


@pytest.mark.parametrize("text, message", [
    ("", "empty"),
    ("seed=1..999999999999", "at most"),
    ("seed=5..1", "backwards"),
    ("-u root", "not key=value"),
    ("a=1 a=2", "twice"),
    ("x;rm=1", "not key=value"),
])
def test_a_bad_parameter_list_says_what_is_wrong(text, message):
    with pytest.raises(LaunchError, match=message):
        inputs.inputs_from_params(text)


def test_jsonl_inputs_name_the_bad_line():
    assert inputs.inputs_from_jsonl('{"a": 1}\n\n{"a": 2}\n') == [{"a": 1}, {"a": 2}]
    with pytest.raises(LaunchError, match="line 2 is not JSON"):
        inputs.inputs_from_jsonl('{"a": 1}\nnot json')
    with pytest.raises(LaunchError, match="line 1 is not a JSON object"):
        inputs.inputs_from_jsonl("[1, 2]")


def test_directory_inputs_stay_inside_the_teams_folder_of_the_inputs_root(tmp_path, settings, research):
    root = tmp_path / "inputs"
    mine = root / research.project
    (mine / "set1").mkdir(parents=True)
    (mine / "set1" / "b.txt").write_text("b")
    (mine / "set1" / "a.txt").write_text("a")
    (mine / "set1" / ".hidden").write_text("h")
    (mine / "set1" / "escape").symlink_to("/etc/passwd")
    settings.TCO_INPUTS_ROOT = str(root)
    assert inputs.inputs_from_directory("set1", team=research) == [{"file": str(mine / "set1" / "a.txt")},
                                                                   {"file": str(mine / "set1" / "b.txt")}]
    for bad in ("../", "/etc", "set1/../../", "nope", "set1\nx"):
        with pytest.raises(LaunchError):
            inputs.inputs_from_directory(bad, team=research)


def test_another_teams_input_folders_are_refused_whatever_the_path_trick(tmp_path, settings, research):
    """The finding: "files in a directory" were taken from anywhere under the inputs root, so a launcher of
    research could probe and launch over engineering's folders. Now a launcher names a folder under their
    team's own folder (<inputs root>/<project>/), and nothing outside it passes: not a path with .., not an
    absolute one, not a symbolic link (of a folder or of a file) into another team's folder."""
    engineering = Team.objects.get(project="engineering")
    root = tmp_path / "inputs"
    theirs = root / engineering.project / "secret-set"
    theirs.mkdir(parents=True)
    (theirs / "q1.txt").write_text("engineering's")
    mine = root / research.project
    (mine / "set").mkdir(parents=True)
    (mine / "set" / "own.txt").write_text("research's")
    (mine / "set" / "stolen.txt").symlink_to(theirs / "q1.txt")
    (mine / "linked").symlink_to(theirs)
    (root / "shared").mkdir()
    (root / "shared" / "x.txt").write_text("not a team's folder")
    settings.TCO_INPUTS_ROOT = str(root)
    assert inputs.inputs_from_directory("set", team=research) == [{"file": str(mine / "set" / "own.txt")}]
    for trick in ("../engineering/secret-set", "/engineering/secret-set", "engineering/secret-set",
                  f"{root}/engineering/secret-set", "linked", "linked/", "set/../../engineering/secret-set",
                  "../shared", "..", "/"):
        with pytest.raises(LaunchError) as refused:
            inputs.inputs_from_directory(trick, team=research)
        said = str(refused.value).replace(trick, "")  # the message may echo what the launcher typed
        assert "engineering" not in said and str(root) not in said
    # Engineering's launcher reaches its own folder.
    assert inputs.inputs_from_directory("secret-set", team=engineering) == [{"file": str(theirs / "q1.txt")}]


def test_a_teams_folder_that_is_a_link_is_refused(tmp_path, settings, research):
    root = tmp_path / "inputs"
    (root / "engineering" / "set").mkdir(parents=True)
    (root / "engineering" / "set" / "a.txt").write_text("a")
    (root / research.project).symlink_to(root / "engineering")
    settings.TCO_INPUTS_ROOT = str(root)
    with pytest.raises(LaunchError, match="folder of the inputs root is a link"):
        inputs.inputs_from_directory("set", team=research)


def test_the_launch_form_takes_directory_inputs_from_the_chosen_teams_folder(tmp_path, settings, ops_users):
    from dashboards.web.forms import LaunchForm

    research = Team.objects.get(project="research")
    root = tmp_path / "inputs"
    (root / "engineering" / "set").mkdir(parents=True)
    (root / "engineering" / "set" / "a.txt").write_text("a")
    settings.TCO_INPUTS_ROOT = str(root)
    agent = AgentDefinition.objects.get(name="demo-agent")
    data = {"agent_definition": agent.pk, "team": research.pk, "queue": "agent.q", "seats_per_task": 0,
            "priority": 0, "input_kind": "directory", "input_directory": "../engineering/set", "preview": "1"}
    form = LaunchForm(data, user=ops_users["launcher"])
    assert not form.is_valid() and "outside your team's folder" in form.errors["input_directory"][0]
    assert str(root / research.project) in form.fields["input_directory"].help_text


def test_a_policy_must_be_a_known_yaml_mapping_without_duplicate_keys():
    assert policy.validate_policy("version: 1\nprocess: {run_as_user: sandbox}\n").startswith("version")
    for bad, message in (("version: 1\nversion: 1", "duplicate"), ("[1]", "mapping"), ("version: 1\nshell: x", "unknown"),
                         ("version: 2", "not supported"), ("a: [", "not valid YAML")):
        with pytest.raises(LaunchError, match=message):
            policy.validate_policy(bad)


# ------------------------------------------------------------------ launching and roles

def test_a_launcher_launches_and_it_is_audited(ops_users, research, agent, tmp_path):
    outcome = launch(ops_users["launcher"], research, agent, model="claude-x", token_cap=1000,
                     cost_cap_usd=Decimal("0.5"), concurrency_cap=1)
    campaign = outcome.campaign
    assert campaign.status == "submitting" and campaign.model == "claude-x" and campaign.priority == 0
    spec = json.loads((spool.spool_dir() / "campaigns" / str(campaign.pk) / "spec.json").read_text())
    assert spec["model"] == "claude-x" and spec["token_cap"] == 1000 and spec["cost_cap_usd"] == "0.5"
    entry = AuditEntry.objects.get(action="launch")
    assert entry.ok and entry.user == ops_users["launcher"] and entry.target == f"campaign:{campaign.pk}"
    assert entry.params["tasks"] == 2 and entry.params["status"] == "done"


@pytest.mark.parametrize("role", ["viewer", "lead", "other", "nobody"])
def test_launching_is_refused_to_roles_without_it(ops_users, research, agent, role):
    with pytest.raises(ActionRefused):
        launch(ops_users[role], research, agent)
    assert not Campaign.objects.exists()
    entry = AuditEntry.objects.get()
    assert not entry.ok and entry.result.startswith("refused") and entry.user == ops_users[role]


def test_priority_above_the_role_limit_and_urgent_launches_need_the_urgent_role(ops_users, research, agent):
    with pytest.raises(ActionRefused, match="priority must be from -1023 to 0"):
        launch(ops_users["launcher"], research, agent, priority=1)
    with pytest.raises(ActionRefused, match="urgent"):
        service.urgent_launch(user=ops_users["launcher"], team=research, agent_definition=agent, input={"task": 1})
    with pytest.raises(ActionRefused):
        launch(ops_users["urgent"], research, agent, priority=1025)
    assert not Campaign.objects.exists()
    assert launch(ops_users["launcher"], research, agent, priority=-1023).campaign.priority == -1023
    urgent = service.urgent_launch(user=ops_users["urgent"], team=research, agent_definition=agent,
                                     input={"task": 1}).campaign
    assert urgent.priority == 1024 and urgent.urgent and urgent.task_count == 1
    assert campaign_job_spec(urgent).priority == 1024


def test_the_sites_sandbox_limits_reach_every_tasks_runner(ops_users, research, agent, settings):
    settings.TCO_SANDBOX_LIMITS = {"TCO_SANDBOX_MEMORY_BYTES": str(2 << 30), "TCO_SANDBOX_CPU_S": "3600"}
    campaign = launch(ops_users["launcher"], research, agent).campaign
    environment = campaign_job_spec(campaign).environment
    assert environment["TCO_SANDBOX_MEMORY_BYTES"] == "2147483648" and environment["TCO_SANDBOX_CPU_S"] == "3600"
    assert "TCO_SANDBOX_FILE_BYTES" not in environment
    assert "TCO_SANDBOX_WORKDIR" not in environment                 # the runner's default (tmpfs)
    settings.TCO_SANDBOX_WORKDIR = "spool"
    assert campaign_job_spec(campaign).environment["TCO_SANDBOX_WORKDIR"] == "spool"
    assert "TCO_SANDBOX_SECCOMP" not in environment                 # the runner's default (the deny-list)
    settings.TCO_SANDBOX_SECCOMP = "off"
    assert campaign_job_spec(campaign).environment["TCO_SANDBOX_SECCOMP"] == "off"


def test_a_work_directory_mode_other_than_tmpfs_or_spool_stops_the_settings(monkeypatch):
    import importlib

    from django.core.exceptions import ImproperlyConfigured

    import tco_web.limit_settings as limit_settings

    monkeypatch.setenv("TCO_SANDBOX_WORKDIR", "disk")
    with pytest.raises(ImproperlyConfigured, match="TCO_SANDBOX_WORKDIR='disk': tmpfs or spool"):
        importlib.reload(limit_settings)
    monkeypatch.delenv("TCO_SANDBOX_WORKDIR")
    importlib.reload(limit_settings)


def test_the_sandbox_modes_reach_the_settings_and_a_wrong_seccomp_mode_stops_them(monkeypatch):
    """settings.py takes limit_settings' names with ``import *``: both modes must be among them (the
    work directory's was not, so a site's TCO_SANDBOX_WORKDIR never reached the runners)."""
    import importlib

    from django.core.exceptions import ImproperlyConfigured

    import tco_web.limit_settings as limit_settings

    monkeypatch.setenv("TCO_SANDBOX_WORKDIR", "spool")
    monkeypatch.setenv("TCO_SANDBOX_SECCOMP", "off")
    importlib.reload(limit_settings)
    names: dict = {}
    exec("from tco_web.limit_settings import *", names)  # noqa: S102 - what settings.py does
    assert names["TCO_SANDBOX_WORKDIR"] == "spool" and names["TCO_SANDBOX_SECCOMP"] == "off"
    monkeypatch.setenv("TCO_SANDBOX_SECCOMP", "on")
    with pytest.raises(ImproperlyConfigured, match="TCO_SANDBOX_SECCOMP='on': default or off"):
        importlib.reload(limit_settings)
    monkeypatch.delenv("TCO_SANDBOX_SECCOMP")
    monkeypatch.delenv("TCO_SANDBOX_WORKDIR")
    importlib.reload(limit_settings)


@pytest.mark.parametrize("name", ["-u root", "; rm -rf /", "a\nb", "with space", "a:b", "", "x" * 65, "../x"])
def test_hostile_names_are_refused_before_anything_is_written(ops_users, research, agent, name):
    with pytest.raises(LaunchError):
        launch(ops_users["launcher"], research, agent, name=name)
    assert not Campaign.objects.exists()
    assert not AuditEntry.objects.filter(ok=True).exists()


@pytest.mark.parametrize("kwargs", [
    {"queue": "agent.q -u root"}, {"queue": "all.q"}, {"seats_per_task": -1}, {"seats_per_task": 17},
    {"concurrency_cap": 0}, {"concurrency_cap": 3}, {"model": "a b"}, {"model": "-u root"},
    {"predecessor_job": -5}, {"token_cap": -1}, {"cost_cap_usd": Decimal("-1")}, {"inputs": []},
    {"policy": "version: 1\nrm: -rf"},
])
def test_hostile_options_are_refused_before_anything_is_written(ops_users, research, agent, kwargs):
    with pytest.raises((LaunchError, ActionRefused)):
        launch(ops_users["launcher"], research, agent, **kwargs)
    assert not Campaign.objects.exists()


def test_a_predecessor_must_be_a_visible_campaign_with_as_many_tasks(ops_users, research, agent):
    engineering = Team.objects.get(project="engineering")
    mine = make_campaign(team=research, user=ops_users["launcher"], count=2, job_number=4242, status="submitted")
    make_campaign(team=engineering, user=ops_users["other"], count=2, job_number=4343, status="submitted")
    with pytest.raises(LaunchError, match="not a campaign of a team you can see"):
        launch(ops_users["launcher"], research, agent, predecessor_job=4343)
    # Said as what to do (the re-trial read "needs the same number (1)" as "needs 1 task").
    with pytest.raises(LaunchError, match=r"This campaign has 1 task, but -hold_jid_ad pairs task N with task N "
                                          r"of predecessor job 4242, which has 2: give it 2 tasks\."):
        launch(ops_users["launcher"], research, agent, predecessor_job=4242, inputs=[{"task": 1}])
    campaign = launch(ops_users["launcher"], research, agent, predecessor_job=mine.job_number).campaign
    spec = campaign_job_spec(campaign)
    assert spec.hold_jid_ad == 4242 and spec.hold is False


def test_a_launch_over_a_refuse_budget_is_refused_and_over_a_hold_budget_is_held(ops_users, research, agent,
                                                                                 settings):
    Budget.objects.create(team=research, period="month", amount_usd=Decimal("10"), thresholds=[1.0],
                          on_exceed="refuse")
    with pytest.raises(ActionRefused, match="over budget"):
        launch(ops_users["launcher"], research, agent, cost_cap_usd=Decimal("6"))  # 2 tasks x $6 cap
    assert not Campaign.objects.exists()
    assert launch(ops_users["launcher"], research, agent, cost_cap_usd=Decimal("4")).campaign.submit_on_hold is False
    Budget.objects.update(on_exceed="hold")
    outcome = launch(ops_users["launcher"], research, agent, cost_cap_usd=Decimal("6"))
    assert outcome.held_for_budget and outcome.campaign.submit_on_hold
    assert campaign_job_spec(outcome.campaign).hold is True
    fake = FakeScheduler()
    campaign_submit(campaign_id=outcome.campaign.pk, scheduler=fake)
    assert {t.held for t in fake.tasks.values() if t.job_number == 1} == {True}


def test_a_forecast_from_history_drives_the_budget_check(ops_users, research, agent):
    history = make_campaign(team=research, user=ops_users["launcher"], agent=agent)
    for n in range(1, 4):
        make_task(history, task_number=n, started_at=dt.datetime(2020, 1, 1, tzinfo=dt.timezone.utc),
                  cost_usd="3", tokens={"output_tokens": 100})
    preview = service.launch_preview(user=ops_users["launcher"], team=research, agent_definition=agent, count=5)
    assert preview["expected_usd"] == Decimal("15") and preview["verdict"]["action"] == "submit"
    Budget.objects.create(team=research, period="day", amount_usd=Decimal("10"), thresholds=[1.0], on_exceed="refuse")
    with pytest.raises(ActionRefused, match=r"\$15.00"):
        launch(ops_users["launcher"], research, agent, inputs=[{}] * 5)


# ------------------------------------------------------------------ campaign control

def submitted_campaign(user, team, agent, fake, count=4):
    campaign = launch(user, team, agent, inputs=[{"task": n} for n in range(1, count + 1)]).campaign
    return campaign_submit(campaign_id=campaign.pk, scheduler=fake)


def test_pause_resume_and_cancel_go_through_the_submit_worker_and_are_audited(ops_users, research, agent,
                                                                            django_capture_on_commit_callbacks,
                                                                            monkeypatch):
    queued = []
    from dashboards.core import enqueue

    monkeypatch.setattr(enqueue, "send", lambda name, request_id: queued.append(request_id))
    fake = FakeScheduler()
    campaign = submitted_campaign(ops_users["launcher"], research, agent, fake)
    fake.start(campaign.job_number, [1])
    Task.objects.filter(campaign=campaign, task_number=1).update(state="running")

    with django_capture_on_commit_callbacks(execute=True):
        entry = actions.campaign_control(user=ops_users["launcher"], campaign=campaign, action="pause")
    assert queued == [entry.pk] and entry.state == "queued" and entry.tasks == [[2, 4]]
    assert AuditEntry.objects.get(pk=entry.audit_id).params["status"] == "queued"
    entry = actions.control_execute(request_id=entry.pk, scheduler=fake)
    assert entry.ok and entry.state == "done" and fake.control_calls[-1] == ["qhold", f"{campaign.job_number}.2-4"]
    assert AuditEntry.objects.get(pk=entry.audit_id).params["status"] == "done"
    assert AuditEntry.objects.get(pk=entry.audit_id).ok
    # A second delivery does nothing.
    actions.control_execute(request_id=entry.pk, scheduler=fake)
    assert len(fake.control_calls) == 1

    Task.objects.filter(campaign=campaign, task_number__gte=2).update(state="held")
    with django_capture_on_commit_callbacks(execute=True):
        entry = actions.campaign_control(user=ops_users["urgent"], campaign=campaign, action="resume")
    actions.control_execute(request_id=entry.pk, scheduler=fake)
    assert fake.control_calls[-1] == ["qrls", f"{campaign.job_number}.2-4"]

    with django_capture_on_commit_callbacks(execute=True):
        entry = actions.campaign_control(user=ops_users["launcher"], campaign=campaign, action="cancel")
    entry = actions.control_execute(request_id=entry.pk, scheduler=fake)
    assert entry.ok and fake.control_calls[-1] == ["qdel", str(campaign.job_number)]
    assert not fake.list_tasks()


def test_a_refused_control_by_the_scheduler_is_recorded(ops_users, research, agent):
    fake = FakeScheduler()
    campaign = submitted_campaign(ops_users["launcher"], research, agent, fake)
    fake.control("delete", campaign.job_number)  # gone already
    entry = actions.campaign_control(user=ops_users["launcher"], campaign=campaign, action="cancel")
    entry = actions.control_execute(request_id=entry.pk, scheduler=fake)
    assert not entry.ok and "does not exist" in entry.result and entry.state == "failed"
    audit_entry = AuditEntry.objects.get(pk=entry.audit_id)
    assert audit_entry.params["status"] == "failed" and "does not exist" in audit_entry.result


def test_an_unreachable_scheduler_leaves_the_action_queued_for_a_retry(ops_users, research, agent):
    from schedulers.base import SchedulerUnavailable

    fake = FakeScheduler()
    campaign = submitted_campaign(ops_users["launcher"], research, agent, fake)
    entry = actions.campaign_control(user=ops_users["launcher"], campaign=campaign, action="cancel")
    fake.unavailable = True
    with pytest.raises(SchedulerUnavailable):
        actions.control_execute(request_id=entry.pk, scheduler=fake)
    entry.refresh_from_db()
    assert entry.state == "queued" and entry.result.startswith("queued")
    fake.unavailable = False
    assert actions.control_execute(request_id=entry.pk, scheduler=fake).ok


@pytest.mark.parametrize("role", ["viewer", "lead", "other", "nobody"])
@pytest.mark.parametrize("action", ["cancel", "pause", "resume"])
def test_campaign_control_is_refused_to_roles_without_it(ops_users, research, agent, role, action):
    fake = FakeScheduler()
    campaign = submitted_campaign(ops_users["launcher"], research, agent, fake)
    with pytest.raises(ActionRefused):
        actions.campaign_control(user=ops_users[role], campaign=campaign, action=action)
    assert not AuditEntry.objects.filter(action=f"campaign_{action}", ok=True).exists()
    assert AuditEntry.objects.filter(action=f"campaign_{action}", result__startswith="refused").count() == 1
    assert fake.control_calls == []


def test_nothing_to_control_says_so(ops_users, research, agent):
    fake = FakeScheduler()
    campaign = submitted_campaign(ops_users["launcher"], research, agent, fake)
    with pytest.raises(LaunchError, match="no held tasks"):
        actions.campaign_control(user=ops_users["launcher"], campaign=campaign, action="resume")
    Campaign.objects.filter(pk=campaign.pk).update(status="finished")
    campaign.refresh_from_db()
    with pytest.raises(LaunchError, match="finished"):
        actions.campaign_control(user=ops_users["launcher"], campaign=campaign, action="cancel")


def test_retry_launches_the_failed_tasks_as_a_new_linked_campaign(ops_users, research, agent):
    fake = FakeScheduler()
    campaign = submitted_campaign(ops_users["launcher"], research, agent, fake, count=4)
    Task.objects.filter(campaign=campaign, task_number__in=[2, 4]).update(state="failed", active=False)
    Task.objects.filter(campaign=campaign, task_number__in=[1, 3]).update(state="done", active=False)
    with pytest.raises(ActionRefused):
        service.campaign_retry(user=ops_users["viewer"], campaign=campaign)
    retry = service.campaign_retry(user=ops_users["launcher"], campaign=campaign).campaign
    assert retry.retry_of == campaign and retry.task_count == 2 and retry.name == "ok-name-retry"
    assert service.campaign_inputs(retry) == [{"task": 2}, {"task": 4}]
    assert AuditEntry.objects.filter(action="campaign_retry", ok=True).count() == 1
    Task.objects.filter(campaign=campaign).update(state="done")
    with pytest.raises(LaunchError, match="no failed tasks"):
        service.campaign_retry(user=ops_users["launcher"], campaign=campaign)


def test_a_finished_campaign_is_mailed_to_its_launcher_once(ops_users, research, agent, mailoutbox,
                                                           django_capture_on_commit_callbacks, monkeypatch):
    from dashboards.ingest import campaign_status
    from dashboards.core import enqueue

    notified = []
    monkeypatch.setattr(enqueue, "send", lambda name, *args, queue: notified.append((list(args), queue)))
    fake = FakeScheduler()
    campaign = submitted_campaign(ops_users["launcher"], research, agent, fake, count=2)
    Task.objects.filter(campaign=campaign).update(state="done", active=False, wallclock_s=3, cost_usd=Decimal("0.25"))
    with django_capture_on_commit_callbacks(execute=True):
        campaign_status.finish_campaigns({campaign.pk})
        campaign_status.finish_campaigns({campaign.pk})
    assert notified == [([campaign.pk], "ingest")]
    assert notices.campaign_finished_notify(campaign_id=campaign.pk)
    assert len(mailoutbox) == 1 and mailoutbox[0].to == ["launcher@example.org"]
    assert "2 done" in mailoutbox[0].subject and "$0.50" in mailoutbox[0].body
    assert [c.pk for c in notices.finished_notices(ops_users["launcher"])] == [campaign.pk]
    # Its team's members see the notice too; another team's launcher does not (tests/db/test_notices.py).
    assert [c.pk for c in notices.finished_notices(ops_users["viewer"])] == [campaign.pk]
    assert notices.finished_notices(ops_users["other"]) == []


def test_urgent_agents_show_how_long_they_waited(ops_users, research, agent):
    fake = FakeScheduler()
    urgent = service.urgent_launch(user=ops_users["urgent"], team=research, agent_definition=agent,
                                     input={"task": 1}).campaign
    campaign_submit(campaign_id=urgent.pk, scheduler=fake)
    t0 = timezone.now() - dt.timedelta(seconds=30)
    Task.objects.filter(campaign=urgent).update(submitted_at=t0, started_at=t0 + dt.timedelta(seconds=7),
                                                state="running")
    (row,) = service.urgent_agents(ops_users["viewer"])
    assert row["waited_s"] == pytest.approx(7) and not row["waiting"]
    assert service.urgent_agents(ops_users["other"]) == []


# ------------------------------------------------------------------ triage

def detail_scheduler(details: dict[int, dict]) -> FakeScheduler:
    """The fake answering ``qstat -j`` of these jobs with these details (``parse_job_detail`` shape)."""
    fake = FakeScheduler()
    for job_number, answer in details.items():
        fake.set_job_detail(job_number, answer)
    return fake


def detail(job: int, **fields) -> dict:
    base = {"job_number": job, "name": "x", "owner": "tco", "project": "research", "hard_resources": {},
            "tasks": [], "holds": {}, "predecessors": [], "scheduler_messages": [], "global_messages": [],
            "context": {}}
    base.update(fields)
    return base


def waiting_task(job: int, task: int, state: str, waited_s: float) -> Task:
    return Task.objects.create(cluster=cluster_get_default(), job_number=job, task_number=task, is_array=True,
                               name=f"job{job}", owner="tco", project="research", state=state,
                               submitted_at=timezone.now() - dt.timedelta(seconds=waited_s))


def test_triage_lists_error_jobs_first_then_the_longest_wait_with_plain_reasons(bootstrap):
    waiting_task(10, 1, "pending", 50)
    waiting_task(10, 2, "pending", 50)
    waiting_task(11, 1, "pending", 500)
    waiting_task(12, 1, "error", 5)
    waiting_task(13, 1, "running", 900)
    seat = "(-l anthropic_api=1) cannot run globally because it offers only gc:anthropic_api=0.000000"
    scheduler = detail_scheduler({
        10: detail(10, scheduler_messages=[seat]),
        12: detail(12, tasks=[{"task_number": 1, "state": "error"}]),
    })
    cluster = cluster_get_default()
    cluster.status = {"global_capacity": {"anthropic_api": 96}, "quotas": [], "hosts": []}
    overview = triage.triage_overview(cluster=cluster, scheduler=scheduler)
    assert [j["job_number"] for j in overview["jobs"]] == [12, 11, 10]
    assert overview["total_tasks"] == 4
    by_job = {j["job_number"]: j for j in overview["jobs"]}
    assert by_job[12]["reasons"][0]["text"].startswith("in error state")
    assert by_job[10]["reasons"][0]["text"] == ("waiting for a model API seat: the job asks 1 (-l anthropic_api=1); 96 of 96 "
                                                "in use, 0 free (consumable anthropic_api, global)")
    assert by_job[10]["ranges"] == {"pending": "tasks 1-2"}
    assert "no longer knows" in by_job[11]["reason_error"]
    # One cached qstat -j per job, with the web timeout: a second view asks the scheduler nothing.
    triage.triage_overview(cluster=cluster, scheduler=scheduler)
    assert sorted(scheduler.job_detail_calls) == [(10, 3.0), (11, 3.0), (12, 3.0)]


def test_triage_actions_are_for_admins_and_run_through_the_audit_log(ops_users):
    waiting_task(12, 1, "error", 5)
    fake = FakeScheduler()
    for role in ("viewer", "lead", "launcher", "urgent", "other", "nobody"):
        with pytest.raises(ActionRefused):
            actions.triage_action(user=ops_users[role], action="clear_error", job_number=12)
    assert AuditEntry.objects.filter(action="triage_clear_error", result__startswith="refused").count() == 6
    with pytest.raises(LaunchError, match="not in the queue"):
        actions.triage_action(user=ops_users["admin"], action="delete", job_number=99)
    with pytest.raises(LaunchError, match="priority"):
        actions.triage_action(user=ops_users["admin"], action="priority", job_number=12, priority=5000)
    with pytest.raises(ActionRefused, match="unknown action"):
        actions.triage_action(user=ops_users["admin"], action="qconf", job_number=12)
    job, _ = fake.submit_array(campaign_job_spec_for_fake())
    fake.set_error(job)
    Task.objects.filter(job_number=12).update(job_number=job)
    entry = actions.triage_action(user=ops_users["admin"], action="clear_error", job_number=job)
    entry = actions.control_execute(request_id=entry.pk, scheduler=fake)
    assert entry.ok and fake.control_calls == [["qmod", "-cj", str(job)]] and fake.tasks[(job, 1)].state == "pending"
    entry = actions.triage_action(user=ops_users["admin"], action="priority", job_number=job, priority=-100)
    actions.control_execute(request_id=entry.pk, scheduler=fake)
    assert fake.control_calls[-1] == ["qalter", "-p", "-100", str(job)]


def campaign_job_spec_for_fake():
    from schedulers.base import ArrayJobSpec

    return ArrayJobSpec(name="eqw", command="/bin/true", args=[], count=1, queue="agent.q", project="research",
                        resources={}, environment={}, working_directory="/tmp", output_path="/tmp",
                        error_path="/tmp")


def test_task_ranges_parse_with_clear_errors():
    assert ranges.parse_task_ranges("1-3, 5") == [[1, 3], [5, 5]]
    assert ranges.parse_task_ranges("") is None
    for bad in ("0", "3-1", "1;2", "-u root", "1-99999999"):
        with pytest.raises(LaunchError):
            ranges.parse_task_ranges(bad)


def test_the_audit_log_is_for_admins(ops_users):
    audit.audit(user=ops_users["launcher"], action="launch", ok=True, result="x")
    assert len(audit.audit_entries(ops_users["admin"])) == 1
    for role in ("viewer", "lead", "launcher", "urgent", "nobody"):
        with pytest.raises(ActionRefused):
            audit.audit_entries(ops_users[role])


def test_agent_definitions_are_edited_by_admins_only(ops_users):
    definition = AgentDefinition(name="new-agent", version=1, command=["/usr/bin/true"])
    with pytest.raises(ActionRefused):
        agents.agent_definition_save(user=ops_users["launcher"], definition=definition)
    assert not AgentDefinition.objects.filter(name="new-agent").exists()
    agents.agent_definition_save(user=ops_users["admin"], definition=definition)
    assert AuditEntry.objects.filter(action="agent_definition_save", ok=True).count() == 1


def test_clearing_an_error_counts_as_done_although_qmod_exits_1(monkeypatch):
    """SGE 8.1.9's ``qmod -cj`` prints "cleared error state of job N" and exits 1 (dev cluster)."""
    from schedulers.gridengine.adapter import GridEngine
    from schedulers.base import SchedulerCommandError

    def fake_run(self, argv, timeout=None):
        if argv[-1] == "297":
            raise SchedulerCommandError("qmod exited with status 1", argv=argv, returncode=1,
                                        stderr="tco@vm cleared error state of job 297")
        raise SchedulerCommandError("qmod exited with status 1", argv=argv, returncode=1,
                                    stderr='invalid queue or job "298"')

    monkeypatch.setattr(GridEngine, "_run", fake_run)
    scheduler = GridEngine()
    scheduler.control("clear_error", 297)
    with pytest.raises(SchedulerCommandError):
        scheduler.control("clear_error", 298)
    with pytest.raises(SchedulerCommandError):
        scheduler.control("delete", 297)  # only qmod's quirk is forgiven


def test_a_policy_is_checked_by_the_runners_own_validator_and_never_read_as_a_path():
    from dashboards.core.errors import LaunchError
    from dashboards.launch.policy import validate_policy

    with pytest.raises(LaunchError, match="filesystem_policy"):
        validate_policy("version: 1\nfilesystem_policy:\n  read_only: [relative/path]\n  writable_too: [/x]\n")
    with pytest.raises(LaunchError, match="mapping"):
        validate_policy("/etc/shadow")
    good = "version: 1\nfilesystem_policy:\n  read_only: [/usr]\n  read_write: [/sandbox]\n"
    assert validate_policy(good) == good.strip()
