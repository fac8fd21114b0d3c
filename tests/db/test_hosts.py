"""Execution hosts: qstat -f parsing, host states, tasks on a lost host, and a poll's cost in N hosts.

Fixtures in tests/fixtures/multihost were recorded on the dev cluster's cell
with three execution hosts (scripts/dev-cluster --cell mh): mh-exec1's execd
killed (instance state ``u``), agent.q@mh-exec2 disabled (``d``) and a load
threshold of 0.1 on classic.q@mh-exec3 (``a``).
"""
from __future__ import annotations

import contextlib
import datetime as dt
from pathlib import Path

import pytest

from schedulers.base import QstatTask
from schedulers.fake import FakeScheduler
from schedulers.hosts import (
    QSTAT_F_ARGV,
    parse_queue_instances,
)
from schedulers.gridengine.parsers.qhost import parse_qhost

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "multihost"


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


@pytest.mark.django_db
def test_one_round_of_scheduler_commands_per_poll_whatever_the_number_of_hosts(bootstrap, monkeypatch):
    import schedulers.gridengine.adapter as gridengine
    import worker.tasks as tasks
    from dashboards.models import Task

    @contextlib.contextmanager
    def always_mine(name, timeout):
        yield True

    monkeypatch.setattr(tasks, "single_flight", always_mine)
    monkeypatch.setattr("dashboards.core.realtime.queue_changed", lambda *a, **k: None)
    rounds = {}
    for n_hosts in (1, 3, 40):
        recorder = Recorder(n_hosts)
        monkeypatch.setattr(gridengine, "run_command", recorder)
        gridengine._PROJECTS.clear()
        Task.objects.all().delete()
        from dashboards.ingest import poll
        poll._SNAPSHOTS.clear()
        tasks.poll_queue()
        first = list(recorder.calls)
        recorder.calls.clear()
        tasks.poll_queue()
        second = list(recorder.calls)
        recorder.calls.clear()
        tasks.poll_cluster_status()
        rounds[n_hosts] = (first, second, list(recorder.calls))
        # The poll saw every host: one running task per host, the first host's tasks unknown.
        assert Task.objects.count() == n_hosts
        assert set(Task.objects.values_list("host", flat=True)) == set(recorder.hosts)
        assert list(Task.objects.filter(state="unknown").values_list("host", flat=True)) == ["node001"]
    assert rounds[1] == rounds[3] == rounds[40]
    first, second, status = rounds[40]
    # A first poll asks qstat -ext once for the new job's project; later polls do not.
    assert len(first) == 3 and len(second) == 2
    assert tuple(QSTAT_F_ARGV) in second and ("qstat", "-xml", "-u", "*") in second
    assert len(status) == 8  # qstat -g c, qhost, qquota, qconf -se, qstat -f, sge_share_mon, qconf -sq, qrstat


@pytest.mark.django_db
def test_a_rerunnable_launch_reaches_the_submission(bootstrap, django_user_model):
    from dashboards.launch.service import LaunchRequest, launch
    from dashboards.models import AgentDefinition, AuditEntry, Campaign, Team
    from dashboards.core.errors import LaunchError
    from dashboards.launch.submit import campaign_submit

    admin = django_user_model.objects.get(username="admin")
    team = Team.objects.get(project="research")
    agent = AgentDefinition.objects.get(name="demo-agent")
    outcome = launch(user=admin, request=LaunchRequest(team=team, agent_definition=agent, name="rr",
                                                       inputs=[{"task": 1}], rerunnable=True))
    fake = FakeScheduler()
    campaign_submit(campaign_id=outcome.campaign.pk, scheduler=fake)
    [(_, spec)] = fake.submissions
    assert spec.rerunnable is True and Campaign.objects.get(pk=outcome.campaign.pk).rerunnable
    assert AuditEntry.objects.filter(params__rerunnable=True).exists()
    plain = launch(user=admin, request=LaunchRequest(team=team, agent_definition=agent, name="plain",
                                                     inputs=[{"task": 1}]))
    campaign_submit(campaign_id=plain.campaign.pk, scheduler=fake)
    assert fake.submissions[-1][1].rerunnable is False
    with pytest.raises(LaunchError, match="rerunnable"):
        launch(user=admin, request=LaunchRequest(team=team, agent_definition=agent, name="bad",
                                                 inputs=[{"task": 1}], rerunnable="y"))
    assert not Campaign.objects.filter(name="bad").exists()


