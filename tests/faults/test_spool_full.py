"""The spool's disk full mid-campaign: tasks fail with the reason, nothing is lost or doubled, and the
campaign's failed tasks run again once there is room.

The spool is a small file system of its own (48 MiB, mounted by scripts/faults on the master and on
every execution host: ``TCO_FAULT_SMALL_SPOOL``), never the real root disk, and the work directories
are on it (``TCO_SANDBOX_WORKDIR=spool``; by default each is a tmpfs of its disk limit); the database is elsewhere,
as deploy/ keeps them. A filler agent writes into its work directory until the file system is full
and holds the space. While it is full: a launch is refused with the reason and records nothing; a
campaign's tasks start (released from a hold) and fail, their runners unable to write their inputs
or records. Then the filler's file is removed, the filler ends done, and the failed tasks are retried
in one action and finish. Every accounting record of the three jobs is then in the database once.
Runs as the submit account.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest
from django.contrib.auth import get_user_model

from dashboards.core import failures
from dashboards.core.clusters import cluster_get_default, scheduler_for
from dashboards.core.errors import LaunchError
from dashboards.launch.service import LaunchRequest, campaign_retry, launch
from dashboards.launch.submit import campaign_submit
from dashboards.live.task import task_detail
from dashboards.models import AgentDefinition, AuditEntry, Campaign, Task, Team
from tests.support.cluster import qdel_quietly

from .ledger import compare, report
from .services import poll_cycle, wait_for

pytestmark = [pytest.mark.integration]

# Fills /sandbox/fill until the file system refuses even one byte (ENOSPC), then holds the space until
# the file is removed (by the test), and exits 0.
FILLER = """
import errno, os, time
f = open('/sandbox/fill', 'wb', buffering=0)
for size in (1 << 20, 1 << 12, 1):  # to the last block
    try:
        while True:
            f.write(b'x' * size)
            os.fsync(f.fileno())
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
f.close()
deadline = time.monotonic() + 300
while os.path.exists('/sandbox/fill') and time.monotonic() < deadline:
    time.sleep(0.5)
"""


def free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def submitted(campaign: Campaign, *, hold: bool = False) -> Campaign:
    if hold:
        Campaign.objects.filter(pk=campaign.pk).update(submit_on_hold=True)
    campaign = campaign_submit(campaign_id=campaign.pk)
    assert campaign.status == "submitted", campaign.submit_error
    return campaign


def test_the_spools_disk_full_mid_campaign_fails_tasks_with_the_reason_and_a_retry_finishes(fault_db, settings):
    if os.getuid() == 0:
        pytest.fail("run as the submit account tco (scripts/faults does): it submits through DRMAA")
    spool = os.environ.get("TCO_FAULT_SMALL_SPOOL", "")
    if not spool or not os.path.ismount(spool):
        pytest.fail("TCO_FAULT_SMALL_SPOOL is not a mounted small file system: run this through scripts/faults")
    settings.TCO_SPOOL_DIR = Path(spool)
    settings.TCO_RUNNER_RECORD_GRACE_S = 3.0
    # The work directory may hold the whole file system: the disk, not the limit, must stop the filler.
    settings.TCO_SANDBOX_LIMITS = {**settings.TCO_SANDBOX_LIMITS, "TCO_SANDBOX_WORK_BYTES": str(1 << 30)}
    # ... and it must be on the spool: by default /sandbox is a tmpfs of the disk limit (the filler would
    # fill that, never the spool). A site whose work directories outgrow memory keeps them on the spool.
    settings.TCO_SANDBOX_WORKDIR = "spool"
    cluster = cluster_get_default()
    admin = get_user_model().objects.get(username="admin")
    research = Team.objects.get(project="research")
    demo = AgentDefinition.objects.get(name="demo-agent")
    filler_agent = AgentDefinition.objects.create(name="spool-filler", version=1, timeout_s=600,
                                                  command=["/usr/bin/python3", "-c", FILLER])

    def launch_demo(name: str, count: int) -> Campaign:
        return launch(user=admin, request=LaunchRequest(team=research, agent_definition=demo, name=name,
                                                        inputs=[{"task": n, "duration_s": 1.0}
                                                                for n in range(1, count + 1)])).campaign

    before = set(Campaign.objects.values_list("pk", flat=True))
    try:
        victims = submitted(launch_demo("spool-victims", 3), hold=True)
        filler = submitted(launch(user=admin, request=LaunchRequest(team=research, agent_definition=filler_agent,
                                                                    name="spool-filler", inputs=[{"task": 1}])).campaign)
        fill = Path(spool) / "work" / str(filler.pk) / "1" / "fill"
        wait_for("the filler to fill the spool", lambda: (poll_cycle(cluster), fill.exists()
                                                          and free_bytes(spool) < 4096)[1], 180, step=1)

        # Full: a launch is refused with the reason, nothing recorded.
        with pytest.raises(LaunchError, match="could not be written to the spool: No space left on device"):
            launch_demo("spool-refused", 1)
        assert not Campaign.objects.filter(name="spool-refused").exists()
        assert AuditEntry.objects.filter(ok=False, result__contains="No space left on device").count() == 1

        # Full: the held campaign's tasks start and fail, with the runner's reason in words.
        scheduler_for(cluster).control("release", victims.job_number, None)
        wait_for("the victims to end", lambda: poll_cycle(cluster) and Task.objects.filter(campaign=victims).count() == 3
                 and not Task.objects.filter(campaign=victims, active=True).exists(), 300, step=1)
        assert free_bytes(spool) < 4096  # still full: the filler holds it
        for task in Task.objects.filter(campaign=victims):
            assert task.state == "failed", (task.task_number, task.state, task.exit_status, task.failed_code)
            failure = task_detail(admin, task.pk)["task"]["failure"]
            assert failure["kind"] == "infrastructure", failure
            if task.runner_record is None and task.failed_code == 0:
                assert failure["text"].startswith(f"tco's runner failed on {task.host} before it could write its record")

        # Room again: the filler ends done; the failed tasks run again in one action and finish.
        fill.unlink()
        wait_for("the filler to end", lambda: poll_cycle(cluster) and Task.objects.filter(
            campaign=filler, state="done").exists(), 120, step=1)
        assert failures.infrastructure_failed(victims) == 3
        retry = submitted(campaign_retry(user=admin, campaign=victims, infrastructure_only=True).campaign)
        wait_for("the retry to end", lambda: poll_cycle(cluster) and Task.objects.filter(campaign=retry).count() == 3
                 and not Task.objects.filter(campaign=retry, active=True).exists(), 300, step=1)
        assert sorted(Task.objects.filter(campaign=retry).values_list("task_number", "state")) == [
            (1, "done"), (2, "done"), (3, "done")]

        jobs = {victims.job_number, filler.job_number, Campaign.objects.get(pk=retry.pk).job_number}
        result = compare(cluster, [cluster.accounting_path], jobs=jobs)
        report(result, "the spool's disk full mid-campaign (3 tasks failed while full, retried once free)")
        assert (result["lost"], result["doubled"], result["extra"], result["records"]) == (0, 0, 0, 7), result
        assert Task.objects.filter(campaign__in=[victims, filler, retry]).count() == 7
    finally:  # a failure leaves no held or running job of this test on the cluster other suites share
        qdel_quietly(*Campaign.objects.exclude(pk__in=before).values_list("job_number", flat=True))
