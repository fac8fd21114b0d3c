"""Issue 16, bug 11: the cluster card said "agent.q 96/96 slots used" while the quota line said
"73 of 96". The card now splits the slots with one definition (dashboards.live.cluster.queue_slots)
whose parts add up to the total, and names the queue instances that make slots unavailable."""
from __future__ import annotations

from pathlib import Path

import pytest

from schedulers.gridengine.parsers.qquota import parse_qquota
from schedulers.hosts import parse_queue_instances

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def fixture(name: str) -> bytes:
    return (FIXTURES / name).read_bytes()


@pytest.mark.django_db
def test_the_queue_summary_carries_the_split_and_the_quota_it_is_compared_with(bootstrap, django_user_model):
    from dashboards.live import queue
    from dashboards.core.clusters import cluster_get_default
    from dashboards.models import Cluster

    admin = django_user_model.objects.get(username="admin")
    cluster = cluster_get_default()
    Cluster.objects.filter(pk=cluster.pk).update(status={
        "queues": [{"name": "agent.q", "used": 2, "resv": 0, "available": 0, "total": 96}],
        "quotas": parse_qquota(fixture("sge819/qquota.xml")), "global_capacity": {}, "hosts": [],
        "queue_instances": parse_queue_instances(fixture("multihost/qstat_f_unknown_disabled.xml"))})
    [c] = queue.queue_summary(admin)["clusters"]
    [agent] = [q for q in c["slots"] if q["name"] == "agent.q"]
    assert (agent["in_use"], agent["unavailable"], agent["free"]) == (2, 94, 0)
    [quota] = c["quotas"]
    assert quota["filters"] == {"queues": ["agent.q"]} and (quota["used"], quota["limit"]) == (5, 96)


@pytest.mark.django_db
def test_jobs_tco_did_not_launch_are_one_line_per_owner_for_admins(bootstrap, django_user_model):
    """Issue 16, "a queue page that is a health check": other accounts' jobs collapsed per owner."""
    from dashboards.live import queue
    from dashboards.core.clusters import cluster_get_default
    from dashboards.models import Task

    cluster = cluster_get_default()
    rows = [("alice", 3000, 1, "running", "r"), ("alice", 3000, 2, "pending", "qw"), ("alice", 3001, 1, "pending", "qw"),
            ("bob", 3002, 1, "running", "r"), ("alice", 2999, 1, "done", "")]  # the last one ended
    for owner, job, task, state, code in rows:
        Task.objects.create(cluster=cluster, job_number=job, task_number=task, name="theirs", owner=owner,
                            project="", state=state, state_code=code, active=state != "done")
    admin = django_user_model.objects.get(username="admin")
    owners = queue.queue_summary(admin)["other_owner_rows"]
    assert [(o["owner"], o["jobs"], o["tasks"]) for o in owners] == [("alice", 2, 3), ("bob", 1, 1)]
    assert (owners[0]["states"]["running"], owners[0]["states"]["pending"]) == (1, 2)
    viewer = django_user_model.objects.create_user("someone", password="someone-pw-123")
    assert queue.queue_summary(viewer)["other_owner_rows"] is None