@pytest.mark.django_db
def test_the_queue_summary_shows_each_host_its_state_and_its_visible_tasks(bootstrap, django_user_model):
    from dashboards.live import queue
    from dashboards.models import Cluster, Team
    from dashboards.core.clusters import cluster_get_default
    from tests.support.campaigns import make_campaign

    admin = django_user_model.objects.get(username="admin")
    cluster = cluster_get_default()
    Cluster.objects.filter(pk=cluster.pk).update(status={
        "queues": [], "quotas": [], "global_capacity": {},
        "hosts": parse_qhost(fixture("qhost_F_unknown.xml")),
        "queue_instances": parse_queue_instances(fixture("qstat_f_alarm.xml"))})
    team = Team.objects.get(project="research")
    make_campaign(team=team, user=admin, name="on-hosts", job_number=7, tasks=[
        {"state": "unknown", "state_code": "ru", "host": "mh-exec1"},
        {"state": "unknown", "state_code": "ru", "host": "mh-exec1"},
        {"state": "running", "state_code": "r", "host": "mh-exec2"},
        {"state": "done", "host": "mh-exec2"},  # ended: not on the host any more
        {"state": "pending"}])
    summary = queue.queue_summary(admin)
    [c] = summary["clusters"]
    hosts = {h["name"]: h for h in c["hosts"]}
    assert {n: h["state"] for n, h in hosts.items()} == {"mh-exec1": "unreachable", "mh-exec2": "disabled",
                                                         "mh-exec3": "alarm"}
    assert hosts["mh-exec1"]["tasks"]["count"] == 2
    assert [t["task_id"] for t in hosts["mh-exec1"]["tasks"]["shown"]] == ["7.1", "7.2"]
    assert hosts["mh-exec2"]["tasks"]["count"] == 1 and hosts["mh-exec3"]["tasks"] == {"count": 0, "shown": []}
    assert [p["name"] for p in c["problems"]] == ["agent.q@mh-exec1", "agent.q@mh-exec2", "classic.q@mh-exec3"]
    assert any("np_load_avg" in why for why in hosts["mh-exec3"]["why"])


@pytest.mark.django_db
def test_a_viewer_sees_no_task_of_another_team_on_a_host(bootstrap, django_user_model):
    from dashboards.live import cluster as live_cluster
    from dashboards.models import Cluster, Team
    from dashboards.core.clusters import cluster_get_default
    from tests.support.campaigns import make_campaign

    admin = django_user_model.objects.get(username="admin")
    outsider = django_user_model.objects.create_user("outsider", password="x-1-long-enough")
    cluster = cluster_get_default()
    Cluster.objects.filter(pk=cluster.pk).update(status={
        "hosts": parse_qhost(fixture("qhost_F_ok.xml")), "queue_instances": []})
    make_campaign(team=Team.objects.get(project="research"), user=admin, name="secret", job_number=8,
                  tasks=[{"state": "running", "state_code": "r", "host": "mh-exec1"}])
    hosts = {h["name"]: h for h in live_cluster.cluster_hosts(cluster_get_default(), outsider)["hosts"]}
    assert hosts["mh-exec1"]["tasks"] == {"count": 0, "shown": []}
    hosts = {h["name"]: h for h in live_cluster.cluster_hosts(cluster_get_default(), admin)["hosts"]}
    assert hosts["mh-exec1"]["tasks"]["count"] == 1


@pytest.mark.django_db
def test_the_campaign_page_filters_tasks_by_host(bootstrap, django_user_model, client):
    from dashboards.live import campaign as live_campaign
    from dashboards.models import Team
    from tests.support.campaigns import make_campaign

    admin = django_user_model.objects.get(username="admin")
    campaign = make_campaign(team=Team.objects.get(project="research"), user=admin, name="by-host", job_number=9,
                             tasks=[{"state": "running", "state_code": "r", "host": "h1"},
                                    {"state": "failed", "host": "h2"},
                                    {"state": "done", "host": "h1"},
                                    {"state": "pending"}])
    detail = live_campaign.campaign_detail(admin, campaign.pk, host="h1")
    assert [t["task_number"] for t in detail["tasks"]] == [1, 3]
    assert detail["hosts"] == [{"host": "h1", "tasks": 2}, {"host": "h2", "tasks": 1}]
    assert detail["host_filter"] == "h1"
    assert [t["task_number"] for t in live_campaign.campaign_detail(admin, campaign.pk, host="h1", state="done")["tasks"]] \
        == [3]
    assert [t["task_number"] for t in live_campaign.campaign_detail(admin, campaign.pk)["tasks"]] == [2, 1, 3, 4]
    client.force_login(admin)
    page = client.get(f"/campaigns/{campaign.pk}/", {"host": "h2"})
    assert page.status_code == 200 and page.context["detail"]["host_filter"] == "h2"
    assert [t["task_number"] for t in page.context["detail"]["tasks"]] == [2]
    # Not a host name (a cache-key or markup injection attempt): no filter at all.
    page = client.get(f"/campaigns/{campaign.pk}/", {"host": "h1:*:x <b>"})
    assert page.context["detail"]["host_filter"] is None and len(page.context["detail"]["tasks"]) == 4


