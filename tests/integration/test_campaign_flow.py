"""A real campaign through DRMAA on the dev cluster, followed by the ingest path.

The database's view is checked against qstat and the accounting file
themselves, read here independently of tco's parsers.
"""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from django.conf import settings
from django.utils import timezone

from dashboards.launch.service import LaunchRequest, launch
from dashboards.models import AgentDefinition, Campaign, Task, TaskEvent, Team
from dashboards.core.clusters import cluster_get_default, scheduler_for
from dashboards.launch.submit import campaign_submit
from dashboards.ingest.poll import apply_qstat_poll
from dashboards.ingest.accounting import ingest_accounting
from dashboards.ingest.runner_records import ingest_runner_records
from demo.watch.samplers import descendants
from tests.sge_env import sge_env

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

N_TASKS = 6


def accounting_lines_for(job_number: int) -> dict[int, list[str]]:
    """task number -> the 45 fields of its accounting line, split here without tco's parser."""
    found: dict[int, list[str]] = {}
    path = Path(cluster_get_default().accounting_path)
    for raw in path.read_text(errors="replace").splitlines():
        if raw.startswith("#") or len(raw) <= 1:
            continue
        fields = raw.split(":")
        # job name and account cannot hold ':', so fields 1-39 are safe from the left.
        if fields[5] == str(job_number):
            found[int(fields[35])] = fields
    return found


def qstat_job_present(job_number: int) -> bool:
    out = subprocess.run(["qstat", "-u", "*", "-xml"], capture_output=True, text=True, check=True,
                         env=sge_env(settings.SGE_ROOT, settings.SGE_CELL, TZ="UTC")).stdout
    return f"<JB_job_number>{job_number}</JB_job_number>" in out


def test_it_follows_a_real_campaign_from_submission_to_accounting(bootstrap, django_user_model):
    cluster = cluster_get_default()
    team = Team.objects.get(project="research")
    agent = AgentDefinition.objects.get(name="demo-agent")
    admin = django_user_model.objects.get(username="admin")
    inputs = [{"task": n, "duration_s": 3.0, "fail": n == 4} for n in range(1, N_TASKS + 1)]
    campaign = launch(user=admin, request=LaunchRequest(team=team, agent_definition=agent, inputs=inputs, name="itest")).campaign
    campaign = campaign_submit(campaign_id=campaign.pk)
    assert campaign.status == "submitted", campaign.submit_error
    job = campaign.job_number
    assert job and Task.objects.filter(campaign=campaign).count() == N_TASKS

    scheduler = scheduler_for(cluster)
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        observed = timezone.now()
        apply_qstat_poll(cluster, scheduler.list_tasks(), observed_at=observed)
        ingest_accounting(cluster)
        ingest_runner_records(cluster)
        if not Task.objects.filter(campaign=campaign, active=True).exists() and not qstat_job_present(job):
            break
        time.sleep(0.3)
    else:
        states = list(Task.objects.filter(campaign=campaign).values_list("task_number", "state"))
        pytest.fail(f"campaign did not finish in time: {states}")

    records = accounting_lines_for(job)
    assert sorted(records) == list(range(1, N_TASKS + 1))
    for task in Task.objects.filter(campaign=campaign).order_by("task_number"):
        fields = records[task.task_number]
        exit_status = int(fields[12])
        failed = int(fields[11])
        assert fields[31] == "research" == task.project
        assert fields[0] == "agent.q" == task.queue
        assert task.exit_status == exit_status
        assert task.failed_code == failed
        assert task.wallclock_s == float(fields[13])
        assert task.host == fields[1]
        assert int(task.started_at.timestamp()) == int(fields[9])
        assert int(task.ended_at.timestamp()) == int(fields[10])
        expected_state = "done" if (failed == 0 and exit_status == 0) else "failed"
        assert task.state == expected_state
        # The poll saw it start: a running state was recorded before it finished.
        assert TaskEvent.objects.filter(task=task, to_state="running").exists(), task.task_number
        # The runner's stages arrived, in order.
        assert task.task_started_at <= task.agent_started_at <= task.agent_exited_at
    assert Task.objects.get(campaign=campaign, task_number=4).state == "failed"
    assert Task.objects.get(campaign=campaign, task_number=4).exit_status == 3
    assert Campaign.objects.get(pk=campaign.pk).status == "finished"


