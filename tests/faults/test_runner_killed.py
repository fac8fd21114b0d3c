"""A runner killed mid-agent: by qdel (with -notify: it gets SIGTERM first) and by SIGKILL.

Two agent tasks of one campaign run for two minutes. Task 1 is deleted with
qdel: its runner stops the agent and writes its record with the stages it
reached. Task 2's runner is killed with SIGKILL: no record is possible; the
task ends failed from its accounting record, and dashboards/orphans.py keeps
what it metered (its requests file) and its start. Runs as the submit
account (it owns the jobs and their runners). Every accounting record of the
job is then compared with the database.
"""
from __future__ import annotations

import os
import signal
import time

import pytest

from dashboards.models import AccountingRecord, AgentDefinition, Task, Team
from dashboards.ingest.orphans import FLAG
from dashboards.core.clusters import cluster_get_default, scheduler_for
from dashboards.launch.service import LaunchRequest, launch
from dashboards.launch.submit import campaign_submit

from .services import poll_cycle, wait_for
from .ledger import compare, report

pytestmark = [pytest.mark.integration]


def runner_pid(campaign_id: int, task_number: int) -> int | None:
    """The pid of the runner (``python -m execution.runner``) of one task, found by its job environment."""
    want = {f"TCO_CAMPAIGN_ID={campaign_id}".encode(), f"SGE_TASK_ID={task_number}".encode()}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as fh:
                if b"execution.runner" not in fh.read():
                    continue
            with open(f"/proc/{pid}/environ", "rb") as fh:
                env = set(fh.read().split(b"\0"))
        except OSError:
            continue
        if want <= env:
            return int(pid)
    return None


def test_a_runner_deleted_or_killed_mid_agent_ends_failed_with_what_it_reached(fault_db, settings,
                                                                               django_user_model):
    if os.getuid() == 0:
        pytest.fail("run as the submit account tco (scripts/faults does): it submits and kills its own runners")
    settings.TCO_RUNNER_RECORD_GRACE_S = 3.0
    cluster = cluster_get_default()
    admin = django_user_model.objects.get(username="admin")
    campaign = launch(user=admin, request=LaunchRequest(
        team=Team.objects.get(project="research"), agent_definition=AgentDefinition.objects.get(name="demo-agent"),
        name="fault-kill", inputs=[{"task": n, "duration_s": 120.0} for n in (1, 2)])).campaign
    campaign = campaign_submit(campaign_id=campaign.pk)
    assert campaign.status == "submitted", campaign.submit_error
    job = campaign.job_number
    tasks = Task.objects.filter(campaign=campaign)
    pids = wait_for("both runners to start their agents",
                    lambda: poll_cycle(cluster) and tasks.filter(state="running").count() == 2
                    and runner_pid(campaign.pk, 2), 180)
    time.sleep(3.0)  # the agents are inside their sandboxes

    scheduler_for(cluster).control("delete", job, [1])
    os.kill(pids, signal.SIGKILL)

    def ended():
        poll_cycle(cluster)
        return not tasks.filter(active=True).exists() and FLAG in (tasks.get(task_number=2).usage_flags or [])

    wait_for("both tasks to end and the killed one to be recovered", ended, 240, step=1)
    deleted, killed = tasks.get(task_number=1), tasks.get(task_number=2)
    rec1 = AccountingRecord.objects.get(job_number=job, task_number=1)
    rec2 = AccountingRecord.objects.get(job_number=job, task_number=2)

    # qdel: the runner got its signal, stopped the agent and recorded the stages it reached.
    assert deleted.state == "failed" and deleted.runner_record is not None
    assert "runner_signalled" in deleted.runner_record["flags"]
    assert deleted.task_started_at and deleted.sandbox_ready_at and deleted.agent_started_at
    assert deleted.agent_exited_at is None and deleted.teardown_done_at >= deleted.agent_started_at
    assert deleted.wallclock_s < 100 and FLAG not in deleted.usage_flags

    # SIGKILL: no record; failed from accounting (the job's exit status is the kill's), its start
    # known from accounting, its metered usage from the spool (the demo agent calls no model: none).
    assert killed.state == "failed" and killed.runner_record is None
    assert rec2.exit_status == 128 + signal.SIGKILL or rec2.failed != 0, (rec2.exit_status, rec2.failed)
    assert killed.task_started_at == rec2.started_at and killed.agent_started_at is None
    assert FLAG in killed.usage_flags and killed.input_tokens == 0 and killed.cost_usd is None
    assert killed.wallclock_s < 100
    assert rec1.ended_at is not None

    result = compare(cluster, [cluster_get_default().accounting_path], jobs={job})
    report(result, "runner deleted (qdel) and killed (SIGKILL) mid-agent")
    assert (result["lost"], result["doubled"], result["extra"], result["records"]) == (0, 0, 0, 2), result
