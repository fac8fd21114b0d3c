"""A crashed execution host's tasks (issue 23, finding 12), from what Grid Engine really showed and wrote.

tests/fixtures/sge819/*lost_host* were captured by scripts/capture-lost-host on the multi-host dev cluster
(SGE 8.1.9): job 125, three `sleep 600` tasks on agent.q@sge-exec1; every process of sge-exec1 killed at
03:15:47 UTC, its queue instance unknown (u) with the tasks still listed running, its execd started again
at 03:16:16; then one accounting line per task: failed 19 ("before writing exit_status"), exit status 0,
all-zero start and end times, 0 s wall clock. tco showed such tasks finishing, then lost, with no reason.
"""
from __future__ import annotations

import datetime as dt
import shutil
from pathlib import Path

import pytest
from django.db.models import Count
from django.utils import timezone

from dashboards.billing import bills
from dashboards.control.actions import campaign_controls
from dashboards.core.clusters import cluster_get_default
from dashboards.core.failures import failure_of
from dashboards.ingest.accounting import ingest_accounting
from dashboards.ingest.poll import apply_qstat_poll, reconcile_gone_tasks
from dashboards.launch.service import LaunchRequest, launch
from dashboards.launch.submit import campaign_adopt
from dashboards.live.campaign import campaign_detail
from dashboards.live.task import task_detail
from dashboards.models import AccountingRecord, AgentDefinition, AuditEntry, Campaign, Task, Team
from schedulers.gridengine.parsers.accounting import parse_line
from schedulers.gridengine.parsers.qstat import parse_qstat
from schedulers.hosts import mark_unreachable, parse_queue_instances, unreachable_hosts

pytestmark = pytest.mark.django_db

SGE = Path(__file__).resolve().parent.parent / "fixtures" / "sge819"
JOB = 125
SUBMITTED = dt.datetime(2026, 12, 2, 3, 15, 46, tzinfo=dt.timezone.utc)
CRASH = dt.datetime(2026, 12, 2, 3, 15, 47, tzinfo=dt.timezone.utc)
WORDS = "execution host sge-exec1 was lost: the job's shepherd died before it wrote the exit status"


def accounting_lines() -> list[str]:
    return [line for line in (SGE / "accounting_lost_host").read_text().splitlines() if not line.startswith("#")]


def test_the_captured_lines_are_read_as_the_hosts_failed_19_records():
    for line in accounting_lines():
        record = parse_line(line.encode())
        assert (record.job_number, record.hostname, record.failed, record.exit_status) == (JOB, "sge-exec1", 19, 0)
        assert record.started_at is None and record.ended_at is None and record.wallclock_s == 0.0
    assert sorted(parse_line(line.encode()).task_number for line in accounting_lines()) == [1, 2, 3]


@pytest.fixture
def crashed(ops_users, bootstrap, tmp_path, monkeypatch):  # noqa: F811
    """A campaign of research whose job 125 ran tasks 1-3 on sge-exec1 (as captured) and task 4 elsewhere
    (it failed on its own: exit status 3), with the captured snapshots applied up to the host's crash."""
    from dashboards.core import enqueue

    monkeypatch.setattr(enqueue, "send", lambda *a, **k: None)
    research = Team.objects.get(project="research")
    campaign = launch(user=ops_users["launcher"], request=LaunchRequest(
        team=research, agent_definition=AgentDefinition.objects.get(name="demo-agent"),
        inputs=[{"task": n} for n in (1, 2, 3, 4)], name="lost")).campaign
    assert campaign_adopt(campaign, JOB, [1, 2, 3, 4], job_name="fx_lost_host")
    # As if submitted when the capture's job was (the rows say when DRMAA returned).
    adopted = SUBMITTED + dt.timedelta(seconds=0.3)
    Campaign.objects.filter(pk=campaign.pk).update(launched_at=SUBMITTED, submitted_at=adopted)
    Task.objects.filter(campaign=campaign).update(submitted_at=adopted, first_seen_at=adopted)
    cluster = cluster_get_default()
    acct = tmp_path / "accounting"
    acct.write_text("# Version: 8.1.9\n# \n# DO NOT MODIFY THIS FILE MANUALLY!\n# \n")
    cluster.accounting_path = str(acct)
    cluster.save(update_fields=["accounting_path"])
    running = parse_qstat((SGE / "qstat_xml_lost_host_running.xml").read_bytes())
    assert {(t.task_number, t.state, t.host) for t in running} == {(n, "running", "sge-exec1") for n in (1, 2, 3)}
    apply_qstat_poll(cluster, running, observed_at=CRASH - dt.timedelta(seconds=0.5))
    Task.objects.filter(campaign=campaign, task_number=4).update(state="failed", active=False, host="sge-exec2",
                                                                 failed_code=0, exit_status=3)
    unknown = parse_qstat((SGE / "qstat_xml_lost_host_unknown.xml").read_bytes())
    lost = unreachable_hosts(parse_queue_instances((SGE / "qstat_f_lost_host_unknown.xml").read_bytes()))
    assert lost == {"sge-exec1"} and mark_unreachable(unknown, lost) == 3
    apply_qstat_poll(cluster, unknown, observed_at=CRASH + dt.timedelta(seconds=20))
    assert set(Task.objects.filter(campaign=campaign, task_number__lte=3).values_list("state", flat=True)) == {"unknown"}
    return {"campaign": campaign, "cluster": cluster, "acct": acct, "users": ops_users}


