"""The qmaster stopped in the middle of a campaign, then started again.

While it is down: every poll fails and is recorded; the pages say
"scheduler unreachable since T" and keep the last known state; no task is
marked failed, finished or lost because a poll failed. The campaign's tasks
end while the qmaster is down (their execd keeps the reports) and their
runner records arrive (written here as the runner writes them: the jobs are
plain sleeps). The execd is then held silent (SIGSTOP) while the qmaster
starts again, as an execd that does not re-register for minutes: the
qmaster lists the tasks as running although their runners have finished,
and tco shows them as "finished per its runner; the scheduler still lists
it: execd on host H silent since T", with a notice to admins. Once the execd
reports (SIGCONT), everything catches up by itself (the same periodic rounds,
nothing restarted by hand): every task done, and every accounting record of
the job in the database once.
"""
from __future__ import annotations

import datetime as dt
import glob
import os
import signal
import time

import pytest
from django.test import Client
from django.utils import timezone

from dashboards.core import health
from dashboards.models import Campaign, Task, TaskEvent, Team
from dashboards.core.clusters import cluster_get_default
from execution.spool.layout import SpoolLayout
from execution.spool.record import RunnerRecord
from tests.support.campaigns import make_campaign

from .services import poll_cycle, qmaster_start, qmaster_stop, submit_as_tco, wait_for
from .ledger import compare, report

pytestmark = [pytest.mark.integration]

N_TASKS = 6
SLEEP_S = 20
OUTAGE_S = 45


def execd_pids() -> list[int]:
    """The dev host's sge_execd (scripts/dev-cluster: $EXECD_SPOOL/<host>/execd.pid)."""
    pids = []
    for pidfile in glob.glob("/var/spool/gridengine/execd/*/execd.pid"):
        try:
            pid = int(open(pidfile).read().strip())
            if open(f"/proc/{pid}/comm").read().strip() == "sge_execd":
                pids.append(pid)
        except (OSError, ValueError):
            continue
    return pids


