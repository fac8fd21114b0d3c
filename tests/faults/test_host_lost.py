"""An execution host lost mid-campaign and back: each task ends as the scheduler says, once.

A rerunnable campaign (``-r y``) of six demo agents of 60 s spreads over the agent hosts; every
process of the host that runs most of them is killed at once (execd, shepherds, runners, agents:
scripts/cluster-faults "crash"), and the host comes back a little later. Grid Engine then writes a
record for each task that ran there (``failed`` 19) and, as ``-r y`` allows, may run it again
elsewhere. However it decides, every task ends with one row, in the state its last accounting
record says (a rerun: done; not rerun: failed, "execution host ... was lost"), and every record of
the job is in the database once. Runs as the submit account with scripts/cluster-faults (started
by scripts/faults); the workers' rounds are run here, as they run them.
"""
from __future__ import annotations

import os

import pytest
from django.contrib.auth import get_user_model

from dashboards.core.clusters import cluster_get_default
from dashboards.launch.service import LaunchRequest, launch
from dashboards.launch.submit import campaign_submit
from dashboards.live.task import task_detail
from dashboards.models import AccountingRecord, AgentDefinition, Task, Team
from tests.support.hosts import agent_hosts, fault, qstat_tasks, queue_instances, wait_runners_started

from .ledger import compare, report
from .services import poll_cycle, wait_for

pytestmark = [pytest.mark.integration]


def test_a_host_lost_mid_campaign_and_back_ends_each_task_once_as_the_scheduler_says(fault_db, settings):
    if os.getuid() == 0:
        pytest.fail("run as the submit account tco (scripts/faults does): it submits through DRMAA")
    hosts, _ = agent_hosts()
    if len(hosts) < 2:
        pytest.fail(f"agent.q spans {hosts}: a host can only be lost on a cluster of two or more "
                    "(scripts/dev-cluster makes three)")
    settings.TCO_RUNNER_RECORD_GRACE_S = 3.0
    cluster = cluster_get_default()
    admin = get_user_model().objects.get(username="admin")
    campaign = launch(user=admin, request=LaunchRequest(
        team=Team.objects.get(project="research"), agent_definition=AgentDefinition.objects.get(name="demo-agent"),
        name="fault-host-lost", inputs=[{"task": n, "duration_s": 60.0} for n in range(1, 7)],
        rerunnable=True)).campaign
    campaign = campaign_submit(campaign_id=campaign.pk)
    assert campaign.status == "submitted", campaign.submit_error
    job = campaign.job_number
    placed = wait_for("the six tasks to run", lambda: poll_cycle(cluster) and (
        lambda seen: len(seen) == 6 and all("r" in s and h for s, h in seen.values()) and seen)(qstat_tasks(job)),
        180)
    placed = {n: h for n, (_, h) in placed.items()}
    lost = max(set(placed.values()), key=list(placed.values()).count)
    on_lost = sorted(n for n, h in placed.items() if h == lost)

    wait_runners_started(campaign.pk, on_lost)  # crashed while they run: failed 19 on its return, not 7
    fault("crash", lost)
    try:
        wait_for(f"{lost} to be unknown to the qmaster", lambda: (poll_cycle(cluster), all(
            "u" in s for q, (s, _) in queue_instances().items() if q.endswith("@" + lost)))[1], 180, step=1)
        # Unknown is not an end: no task of the lost host is ended on a guess while it is away.
        assert not Task.objects.filter(campaign=campaign, task_number__in=on_lost,
                                       state__in=("done", "failed", "lost")).exists()
    finally:
        fault("up", lost)
    wait_for("every task to end", lambda: poll_cycle(cluster) and not qstat_tasks(job) and not Task.objects.filter(
        campaign=campaign, active=True).exists(), 600, step=1)
    poll_cycle(cluster)

    tasks = {t.task_number: t for t in Task.objects.filter(campaign=campaign)}
    assert sorted(tasks) == [1, 2, 3, 4, 5, 6] and Task.objects.filter(campaign=campaign).count() == 6
    reran = []
    for number, task in tasks.items():
        records = list(AccountingRecord.objects.filter(job_number=job, task_number=number).order_by("end_us"))
        assert records, number
        last = records[-1]
        expected = "done" if (last.failed, last.exit_status) == (0, 0) else "failed"
        assert task.state == expected, (number, task.state, [(r.hostname, r.failed, r.exit_status) for r in records])
        if number in on_lost and expected == "failed":
            failure = task_detail(admin, task.pk)["task"]["failure"]
            assert failure["kind"] == "infrastructure" and failure["text"].startswith(
                f"execution host {lost} was lost"), failure
        if len(records) > 1:
            reran.append(number)
            assert records[0].hostname == lost and records[0].failed == 19 and task.host != lost
    assert set(reran) <= set(on_lost)
    result = compare(cluster, [cluster.accounting_path], jobs={job})
    report(result, f"execution host {lost} lost mid-campaign and back ({len(on_lost)} tasks there, "
                   f"{len(reran)} rerun elsewhere)")
    assert (result["lost"], result["doubled"], result["extra"]) == (0, 0, 0), result
    assert result["records"] == 6 + len(reran)
