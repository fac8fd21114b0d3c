"""Campaigns and their tasks written straight to the database (no scheduler), and the demo users' password."""
from __future__ import annotations

#: The password of the demo users of each role (``role_users``).
DEMO_PASSWORD = "test-demo-pw-1"


def make_campaign(*, team, user, name: str, tasks: list[dict] | None = None, job_number: int = 1000,
                  status: str = "submitted", launched_at=None, **fields):
    """A campaign and its tasks written straight to the database (no scheduler).

    ``tasks``: one dict of Task field values per task (task_number defaults to
    its position, 1-based; state to pending).
    """
    import datetime as dt

    from django.utils import timezone

    from dashboards.models import AgentDefinition, Campaign, Task
    from dashboards.core.clusters import cluster_get_default
    from dashboards.launch.submit import campaign_job_name

    cluster = cluster_get_default()
    launched_at = launched_at or timezone.now() - dt.timedelta(minutes=5)
    tasks = tasks if tasks is not None else [{}]
    campaign = Campaign.objects.create(
        name=name, cluster=cluster, team=team, agent_definition=AgentDefinition.objects.get(name="demo-agent"),
        launched_by=user, queue="agent.q", task_count=len(tasks), status=status, launched_at=launched_at,
        submitted_at=launched_at + dt.timedelta(seconds=0.25), job_number=job_number, **fields)
    rows = []
    for n, values in enumerate(tasks, 1):
        values = {"task_number": n, "state": "pending", "state_code": "qw", "submitted_at": launched_at, **values}
        values.setdefault("active", values["state"] not in ("done", "failed", "deleted", "lost"))
        rows.append(Task(cluster=cluster, campaign=campaign, job_number=job_number, is_array=True,
                         name=campaign_job_name(campaign), owner="tco", project=team.project, **values))
    Task.objects.bulk_create(rows)
    from dashboards.core import rollups

    rollups.tasks_added(t.id for t in rows)  # ended tasks are in the usage rollups, as ingest keeps them
    return campaign
