"""Several execution hosts, for real: a campaign spread over the agent hosts, and a host lost mid-campaign.

Runs against the cell the environment names (``SGE_ROOT``/``SGE_CELL`` and,
for a cell on its own ports, ``SGE_QMASTER_PORT``/``SGE_EXECD_PORT``), made
by ``scripts/dev-cluster`` with execution hosts in namespaces; run it through
``scripts/test``, which also starts ``scripts/cluster-faults`` (the root
helper that takes a host's execd down and up for the submit account).
Host names are read from the cluster, never assumed. What the database shows
is checked against ``qstat``, ``qacct`` and the accounting file themselves,
read here with regexes and ``split(":")``, not with tco's parsers.
"""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model
from django.utils import timezone

from dashboards.live import cluster as live_cluster
from dashboards.ingest.poll import apply_qstat_poll
from dashboards.ingest.accounting import ingest_accounting
from dashboards.ingest.runner_records import ingest_runner_records
from dashboards.models import AccountingRecord, AgentDefinition, Campaign, Task, Team
from dashboards.core.clusters import cluster_get_default, scheduler_for
from dashboards.ingest.cluster_status import cluster_status_refresh
from dashboards.launch.service import LaunchRequest
from dashboards.launch.service import launch as launch_request
from dashboards.launch.submit import campaign_job_spec, campaign_submit
from schedulers.hosts import tasks_with_host_states
from tests.sge_env import sge_env
from tests.support.hosts import agent_hosts, fault, qstat_tasks, queue_instances, wait_runners_started

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

TERMINAL = ("done", "failed", "deleted", "lost")


def accounting_lines(job: int) -> list[list[str]]:
    """Every accounting line of ``job`` (one per attempt), split on ':' (SGE 8 format)."""
    lines = []
    for raw in Path(cluster_get_default().accounting_path).read_text(errors="replace").splitlines():
        fields = raw.split(":")
        if not raw.startswith("#") and len(fields) > 35 and fields[5] == str(job):
            lines.append(fields)
    return lines


def qacct_count(job: int) -> int:
    """How many accounting records ``qacct -j JOB`` prints (one ``====`` block each)."""
    out = subprocess.run(["qacct", "-j", str(job)], capture_output=True, text=True, timeout=60,
                         env=sge_env(settings.SGE_ROOT, settings.SGE_CELL, LC_ALL="C")).stdout
    return sum(1 for line in out.splitlines() if line.startswith("====="))


@pytest.fixture
def hosts(sge_cluster):
    names, slots = agent_hosts()
    if len(names) < 2:
        pytest.skip(f"agent.q spans {names}: this cluster has one agent host (scripts/dev-cluster --exec-hosts 0 "
                    f"or 1); the multi-host tests need at least two")
    return names, slots


def drive(cluster, scheduler) -> None:
    """One round of what the workers do: poll (with host states), ingest accounting and runner records, status."""
    apply_qstat_poll(cluster, tasks_with_host_states(scheduler), observed_at=timezone.now())
    ingest_accounting(cluster)
    ingest_runner_records(cluster)
    cluster_status_refresh(cluster=cluster, scheduler=scheduler)


def drive_until(cluster, scheduler, done, timeout: float, failure, each=None) -> None:
    """:func:`drive` every 0.5 s until ``done()`` is true (``each()``, a check, runs after every round);
    after ``timeout`` seconds fail with the message ``failure()``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        drive(cluster, scheduler)
        if each is not None:
            each()
        if done():
            return
        time.sleep(0.5)
    pytest.fail(failure())


def campaign_over(campaign: Campaign, job: int):
    """A condition for :func:`drive_until`: no task of ``campaign`` is active in tco, none of ``job`` in qstat."""
    return lambda: not Task.objects.filter(campaign=campaign, active=True).exists() and not qstat_tasks(job)


def host_unknown(host: str):
    """A condition for :func:`drive_until`: every queue instance on ``host`` is in state u."""
    return lambda: all("u" in s for q, (s, _) in queue_instances().items() if q.endswith("@" + host))


def launch(name: str, inputs: list[dict], **options) -> Campaign:
    user = get_user_model().objects.get(username="admin")
    campaign = launch_request(user=user, request=LaunchRequest(
        team=Team.objects.get(project="research"), agent_definition=AgentDefinition.objects.get(name="demo-agent"),
        inputs=inputs, name=name, **options)).campaign
    campaign = campaign_submit(campaign_id=campaign.pk)
    assert campaign.status == "submitted", campaign.submit_error
    return campaign


def wait_all_running(cluster, scheduler, job: int, count: int) -> dict[int, str]:
    """Drive tco until qstat shows all ``count`` tasks of ``job`` running; their hosts by task number."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        drive(cluster, scheduler)
        seen = qstat_tasks(job)
        if len(seen) == count and all("r" in s and h for s, h in seen.values()):
            return {n: h for n, (_, h) in seen.items()}
        time.sleep(0.5)
    pytest.fail(f"the {count} tasks did not all start: {qstat_tasks(job)}")


