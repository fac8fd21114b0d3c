"""Issue 23, finding 1, on the real cluster: an agent that writes without end and one whose processes
allocate without end, launched with a disk and a memory limit from the launch service, end by
themselves with the limit named in their rows and on their pages, while a second campaign of demo
agents finishes normally. The kernel stops both: the writer's /sandbox is a tmpfs of its disk limit
(ENOSPC), the allocators' memory cgroup kills one of them.

Needs the execution hosts' memory cgroup directory (scripts/dev-cluster makes it and mounts the
memory controller in each host's namespace; docs/limits.md). Run as ``tco`` through
``scripts/test`` under the cluster lock.
"""
from __future__ import annotations

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from dashboards.core.clusters import cluster_get_default, scheduler_for
from dashboards.models import AgentDefinition, Task, Team
from tests.integration.test_hosts import campaign_over, drive_until
from tests.integration.test_hosts import launch as launch_demo

pytestmark = [pytest.mark.integration, pytest.mark.django_db(transaction=True)]

MIB = 1 << 20
# The hostile agent: "disk" writes 1 MiB files (each under the file size limit) without end;
# "memory" forks four processes that each touch 16 MiB blocks without end (each under its own
# per-process limit until the group's is reached). Exits 3 when its children were killed.
HOG = """
import json, os, time
mode = json.load(open('/sandbox/input.json'))['mode']
if mode == 'disk':
    block, i = b'x' * (1 << 20), 0
    while True:
        with open('/sandbox/f%d' % i, 'wb') as f:
            f.write(block)
        i += 1
        time.sleep(0.005)
kids = []
for _ in range(4):
    pid = os.fork()
    if pid == 0:
        keep = []
        while True:
            keep.append(b'\\x01' * (16 << 20))
            time.sleep(0.01)
    kids.append(pid)
codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in kids]
print('children', codes, flush=True)
raise SystemExit(3)
"""


def test_an_agent_past_its_disk_or_memory_limit_ends_with_the_reason_while_another_campaign_finishes(
        bootstrap, sge_cluster, settings):
    settings.TCO_SANDBOX_LIMITS = {**settings.TCO_SANDBOX_LIMITS, "TCO_SANDBOX_WORK_CHECK_S": "1"}
    cluster = cluster_get_default()
    scheduler = scheduler_for(cluster)
    admin = get_user_model().objects.get(username="admin")
    from dashboards.launch.service import LaunchRequest, launch
    from dashboards.launch.submit import campaign_submit

    hog = AgentDefinition.objects.create(name="limit-hog", version=1, command=["/usr/bin/python3", "-c", HOG],
                                         timeout_s=600)
    hostile = launch(user=admin, request=LaunchRequest(
        team=Team.objects.get(project="research"), agent_definition=hog, name="limit-hog",
        inputs=[{"mode": "disk"}, {"mode": "memory"}], memory_bytes=256 * MIB, work_bytes=64 * MIB)).campaign
    hostile = campaign_submit(campaign_id=hostile.pk)
    assert hostile.status == "submitted", hostile.submit_error
    calm = launch_demo("limit-neighbour", [{"task": n, "duration_s": 5.0} for n in (1, 2, 3)])
    drive_until(cluster, scheduler, lambda: campaign_over(hostile, hostile.job_number)()
                and campaign_over(calm, calm.job_number)(), 300,
                lambda: f"not over: {list(Task.objects.filter(campaign__in=[hostile, calm]).values_list('name', 'task_number', 'state'))}")
    drive_until(cluster, scheduler, lambda: not Task.objects.filter(campaign=hostile, runner_record__isnull=True)
                .exists(), 60, lambda: "no runner records")

    assert sorted(Task.objects.filter(campaign=calm).values_list("task_number", "state")) == [
        (1, "done"), (2, "done"), (3, "done")]
    disk = Task.objects.get(campaign=hostile, task_number=1)
    memory = Task.objects.get(campaign=hostile, task_number=2)
    disk_record, memory_record = disk.runner_record, memory.runner_record
    assert disk.state == "failed" and "workdir_over_quota" in disk_record["flags"]
    assert disk_record["error"] == "work directory limit 64 MiB reached"
    assert disk_record["sandbox"]["limits"]["work_bytes"] == 64 * MIB
    # The kernel stopped it: /sandbox is a tmpfs of 64 MiB, its next write failed with ENOSPC (the
    # agent's own traceback), and nothing past the limit was written, there or on the spool.
    assert disk_record["sandbox"]["workdir"] == "tmpfs"
    assert 63 * MIB < disk_record["sandbox"]["work_bytes"] <= 64 * MIB
    assert disk.exit_status == 1 and disk_record["stages"]["agent_exited_at"] is not None
    with open(disk_record["stderr_path"], encoding="utf-8") as stderr:
        assert "OSError: [Errno 28] No space left on device" in stderr.read()
    assert disk_record["sandbox"]["work_kept"]["bytes"] <= 64 * MIB
    group = memory_record["sandbox"]["memory_cgroup"]
    assert memory.state == "failed" and memory.exit_status == 3 and "memory_limit" in memory_record["flags"]
    # The task's group holds its processes and its tmpfs work directory's pages: 256 + 64 MiB.
    assert group["limit_bytes"] == 320 * MIB and group["oom_kills"] >= 1 and group["peak_bytes"] <= 320 * MIB
    assert memory_record["error"].startswith("memory limit 256 MiB reached (the task's processes together")

    client = Client()
    client.force_login(admin)
    for task, words in ((disk, "work directory limit 64 MiB reached"), (memory, "memory limit 256 MiB reached")):
        response = client.get(f"/tasks/{task.pk}/")
        assert response.status_code == 200
        assert f"Stopped by a limit: {words}" in response.content.decode()
        failure = client.get(f"/api/tasks/{task.pk}/").json()
        failure = failure.get("failure") or failure["task"]["failure"]
        assert failure["kind"] == "limit" and failure["text"].startswith(f"{words}")
    assert client.get(f"/campaigns/{calm.pk}/").status_code == 200