def agents_running(campaign_id: int) -> int:
    """How many runners of the campaign (``python -m execution.runner`` with ``TCO_CAMPAIGN_ID`` in its
    environment, /proc) have a demo agent running below them now (the agent's process, started by the
    relay: not bubblewrap's or the relay's, whose command lines end with the agent's)."""
    mark = f"TCO_CAMPAIGN_ID={campaign_id}".encode()
    found = 0
    for proc in Path("/proc").iterdir():
        try:
            if not proc.name.isdigit() or b"execution.runner" not in (proc / "cmdline").read_bytes():
                continue
            if mark not in (proc / "environ").read_bytes().split(b"\0"):
                continue
            below = [Path(f"/proc/{p}/cmdline").read_bytes() for p in descendants(int(proc.name))[1:]
                     if Path(f"/proc/{p}/cmdline").exists()]
        except OSError:
            continue
        # The agent itself: bubblewrap's and the relay's command lines hold the agent's argv too (after
        # "/run/tco-relay.py ... --"), from before the sandbox is ready.
        found += any(b"demo.demo_agent" in cmd and b"tco-relay" not in cmd for cmd in below)
    return found


def wait_for_agents(campaign_id: int, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while agents_running(campaign_id) < count:
        if time.monotonic() > deadline:
            pytest.fail(f"{count} agents of campaign {campaign_id} were not running within {timeout:g} s")
        time.sleep(0.2)


def drive_until_ended(cluster, campaign, scheduler, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        apply_qstat_poll(cluster, scheduler.list_tasks(), observed_at=timezone.now())
        ingest_accounting(cluster)
        ingest_runner_records(cluster)
        if not Task.objects.filter(campaign=campaign, active=True).exists() and not Task.objects.filter(
            campaign=campaign, task_started_at__isnull=True
        ).exists():
            return
        time.sleep(0.3)
    states = list(Task.objects.filter(campaign=campaign).values_list("task_number", "state", "task_started_at"))
    pytest.fail(f"campaign did not end in time: {states}")


def test_a_task_deleted_mid_agent_still_leaves_its_runner_record(bootstrap, django_user_model):
    cluster = cluster_get_default()
    team = Team.objects.get(project="engineering")
    agent = AgentDefinition.objects.get(name="demo-agent")
    admin = django_user_model.objects.get(username="admin")
    campaign = launch(user=admin, request=LaunchRequest(team=team, agent_definition=agent, name="itest-qdel",
                               inputs=[{"task": n, "duration_s": 120.0} for n in (1, 2)])).campaign
    campaign = campaign_submit(campaign_id=campaign.pk)
    scheduler = scheduler_for(cluster)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        apply_qstat_poll(cluster, scheduler.list_tasks(), observed_at=timezone.now())
        if Task.objects.filter(campaign=campaign, state="running").count() == 2:
            break
        time.sleep(0.3)
    # Mid-agent: both agents run inside their runners (seen in /proc, not guessed with a sleep: on a
    # loaded host the jobs' cpu group may take seconds to start a runner).
    wait_for_agents(campaign.pk, 2, timeout=90)
    scheduler.control("delete", campaign.job_number)
    drive_until_ended(cluster, campaign, scheduler)
    for task in Task.objects.filter(campaign=campaign):
        assert task.state == "failed", (task.task_number, task.state)
        assert task.project == "engineering"
        assert task.task_started_at is not None and task.agent_started_at is not None
        assert task.agent_exited_at is None  # the runner stopped it: the agent never exited by itself
        assert task.teardown_done_at >= task.agent_started_at
        assert task.wallclock_s < 60