def test_a_campaign_spreads_over_every_agent_host_and_is_all_ingested(bootstrap, hosts):
    names, slots = hosts
    # agent.q fills the least loaded host first (queue_sort_method seqno, then load): with one task more than
    # all but one host can hold at once, every agent host must run some.
    n_tasks = slots * (len(names) - 1) + 1
    cluster = cluster_get_default()
    scheduler = scheduler_for(cluster)
    campaign = launch("spread", [{"task": n, "duration_s": 8.0} for n in range(1, n_tasks + 1)])
    job = campaign.job_number
    drive_until(cluster, scheduler, campaign_over(campaign, job), 600, lambda: (
        f"the campaign did not finish: {sorted(Task.objects.filter(campaign=campaign).values_list('state'))}"))
    drive(cluster, scheduler)  # runner records written last

    lines = accounting_lines(job)
    by_task = {int(f[35]): f for f in lines}
    assert len(lines) == len(by_task) == n_tasks  # one attempt each: nothing lost, nothing doubled
    assert {f[1] for f in lines} == set(names)  # every agent host ran some
    assert qacct_count(job) == n_tasks
    tasks = list(Task.objects.filter(campaign=campaign).order_by("task_number"))
    assert [t.task_number for t in tasks] == list(range(1, n_tasks + 1))
    for t in tasks:
        f = by_task[t.task_number]
        assert (t.state, t.host, t.queue, t.exit_status) == ("done", f[1], f[0], int(f[12]))
        assert t.task_started_at is not None and t.agent_exited_at is not None, t.task_number  # the runner's record
    assert AccountingRecord.objects.filter(job_number=job).count() == n_tasks


def test_each_agent_host_gives_its_jobs_a_tmpdir_of_its_own(hosts, tmp_path):
    # The namespaces share one file system. With one /tmp, the execd of a lost host that came back
    # removed its old job's TMPDIR (/tmp/<job>.<task>.<queue>), by then the TMPDIR of the same task
    # rerun on another host: the rerun's runner lost its private directory and its tasks failed (CI,
    # the rerun test below). A real host's /tmp is its own; scripts/dev-cluster sets each host's.
    from tests.support.cluster import qdel_quietly

    names, _ = hosts
    tmp_path.chmod(0o755)
    script = tmp_path / "tmpdir.sh"
    script.write_text('echo "TMPDIR=$TMPDIR"\n')
    env = sge_env(settings.SGE_ROOT, settings.SGE_CELL, LC_ALL="C")
    jobs, outs = [], {}
    try:
        for host in names:
            outs[host] = tmp_path / f"{host}.out"
            submitted = subprocess.run(
                ["qsub", "-terse", "-P", "research", "-q", f"agent.q@{host}", "-S", "/bin/sh", "-j", "y", "-o",
                 str(outs[host]), "-N", "tmpdir-probe", str(script)],
                capture_output=True, text=True, env=env, timeout=60)
            assert submitted.returncode == 0, submitted.stderr
            jobs.append(int(submitted.stdout.strip()))
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not all(
                "TMPDIR=" in (o.read_text() if o.exists() else "") for o in outs.values()):
            time.sleep(0.5)
        shown = {h: next(line.split("=", 1)[1] for line in o.read_text().splitlines() if line.startswith("TMPDIR="))
                 for h, o in outs.items()}
    finally:
        for job in jobs:
            qdel_quietly(job)
    parents = {h: str(Path(t).parent) for h, t in shown.items()}
    assert all(Path(t).name.endswith(".agent.q") for t in shown.values()), shown  # Grid Engine's <job>.<task>.<queue>
    assert len(set(parents.values())) == len(names), parents
    assert all(p.endswith("/" + h) for h, p in parents.items()), parents