def _host_back(crashed, *, accounting_first: bool) -> None:
    """The host back: qstat no longer lists the tasks and the accounting file has the captured lines, read in
    either order; then the reconciler, well past the lost grace."""
    cluster, acct = crashed["cluster"], crashed["acct"]
    def accounting() -> None:
        shutil.copyfile(SGE / "accounting_lost_host", acct)
        assert ingest_accounting(cluster).accepted == 3

    def qstat() -> None:
        apply_qstat_poll(cluster, [], observed_at=CRASH + dt.timedelta(seconds=35))

    for step in ((accounting, qstat) if accounting_first else (qstat, accounting)):
        step()
    reconcile_gone_tasks(cluster, now=timezone.now() + dt.timedelta(hours=1))


@pytest.mark.parametrize("accounting_first", [False, True], ids=["qstat-first", "accounting-first"])
def test_a_crashed_hosts_tasks_end_failed_with_the_host_and_the_reason(crashed, accounting_first):
    _host_back(crashed, accounting_first=accounting_first)
    campaign, admin = crashed["campaign"], crashed["users"]["admin"]
    tasks = {t.task_number: t for t in Task.objects.filter(campaign=campaign)}
    assert len(tasks) == 4 == Task.objects.filter(job_number=JOB).count()
    for n in (1, 2, 3):
        task = tasks[n]
        assert (task.state, task.active, task.host, task.failed_code, task.exit_status) == (
            "failed", False, "sge-exec1", 19, 0)
        assert task.started_at is not None and task.ended_at is not None  # qstat's start; the end tco saw
        failure = task_detail(admin, task.pk)["task"]["failure"]
        assert failure == {"kind": "infrastructure",
                           "text": f"{WORDS} (accounting: failed 19, before writing exit_status)"}
        assert AccountingRecord.objects.get(task=task).failed == 19
    detail = campaign_detail(admin, campaign.pk)
    assert detail["states"]["failed"] == 4 and detail["states"]["lost"] == 0
    assert detail["infrastructure_failures"] == 3
    row = next(t for t in detail["tasks"] if t["task_number"] == 1)
    assert row["failure"]["text"].startswith(WORDS)
    assert next(t for t in detail["tasks"] if t["task_number"] == 4)["failure"] == {
        "kind": "agent", "text": "the agent exited with status 3 on sge-exec2"}


def test_the_campaign_retries_the_tasks_the_host_lost_in_one_action(crashed, client):
    _host_back(crashed, accounting_first=False)
    campaign, launcher = crashed["campaign"], crashed["users"]["launcher"]
    states = dict(Task.objects.filter(campaign=campaign).values_list("state").annotate(n=Count("id")).order_by())
    controls = campaign_controls(campaign, states)
    assert controls["retry"] == {"count": 4, "why": ""}
    assert controls["retry_infrastructure"] == {"count": 3, "why": ""}
    client.force_login(launcher)
    page = client.get(f"/ops/campaigns/{campaign.pk}/").content.decode()
    assert 'id="control-retry-infrastructure"' in page and "Retry the 3 tasks the infrastructure failed" in page
    url = f"/ops/campaigns/{campaign.pk}/control"
    confirm = client.post(url, {"action": "retry_infrastructure"}).content.decode()
    assert "This launches the 3 tasks the infrastructure failed" in confirm
    done = client.post(url, {"action": "retry_infrastructure", "confirm": "on"})
    retry = Campaign.objects.get(retry_of=campaign)
    assert done.status_code == 302 and done["Location"] == f"/ops/campaigns/{retry.pk}/"
    assert retry.task_count == 3 and retry.name == "lost-retry"
    from dashboards.launch.service import campaign_inputs

    assert campaign_inputs(retry) == [{"task": 1}, {"task": 2}, {"task": 3}]  # not task 4, the agent's own failure
    entry = AuditEntry.objects.filter(action="campaign_retry", ok=True).latest("id")
    assert entry.user == launcher


