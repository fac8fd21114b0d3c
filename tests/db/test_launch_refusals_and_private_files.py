"""The fresh-clone attack's findings (session 3): each test reproduces the attack and fails
without its fix."""
from __future__ import annotations

import csv
import dataclasses
import datetime as dt
import io
import os

import pytest
from django.utils import timezone

from dashboards.launch import service
from dashboards.launch import spool as launch_spool
from dashboards.launch import submit
from dashboards.models import AgentDefinition, AuditEntry, Campaign, Task, Team
from dashboards.core.errors import LaunchError
from schedulers.fake import FakeScheduler
from tests.support.accounting import finished_job_records
from tests.support.history import make_campaign, make_task
from tests.support.forms import launch_data

pytestmark = pytest.mark.django_db


# --------------------------------------------------------------------------- 1: zero model API seats

def test_a_campaign_asking_for_no_model_api_seat_is_refused_and_nothing_is_submitted(ops_users, research, agent,
                                                                                      sent, settings):
    """The attack: "model API seats per task" 0 gave a job with no hard resource request, so its
    agents called the model outside the seat limit. Every path (form, urgent page, service,
    retry) goes through the launch check, which refuses it with a message naming the consumable."""
    settings.TCO_SEAT_RESOURCE = "anthropic_api"
    with pytest.raises(LaunchError, match=r"at least 1 .*anthropic_api"):
        service.launch(user=ops_users["launcher"], request=service.LaunchRequest(
            team=research, agent_definition=agent, inputs=[{"task": 1}], name="seatless", seats_per_task=0))
    with pytest.raises(LaunchError, match="at least 1"):
        service.urgent_launch(user=ops_users["urgent"], team=research, agent_definition=agent, input={"task": 1},
                                seats_per_task=0)
    assert not Campaign.objects.exists() and sent == []
    refusals = AuditEntry.objects.filter(ok=False, action__in=("launch", "urgent_launch"))
    assert refusals.count() == 2 and all("at least 1" in e.result for e in refusals)


def test_the_launch_and_urgent_pages_refuse_zero_seats(as_user, sent, settings):
    settings.TCO_SEAT_RESOURCE = "anthropic_api"
    html = as_user("launcher").post("/ops/launch/", {**launch_data(seats_per_task="0"), "launch": "1"}).content.decode()
    assert "at least 1" in html
    urgent = {"agent_definition": AgentDefinition.objects.get(name="demo-agent").pk,
              "team": Team.objects.get(project="research").pk, "queue": "agent.q", "seats_per_task": "0",
              "model": "", "name": "", "input": '{"task": 1}'}
    response = as_user("urgent").post("/ops/urgent/", urgent)
    assert response.status_code == 200 and "at least 1" in response.content.decode()
    assert not Campaign.objects.exists() and sent == []


def test_without_a_seat_consumable_zero_seats_is_still_a_launch(ops_users, research, agent, sent, settings,
                                                                django_capture_on_commit_callbacks):
    """A site that meters no seats (TCO_SEAT_RESOURCE blank) has nothing to bypass."""
    settings.TCO_SEAT_RESOURCE = ""
    with django_capture_on_commit_callbacks(execute=True):
        campaign = service.launch(user=ops_users["launcher"], request=service.LaunchRequest(
            team=research, agent_definition=agent, inputs=[{"task": 1}], name="unmetered", seats_per_task=0)).campaign
    assert campaign.seats_per_task == 0 and len(sent) == 1


# --------------------------------------------------------------------------- 2: adopting another user's job