def test_a_lost_host_shows_unreachable_its_tasks_unknown_and_reruns_converge(bootstrap, hosts):
    names, _ = hosts
    cluster = cluster_get_default()
    scheduler = scheduler_for(cluster)
    admin = get_user_model().objects.get(username="admin")
    campaign = launch("lost-host", [{"task": n, "duration_s": 20.0} for n in (1, 2, 3, 4)], rerunnable=True)
    job = campaign.job_number
    assert "-r y" in scheduler.native_specification(campaign_job_spec(campaign))

    # All four running (qstat says so), on one agent host or more.
    placed = wait_all_running(cluster, scheduler, job, 4)
    lost_host = max(set(placed.values()), key=list(placed.values()).count)
    on_lost = sorted(n for n, h in placed.items() if h == lost_host)

    def never_ended_while_queued():
        listed = qstat_tasks(job)
        ended = set(Task.objects.filter(campaign=campaign, state__in=TERMINAL).values_list("task_number", flat=True))
        assert not ended & set(listed), f"tasks {sorted(ended & set(listed))} ended in tco while qstat lists them"

    fault("down", lost_host)
    try:
        # The scheduler declares the host unknown (instance state u) after max_unheard.
        drive_until(cluster, scheduler, host_unknown(lost_host), 120,
                    lambda: f"{lost_host} never became unknown: {queue_instances()}", each=never_ended_while_queued)
        drive(cluster, scheduler)  # one poll after qstat -f says u
        still = {n: s for n, (s, h) in qstat_tasks(job).items() if h == lost_host}
        # Not yet rescheduled (reschedule_unknown waits 15 s): qstat still says r on the lost host; tco says
        # unknown, never done or failed.
        assert still, f"rescheduled before a poll saw {lost_host} unknown: {qstat_tasks(job)}"
        states = dict(Task.objects.filter(campaign=campaign, task_number__in=still).values_list(
            "task_number", "state"))
        assert states == {n: "unknown" for n in still}, states
        hosts_shown = {h["name"]: h for h in live_cluster.cluster_hosts(cluster_get_default(), admin)["hosts"]}
        assert hosts_shown[lost_host]["state"] == "unreachable"
        assert all(hosts_shown[h]["state"] == "up" for h in names if h != lost_host)

        # -r y: the qmaster reschedules the lost host's tasks (Rq), each attempt accounted.
        drive_until(cluster, scheduler,
                    lambda: all(qstat_tasks(job).get(n, ("", lost_host))[1] != lost_host for n in on_lost), 180,
                    lambda: f"the tasks of {lost_host} were not rescheduled: {qstat_tasks(job)}",
                    each=never_ended_while_queued)
        drive(cluster, scheduler)
        restarted = dict(Task.objects.filter(campaign=campaign, task_number__in=on_lost).values_list(
            "task_number", "restarted"))
        listed = qstat_tasks(job)
        assert all(restarted[n] for n in on_lost if n in listed and "R" in listed[n][0]), (restarted, listed)
    finally:
        fault("up", lost_host)

    # Converges by itself: every task ends, once, from its last attempt.
    drive_until(cluster, scheduler, campaign_over(campaign, job), 300, lambda: (
        f"no convergence: {list(Task.objects.filter(campaign=campaign).values_list('task_number', 'state'))}"
        f" qstat {qstat_tasks(job)}"), each=never_ended_while_queued)
    time.sleep(2)  # accounting flush time is 1 s: a late line of an old attempt would show now
    drive(cluster, scheduler)

    lines = accounting_lines(job)
    attempts: dict[int, list[list[str]]] = {}
    for f in lines:
        attempts.setdefault(int(f[35]), []).append(f)
    assert sorted(attempts) == [1, 2, 3, 4]  # nothing lost
    assert qacct_count(job) == len(lines)
    stored = sorted((r.task_number, r.hostname, r.failed, r.exit_status, int(r.start_us // 1_000_000))
                    for r in AccountingRecord.objects.filter(job_number=job, pe_taskid=""))
    from_file = sorted((int(f[35]), f[1], int(f[11]), int(f[12]), int(f[9])) for f in lines)
    assert stored == from_file  # every attempt kept, nothing doubled
    tasks = {t.task_number: t for t in Task.objects.filter(campaign=campaign)}
    assert len(tasks) == 4 == Task.objects.filter(job_number=job).count()
    for n, task in tasks.items():
        last = max(attempts[n], key=lambda f: int(f[10]))
        assert task.state == "done" and (task.host, task.exit_status) == (last[1], 0), (
            n, task.state, last[:13], (task.runner_record or {}).get("error"), (task.runner_record or {}).get("flags"))
        if n in on_lost:
            # The attempt on the lost host is in the file and the database, beside the one that finished.
            assert any(f[1] == lost_host for f in attempts[n]) and len(attempts[n]) >= 2, attempts[n]
            assert AccountingRecord.objects.filter(task=task).count() == len(attempts[n])
    hosts_shown = {h["name"]: h["state"] for h in live_cluster.cluster_hosts(cluster_get_default(), admin)["hosts"]}
    deadline = time.monotonic() + 60
    while hosts_shown.get(lost_host) != "up" and time.monotonic() < deadline:
        time.sleep(1)
        drive(cluster, scheduler)
        hosts_shown = {h["name"]: h["state"] for h in live_cluster.cluster_hosts(cluster_get_default(), admin)["hosts"]}
    assert hosts_shown[lost_host] == "up"


def test_without_rerun_the_lost_hosts_tasks_stay_unknown_until_it_comes_back_then_finish(bootstrap, hosts):
    cluster = cluster_get_default()
    scheduler = scheduler_for(cluster)
    # Long enough that no task ends before the checks while the host is unknown (max_unheard 10 s).
    campaign = launch("back-again", [{"task": n, "duration_s": 35.0} for n in (1, 2)])
    job = campaign.job_number
    placed = wait_all_running(cluster, scheduler, job, 2)
    lost_host = placed[1]
    fault("down", lost_host)
    try:
        drive_until(cluster, scheduler, host_unknown(lost_host), 120,
                    lambda: f"{lost_host} never became unknown: {queue_instances()}")
        drive(cluster, scheduler)
        on_lost = sorted(n for n, h in placed.items() if h == lost_host)
        states = dict(Task.objects.filter(campaign=campaign).values_list("task_number", "state"))
        assert all(states[n] == "unknown" for n in on_lost), states
        assert not set(states.values()) & set(TERMINAL)
        # Not rerunnable: still listed on the lost host, never rescheduled.
        assert {n: h for n, (_, h) in qstat_tasks(job).items() if n in on_lost} == {n: lost_host for n in on_lost}
    finally:
        fault("up", lost_host)
    drive_until(cluster, scheduler, campaign_over(campaign, job), 240, lambda: (
        f"no convergence: {list(Task.objects.filter(campaign=campaign).values_list('task_number', 'state'))}"))
    drive(cluster, scheduler)
    lines = {int(f[35]): f for f in accounting_lines(job)}
    assert sorted(lines) == [1, 2] and len(accounting_lines(job)) == 2  # one attempt each
    for task in Task.objects.filter(campaign=campaign):
        f = lines[task.task_number]
        expected = "done" if (f[11], f[12]) == ("0", "0") else "failed"
        assert (task.state, task.host, task.failed_code, task.exit_status) == (expected, f[1], int(f[11]), int(f[12]))
    assert Task.objects.filter(job_number=job).count() == 2


def test_a_crashed_hosts_tasks_end_failed_with_the_host_and_the_reason_and_retry_in_one_action(bootstrap, hosts):
    """Issue 23, finding 12: every process of a host killed (execd, shepherds, runners, agents) while its
    tasks run, then the host back. Grid Engine writes a record per task it ran (failed 19, "before writing
    exit_status"); tco ends those tasks failed, says which host was lost and why, counts them as
    infrastructure failures, retries them in one action, and bills the records' wall clock."""
    from django.db.models import Count

    from dashboards.billing import bills
    from dashboards.billing.periods import cluster_zone
    from dashboards.control.actions import campaign_controls
    from dashboards.launch.service import campaign_retry
    from dashboards.live.campaign import campaign_detail
    from dashboards.live.task import task_detail
    from dashboards.models import CampaignStatus

    cluster = cluster_get_default()
    scheduler = scheduler_for(cluster)
    admin = get_user_model().objects.get(username="admin")
    campaign = launch("crashed-host", [{"task": n, "duration_s": 30.0} for n in (1, 2, 3, 4)])
    job = campaign.job_number
    placed = wait_all_running(cluster, scheduler, job, 4)
    lost_host = max(set(placed.values()), key=list(placed.values()).count)
    on_lost = sorted(n for n, h in placed.items() if h == lost_host)
    elsewhere = sorted(set(placed) - set(on_lost))
    wait_runners_started(campaign.pk, on_lost)  # crashed while they run: failed 19 on its return, not 7
    fault("crash", lost_host)
    try:
        drive_until(cluster, scheduler, host_unknown(lost_host), 180,
                    lambda: f"{lost_host} never became unknown: {queue_instances()}")
        drive(cluster, scheduler)
        states = dict(Task.objects.filter(campaign=campaign, task_number__in=on_lost).values_list(
            "task_number", "state"))
        assert not set(states.values()) & set(TERMINAL), states  # unknown, not ended on a guess
    finally:
        fault("up", lost_host)
    drive_until(cluster, scheduler, campaign_over(campaign, job), 300, lambda: (
        f"no convergence: {list(Task.objects.filter(campaign=campaign).values_list('task_number', 'state'))}"
        f" qstat {qstat_tasks(job)}"))
    time.sleep(2)
    drive(cluster, scheduler)

    lines = {int(f[35]): f for f in accounting_lines(job)}
    assert sorted(lines) == [1, 2, 3, 4] and len(accounting_lines(job)) == 4  # one record each, none doubled
    assert Task.objects.filter(job_number=job).count() == 4
    for n in on_lost:
        f = lines[n]
        assert (f[1], f[11]) == (lost_host, "19"), f[:14]  # the host's record: failed 19
        task = Task.objects.get(campaign=campaign, task_number=n)
        assert (task.state, task.host, task.failed_code) == ("failed", lost_host, 19)
        failure = task_detail(admin, task.pk)["task"]["failure"]
        assert failure["kind"] == "infrastructure"
        assert failure["text"].startswith(f"execution host {lost_host} was lost: the job's shepherd died before "
                                          "it wrote the exit status")
        assert AccountingRecord.objects.get(task=task).wallclock_s == float(f[13])
    for n in elsewhere:
        assert Task.objects.get(campaign=campaign, task_number=n).state == "done"
    detail = campaign_detail(admin, campaign.pk)
    assert detail["infrastructure_failures"] == len(on_lost)
    states = dict(Task.objects.filter(campaign=campaign).values_list("state").annotate(n=Count("id")).order_by())
    assert campaign_controls(campaign, states)["retry_infrastructure"] == {"count": len(on_lost), "why": ""}
    # Billed from the accounting records: the campaign's wall clock is the records' sum.
    first_start = Task.objects.filter(campaign=campaign).order_by("started_at").first().started_at
    day = first_start.astimezone(cluster_zone(cluster)).date()
    result = bills.bill(teams=[campaign.team], period="day", first=day, last=day, group_by="campaign",
                        campaign=campaign.pk)
    billed = sum(r["wallclock_s"] for r in result["rows"] if r["launched_by_tco"])
    assert billed == sum(float(f[13]) for f in lines.values())
    # One action retries the tasks the lost host failed, and only those.
    retry = campaign_retry(user=admin, campaign=campaign, infrastructure_only=True).campaign
    try:
        assert retry.task_count == len(on_lost) and retry.retry_of_id == campaign.pk
        assert retry.status in (CampaignStatus.SUBMITTING, CampaignStatus.SUBMITTED)
    finally:
        retry = campaign_submit(campaign_id=retry.pk)
        if retry.job_number:
            subprocess.run(["qdel", str(retry.job_number)], capture_output=True, timeout=30,
                           env=sge_env(settings.SGE_ROOT, settings.SGE_CELL))