@pytest.mark.django_db
def test_the_record_of_a_rescheduled_attempt_never_ends_the_rerun_task(tmp_path):
    from dashboards.ingest.poll import apply_qstat_poll
    from dashboards.ingest.accounting import ingest_accounting
    from dashboards.models import AccountingRecord, Task
    from dashboards.core.clusters import cluster_get_default
    from tests.support.accounting import HEADER, colon_line

    cluster = cluster_get_default()
    acct = tmp_path / "accounting"
    acct.write_bytes(HEADER)
    t0 = dt.datetime.fromtimestamp(1764417600, dt.timezone.utc)
    submitted = t0 - dt.timedelta(seconds=3)

    def seen(code, host, started):
        return QstatTask(job_number=600, task_number=1, name="x", owner="tco", project="research",
                         state={"r": "running", "ru": "unknown", "Rq": "pending", "Rr": "running"}[code],
                         state_code=code, restarted="R" in code, queue="agent.q" if host else None, host=host,
                         slots=1, submitted_at=submitted, started_at=started, priority=0.5)

    apply_qstat_poll(cluster, [seen("r", "h1", t0)], observed_at=t0)
    apply_qstat_poll(cluster, [seen("ru", "h1", t0)], observed_at=t0 + dt.timedelta(seconds=30))
    assert Task.objects.get().state == "unknown"
    # Rescheduled: qmaster writes the first attempt's record (failed 25, all-zero times); pending again.
    rescheduled = line_with(colon_line(600, 1, failed=25, start=0, wall=0), {1: "h1", 8: "0"})
    with open(acct, "ab") as fh:
        fh.write(rescheduled)
    ingest_accounting(cluster, path=str(acct))
    apply_qstat_poll(cluster, [seen("Rq", None, None)], observed_at=t0 + dt.timedelta(seconds=60))
    t2 = t0 + dt.timedelta(seconds=62)
    apply_qstat_poll(cluster, [seen("Rr", "h2", t2)], observed_at=t2)
    # The second attempt ends and leaves qstat before its record is read: not "failed" from the old record.
    apply_qstat_poll(cluster, [], observed_at=t2 + dt.timedelta(seconds=10))
    task = Task.objects.get()
    assert (task.state, task.active) == ("finishing", True)
    with open(acct, "ab") as fh:
        # The rerun's qsub_time is when the qmaster rescheduled it (seen on SGE 8.1.9), not the job's.
        fh.write(line_with(colon_line(600, 1, start=int(t2.timestamp()), wall=5),
                           {1: "h2", 8: str(int(t2.timestamp()) - 2)}))
    ingest_accounting(cluster, path=str(acct))
    task = Task.objects.get()  # one task: the rerun's record did not make a second one
    assert (task.state, task.host, task.exit_status, task.active) == ("done", "h2", 0, False)
    assert sorted(AccountingRecord.objects.filter(task=task).values_list("failed", "hostname")) == [
        (0, "h2"), (25, "h1")]


@pytest.mark.django_db
def test_a_rerun_that_ran_between_two_polls_is_still_one_task(tmp_path):
    from dashboards.ingest.poll import apply_qstat_poll
    from dashboards.ingest.accounting import ingest_accounting
    from dashboards.models import AccountingRecord, Task
    from dashboards.core.clusters import cluster_get_default
    from tests.support.accounting import HEADER, colon_line

    cluster = cluster_get_default()
    acct = tmp_path / "accounting"
    t0 = dt.datetime.fromtimestamp(1764417600, dt.timezone.utc)
    task = QstatTask(job_number=601, task_number=1, name="x", owner="tco", project="research", state="running",
                     state_code="r", restarted=False, queue="agent.q", host="h1", slots=1,
                     submitted_at=t0 - dt.timedelta(seconds=3), started_at=t0, priority=0.5)
    apply_qstat_poll(cluster, [task], observed_at=t0)
    # tco never saw the R: the rerun started and ended between polls; both records come in one read.
    apply_qstat_poll(cluster, [], observed_at=t0 + dt.timedelta(seconds=120))
    rerun_start = int(t0.timestamp()) + 70
    acct.write_bytes(HEADER + line_with(colon_line(601, 1, failed=25, start=0, wall=0), {1: "h1", 8: "0"})
                     + line_with(colon_line(601, 1, start=rerun_start, wall=5), {1: "h2", 8: str(rerun_start - 1)}))
    ingest_accounting(cluster, path=str(acct))
    [only] = Task.objects.all()
    assert (only.state, only.host) == ("done", "h2")
    assert AccountingRecord.objects.filter(task=only).count() == 2