def write_runner_record(layout: SpoolLayout, task: Task) -> dt.datetime:
    """The record the runner writes at its end (execution/runner/), for a task that ran SLEEP_S seconds."""
    start = task.started_at
    at = lambda s: (start + dt.timedelta(seconds=s)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # noqa: E731
    end = start + dt.timedelta(seconds=SLEEP_S + 0.2)
    stages = {"task_started_at": at(0.1), "sandbox_create_at": at(0.2), "sandbox_ready_at": at(0.4),
              "agent_started_at": at(0.5), "agent_exited_at": at(SLEEP_S), "teardown_done_at": at(SLEEP_S + 0.2)}
    RunnerRecord(campaign_id=str(task.campaign_id), task_number=task.task_number, job_number=task.job_number,
                 hostname=task.host, stages=stages, exit_status=0).write(
        layout.record_path(task.campaign_id, task.task_number))
    return end


def test_a_qmaster_outage_mid_campaign_loses_nothing_and_catches_up(fault_db, root_only, django_user_model,
                                                                     settings):
    settings.TCO_RUNNER_FINISHED_GRACE_S = 5.0
    layout = SpoolLayout(settings.TCO_SPOOL_DIR)
    cluster = cluster_get_default()
    admin = django_user_model.objects.get(username="admin")
    job = submit_as_tco("-q", "agent.q", "-P", "research", "-l", "anthropic_api=1", "-N", "fault-qmaster",
                        "-b", "y", "-o", "/dev/null", "-e", "/dev/null", "-t", f"1-{N_TASKS}",
                        "/bin/sleep", str(SLEEP_S))
    campaign = make_campaign(team=Team.objects.get(project="research"), user=admin, name="fault-qmaster",
                             job_number=job, tasks=[])
    Campaign.objects.filter(pk=campaign.pk).update(task_count=N_TASKS)
    tasks = Task.objects.filter(campaign=campaign)

    def all_running():
        poll_cycle(cluster)
        return tasks.filter(state="running").count() == N_TASKS

    wait_for("the campaign's tasks to run", all_running, 120)
    page = Client()
    page.force_login(admin)
    stopped_at = timezone.now()
    try:
        qmaster_stop()
        # The outage: the periodic rounds go on; the tasks end meanwhile (sleep SLEEP_S < OUTAGE_S).
        failures = 0
        deadline = time.monotonic() + OUTAGE_S
        while time.monotonic() < deadline:
            failures += not poll_cycle(cluster)
            assert sorted(tasks.values_list("state", "active").distinct()) == [("running", True)]
            time.sleep(1)
        assert failures >= 5
        [outage] = health.scheduler_unreachable()
        assert outage.since >= stopped_at
        body = page.get("/").content.decode()
        assert f"unreachable since {outage.since.astimezone(dt.timezone.utc):%Y-%m-%d %H:%M:%S} UTC" in body
        assert page.get(f"/campaigns/{campaign.pk}/").status_code == 200
        cluster.refresh_from_db()
        assert cluster.poll_error_at == outage.since  # the first failure, not the latest
        # The runners have finished (their sleep is over): their records arrive.
        ends = {t.task_number: write_runner_record(layout, t) for t in tasks.all()}
        stopped = execd_pids()
        assert stopped, "no sge_execd found to hold silent"
        for pid in stopped:
            os.kill(pid, signal.SIGSTOP)  # the execd does not re-register: resumed below, and in finally
        qmaster_start()
        # The qmaster lists the tasks as running; their runners said they finished.
        flagged = wait_for("the tasks to be called out as finished per their runners",
                           lambda: poll_cycle(cluster) and len(health.runner_finished_tasks()) == N_TASKS
                           and health.execd_silences(), 90, step=1)
        assert sorted(tasks.values_list("state", flat=True).distinct()) == ["running"]
        [silence] = flagged
        host = tasks.first().host
        assert (silence.host, silence.tasks, silence.since) == (host, N_TASKS, min(ends.values()))
        note = (f"finished per its runner; the scheduler still lists it: execd on host {host} silent since "
                f"{min(ends.values()).astimezone(dt.timezone.utc):%Y-%m-%d}")
        assert page.get(f"/tasks/{tasks.first().pk}/").status_code == 200
        notes = [health.task_note(t) for t in tasks.all()]  # fresh rows, not the queryset's cache
        assert all(n.startswith(note) for n in notes), (note, notes)
        triage = page.get("/ops/triage/").content.decode()
        assert f"execd on host {host} (" in triage and "silent since" in triage
    finally:
        for pid in execd_pids():
            os.kill(pid, signal.SIGCONT)
        qmaster_start()
    restarted_at = time.monotonic()

    # Catch-up, by the same rounds alone (bounded: the execd may take minutes to re-register).
    listed_after_end = 0

    def caught_up():
        nonlocal listed_after_end
        poll_cycle(cluster)
        listed_after_end += tasks.filter(state="running").exists()
        return not tasks.filter(active=True).exists()

    wait_for("every task to end after the qmaster returned", caught_up, 480, step=1)
    caught_up_s = time.monotonic() - restarted_at
    assert health.runner_finished_tasks() == []
    print(f"qmaster outage: caught up {caught_up_s:.0f} s after the execd resumed; tasks still listed as running "
          f"in {listed_after_end} polls after it")
    assert health.scheduler_unreachable() == []
    assert sorted(tasks.values_list("task_number", "state")) == [(n, "done") for n in range(1, N_TASKS + 1)]
    bad = TaskEvent.objects.filter(task__campaign=campaign, to_state__in=("failed", "lost", "deleted", "error"))
    assert not bad.exists(), list(bad.values_list("task__task_number", "from_state", "to_state"))
    assert Campaign.objects.get(pk=campaign.pk).status == "finished"
    result = compare(cluster, [cluster_get_default().accounting_path], jobs={job})
    report(result, f"qmaster stopped {OUTAGE_S} s mid-campaign, execd silent after it (caught up "
                   f"{caught_up_s:.0f} s after the execd resumed)")
    assert (result["lost"], result["doubled"], result["extra"], result["records"]) == (0, 0, 0, N_TASKS), result