def test_the_lost_hosts_tasks_are_billed_from_their_accounting_records(crashed):
    """The records say 0 s of wall clock (qacct -j: ru_wallclock 0s): the bill says the same, and counts the
    three tasks as finished (failed) in the period of their start."""
    _host_back(crashed, accounting_first=True)
    campaign = crashed["campaign"]
    day = SUBMITTED.date()
    result = bills.bill(teams=[campaign.team], period="day", first=day, last=day, group_by="campaign",
                        campaign=campaign.pk)
    (row,) = [r for r in result["rows"] if r["launched_by_tco"]]
    qacct = [line.split()[1] for line in (SGE / "qacct_j_lost_host.txt").read_text().splitlines()
             if line.startswith("ru_wallclock")]
    assert qacct == ["0s", "0s", "0s"]
    assert row["wallclock_s"] == 0.0 and row["finished_tasks"] == 3  # task 4 never showed a start


def test_failure_words_for_each_kind():
    assert failure_of(state="failed", failed_code=19, exit_status=0, host="h1").text.startswith(
        "execution host h1 was lost: the job's shepherd died before it wrote the exit status")
    assert failure_of(state="failed", failed_code=28, exit_status=0, host="h1").kind == "infrastructure"
    assert failure_of(state="failed", failed_code=37, exit_status=0, host="h1").kind == "limit"
    assert failure_of(state="failed", failed_code=100, exit_status=137, host="h1").kind == "ended"
    assert failure_of(state="failed", failed_code=0, exit_status=3, host="h1").kind == "agent"
    assert failure_of(state="lost", failed_code=None, exit_status=None).kind == "infrastructure"
    assert failure_of(state="done", failed_code=0, exit_status=0) is None


def _before_prolog_lines() -> str:
    """The captured lines as an execd writes them for jobs whose shepherd had not written its pid file when
    the host crashed (CI, 2026-12-03: ``failed`` 7, "before prolog", all-zero times; the rest as captured)."""
    out = []
    for line in accounting_lines():
        fields = line.split(":")
        assert fields[11] == "19"
        fields[11] = "7"
        out.append(":".join(fields))
    return "# Version: 8.1.9\n" + "\n".join(out) + "\n"


def test_a_host_crashed_before_its_shepherds_wrote_their_pids_ends_its_tasks_failed(crashed):
    # They stayed finishing, then "lost: ... no accounting record came", though the host's records had come.
    cluster, acct, campaign = crashed["cluster"], crashed["acct"], crashed["campaign"]
    apply_qstat_poll(cluster, [], observed_at=CRASH + dt.timedelta(seconds=35))
    acct.write_text(_before_prolog_lines())
    assert ingest_accounting(cluster).accepted == 3
    reconcile_gone_tasks(cluster, now=timezone.now() + dt.timedelta(hours=1))
    for n in (1, 2, 3):
        task = Task.objects.get(campaign=campaign, task_number=n)
        assert (task.state, task.host, task.failed_code) == ("failed", "sge-exec1", 7)
        failure = task_detail(crashed["users"]["admin"], task.pk)["task"]["failure"]
        assert failure == {"kind": "infrastructure",
                           "text": "the scheduler failed the task on sge-exec1 before the prolog (accounting: failed 7)"}
    assert campaign_detail(crashed["users"]["admin"], campaign.pk)["infrastructure_failures"] == 3


def test_a_failed_7_record_of_a_host_never_seen_lost_does_not_end_the_task_it_runs(crashed):
    # An earlier start that failed on the same host also writes failed 7 with zero times: without the host
    # seen lost while the task ran, that record is not the end of the run qstat showed.
    from dashboards.models import TaskEvent

    cluster, acct, campaign = crashed["cluster"], crashed["acct"], crashed["campaign"]
    TaskEvent.objects.filter(task__campaign=campaign, to_state="unknown").delete()
    apply_qstat_poll(cluster, [], observed_at=CRASH + dt.timedelta(seconds=35))
    acct.write_text(_before_prolog_lines())
    assert ingest_accounting(cluster).accepted == 3
    states = set(Task.objects.filter(campaign=campaign, task_number__lte=3).values_list("state", flat=True))
    assert states == {"finishing"}