class Recorder:
    """Stands in for schedulers.gridengine.adapter.run_command: answers for a cluster of N hosts, records each argv."""

    def __init__(self, n_hosts: int) -> None:
        self.hosts = [f"node{i:03d}" for i in range(1, n_hosts + 1)]
        self.calls: list[tuple[str, ...]] = []

    def __call__(self, argv, *, timeout=10.0, env_extra=None) -> bytes:
        argv = tuple(argv)
        self.calls.append(argv)
        sge819 = FIXTURES.parent / "sge819"
        if argv == tuple(QSTAT_F_ARGV):
            return _qstat_f(self.hosts)
        if argv[:2] == ("qstat", "-xml") and "-ext" in argv:
            return _qstat_ext(self.hosts)
        if argv[:2] == ("qstat", "-xml"):
            return _qstat_jobs(self.hosts)
        if argv[:3] == ("qstat", "-g", "c"):
            return (sge819 / "qstat_g_c.xml").read_bytes()
        if argv[0] == "qhost":
            return _qhost(self.hosts)
        if argv[0] == "qquota":
            return (sge819 / "qquota.xml").read_bytes()
        if argv[:2] == ("qconf", "-se"):
            return b"hostname global\ncomplex_values anthropic_api=96\n"
        if argv == ("qconf", "-sq", "*"):  # queue calendars (schedulers.calendars): none here
            return b"qname agent.q\ncalendar NONE\nqname classic.q\ncalendar NONE\n"
        if argv[0].endswith("sge_share_mon"):
            return (sge819 / "sge_share_mon_n.txt").read_bytes()
        if argv == ("qrstat", "-u", "*", "-xml"):  # issue 17: no advance reservation
            return (sge819 / "qrstat_empty.xml").read_bytes()
        raise AssertionError(f"unexpected command {argv}")


def line_with(line: bytes, fields: dict[int, str]) -> bytes:
    """An accounting line with some of its colon-separated fields replaced (by index)."""
    parts = line.rstrip(b"\n").split(b":")
    for index, value in fields.items():
        parts[index] = value.encode()
    return b":".join(parts) + b"\n"


def _qstat_jobs(hosts: list[str]) -> bytes:
    rows = "".join(
        f"<job_list state=\"running\"><JB_job_number>50</JB_job_number><JAT_prio>0.5</JAT_prio>"
        f"<JB_name>tco-inst1-c1-x</JB_name><JB_owner>tco</JB_owner><state>r</state>"
        f"<JAT_start_time>2026-12-01T10:00:00</JAT_start_time><queue_name>agent.q@{h}</queue_name>"
        f"<slots>1</slots><tasks>{i}</tasks></job_list>" for i, h in enumerate(hosts, 1))
    return f"<?xml version='1.0'?><job_info><queue_info>{rows}</queue_info><job_info></job_info></job_info>".encode()


def _qstat_ext(hosts: list[str]) -> bytes:
    return _qstat_jobs(hosts).replace(b"<JB_owner>", b"<JB_project>research</JB_project><JB_owner>")


def _qstat_f(hosts: list[str]) -> bytes:
    rows = "".join(f"<Queue-List><name>agent.q@{h}</name><qtype>B</qtype><slots_used>1</slots_used>"
                   f"<slots_resv>0</slots_resv><slots_total>32</slots_total><load_avg>0.5</load_avg>"
                   f"<arch>lx-amd64</arch>{'<state>u</state>' if i == 1 else ''}</Queue-List>"
                   for i, h in enumerate(hosts, 1))
    return f"<?xml version='1.0'?><job_info><queue_info>{rows}</queue_info><job_info></job_info></job_info>".encode()


def _qhost(hosts: list[str]) -> bytes:
    rows = "".join(f"<host name='{h}'><hostvalue name='arch_string'>lx-amd64</hostvalue>"
                   f"<hostvalue name='num_proc'>2</hostvalue><hostvalue name='load_avg'>0.5</hostvalue>"
                   f"<hostvalue name='mem_total'>1.0G</hostvalue><hostvalue name='mem_used'>0.5G</hostvalue>"
                   f"</host>" for h in hosts)
    return f"<?xml version='1.0'?><qhost><host name='global'></host>{rows}</qhost>".encode()