def test_another_users_job_with_the_campaigns_name_is_not_adopted(claimed, settings):
    """The attack: mallory pre-submits a held job named ``tco-<install>-c<id>-<name>``; the reconciler
    looked the name up across all owners (qstat, the polls' tasks, accounting) and adopted it.
    Only jobs of the submit account count; the campaign is released and submitted afresh."""
    settings.TCO_SUBMIT_USER = "tco"
    name = submit.campaign_job_name(claimed)
    mallory = FakeScheduler(owner="mallory", first_job_number=900)
    mallory.submit_array(dataclasses.replace(submit.campaign_job_spec(claimed), hold=True))
    assert [t.name for t in mallory.list_tasks()] == [name, name]
    for n in (1, 2):  # what a poll recorded of it
        Task.objects.create(cluster=claimed.cluster, job_number=900, task_number=n, is_array=True, name=name,
                            owner="mallory", state="held", submitted_at=timezone.now())
    finished_job_records(claimed, job_number=901, name=name, owner="mallory")

    assert submit.find_campaign_job(claimed, mallory) is None
    assert submit.reconcile_submissions(scheduler=mallory, grace_s=0)["adopted"] == []
    assert Campaign.objects.get(pk=claimed.pk).job_number is None

    # The submit account's own job is still found, in each of the three places.
    ours = FakeScheduler(owner="tco", first_job_number=950)
    ours.submit_array(submit.campaign_job_spec(claimed))
    assert submit.find_campaign_job(claimed, ours) == (950, [1, 2])
    empty = FakeScheduler(owner="tco")
    finished_job_records(claimed, job_number=960, name=name, owner="tco")
    assert submit.find_campaign_job(claimed, empty) == (960, [1, 2])
    Task.objects.create(cluster=claimed.cluster, job_number=955, task_number=1, is_array=True, name=name,
                        owner="tco", state="done", active=False, submitted_at=timezone.now())
    assert submit.find_campaign_job(claimed, empty) == (955, [1, 2])


# --------------------------------------------------------------------------- 3: CSV formula injection

ATTACK = '=HYPERLINK("http://evil.example/x","ok")'


def _csv(response) -> list[list[str]]:
    body = (b"".join(response.streaming_content) if response.streaming else response.content).decode()
    return list(csv.reader(io.StringIO(body)))


@pytest.mark.parametrize("text, cell", [
    (ATTACK, "'" + ATTACK), ("+1+cmd|' /C calc'!A0", "'+1+cmd|' /C calc'!A0"), ("-2+3", "'-2+3"),
    ("@SUM(A1)", "'@SUM(A1)"), ("\t=1", "'\t=1"), ("\r=1", "'\r=1"), ("-inf", "'-inf"),
    ("-0.5", "-0.5"), ("+3", "+3"), ("-1e3", "-1e3"), ("ok", "ok"), ("a=b", "a=b"), ("", ""),
])
def test_a_csv_cell_a_spreadsheet_would_run_is_made_text(text, cell):
    from dashboards.core import csv_export

    out = io.StringIO()
    csv_export.writer(out).writerow([text, -0.5, 3])
    assert next(csv.reader(io.StringIO(out.getvalue()))) == [cell, "-0.5", "3"]


def test_every_csv_export_makes_formulas_text(as_user, ops_users):
    """The attack: an agent's verdict ``=HYPERLINK(...)`` went into the costliest-tasks CSV as a
    formula. Each export (the bill, a campaign's costliest tasks, the audit log) escapes such
    cells; a negative amount stays a number."""
    research = Team.objects.get(project="research")
    launcher = ops_users["launcher"]
    launcher.username = "@SUM(1+1)"   # Django's username validator allows '@', '+', '-'
    launcher.save()
    campaign = make_campaign(team=research, user=launcher, name="sweep")
    start = dt.datetime.combine(timezone.now().date(), dt.time(1), tzinfo=dt.timezone.utc)
    task = make_task(campaign, started_at=start, wallclock_s=12, cost_usd="-0.5", tokens={"output_tokens": 40})
    Task.objects.filter(pk=task.pk).update(verdict=ATTACK)
    client = as_user("lead")

    rows = _csv(client.get("/ops/bills.csv", {"period": "day", "group_by": "launcher"}))
    group = rows[0].index("group")
    assert [r[group] for r in rows[1:]] == ["'@SUM(1+1)"]
    assert rows[1][rows[0].index("cost_usd")] == "-0.5"

    rows = _csv(client.get("/ops/bills.csv", {"period": "day", "view": "tasks", "campaign": campaign.pk}))
    assert rows[0][3] == "verdict" and rows[1][3] == "'" + ATTACK and rows[1][5] == "-0.5"

    AuditEntry.objects.create(user=ops_users["admin"], action="launch", target="-1+cmd", params={}, ok=False,
                              result=ATTACK)
    client.force_login(ops_users["admin"])
    rows = _csv(client.get("/ops/audit.csv"))
    entry = next(r for r in rows[1:] if r[2] == "launch")
    assert entry[3] == "'-1+cmd" and entry[5] == "'" + ATTACK


# --------------------------------------------------------------------------- 5: a server path in an error

def test_an_input_directory_outside_the_root_is_refused_without_the_servers_path(as_user, settings, tmp_path,
                                                                                 caplog):
    """The attack: "input directory '../../../etc' is outside the inputs root /work/review/var/inputs"
    told a launcher where tco lives. The error says which rule was broken; the log keeps the path.
    (The form's help text names the inputs root on purpose: launchers put their files there.)"""
    root = tmp_path / "site-inputs-root"
    (root / "mine").mkdir(parents=True)
    settings.TCO_INPUTS_ROOT = str(root)
    client = as_user("launcher")
    for directory, reason in (("../../../etc", "outside your team&#x27;s folder of the inputs root"),
                              ("missing", "does not exist")):
        caplog.clear()
        with caplog.at_level("WARNING", logger="dashboards.launch.inputs"):
            html = client.post("/ops/launch/", {**launch_data(input_kind="directory", input_directory=directory),
                                                "preview": "1"}).content.decode()
        field = html.split('id="field-input_directory"', 1)[1].split('<div class="field"', 1)[0]
        error = field.split('class="error field-error">', 1)[1].split("</span>", 1)[0]
        assert reason in error and str(tmp_path) not in error
        assert str(root) in caplog.text and directory in caplog.text
    assert not Campaign.objects.exists()


# --------------------------------------------------------------------------- 4: spool file modes

def test_the_doctor_warns_of_a_spool_others_can_enter(tmp_path):
    import getpass

    from schedulers.gridengine import doctor

    spool = tmp_path / "spool"
    spool.mkdir(mode=0o755)
    os.chmod(spool, 0o755)
    me = getpass.getuser()
    cell = doctor.Cell(sge_root=str(tmp_path), sge_cell="default", flavour="ocs9", accounting_path="",
                       submit_user=me, spool_dir=str(spool))
    check = doctor.check_spool(cell)
    assert check.status == doctor.WARN and "0755" in check.detail and f"chmod 700 {spool}" in check.fix
    os.chmod(spool, 0o700)
    assert doctor.check_spool(cell).status == doctor.OK
    other = doctor.Cell(**{**cell.__dict__, "submit_user": "nobody" if me != "nobody" else "root"})
    check = doctor.check_spool(other)
    assert check.status == doctor.WARN and f"owned by {me}" in check.detail and "chown" in check.fix
    fresh = doctor.Cell(**{**cell.__dict__, "spool_dir": str(tmp_path / "new-spool")})
    assert doctor.check_spool(fresh).status == doctor.OK  # made 0700 when missing


def test_the_web_sides_spool_writes_are_private_too(tmp_path, ops_users, research, agent, sent):
    """The spec, inputs, logs and work folders tco's web and workers make: every folder they
    create 0700 (not only the last one, as ``os.makedirs`` would), files 0600."""
    import stat

    from execution.spool.files import write_atomic

    old = os.umask(0o022)
    try:
        write_atomic(tmp_path / "a" / "b" / "c.json", b"{}")
        campaign = service.launch(user=ops_users["launcher"], request=service.LaunchRequest(
            team=research, agent_definition=agent, inputs=[{"task": 1}], name="private")).campaign
        submit.campaign_job_spec(campaign)
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "a" / "b" / "c.json").stat().st_mode) == 0o600
    assert [stat.S_IMODE((tmp_path / d).stat().st_mode) for d in ("a", "a/b")] == [0o700, 0o700]
    layout = launch_spool.spool_layout()
    for path in (layout.spec_path(campaign.pk), layout.inputs_path(campaign.pk)):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, path
    for path in (layout.logs_dir(campaign.pk), layout.work_dir(campaign.pk),
                 os.path.dirname(layout.work_dir(campaign.pk)), os.path.dirname(layout.logs_dir(campaign.pk))):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o700, path
