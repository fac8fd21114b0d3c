"""Campaigns and tasks as they stand after they ran (finished, with accounting records, tokens and
costs), written straight to the database: the history that bills, budgets, forecasts and triage read."""
from __future__ import annotations

import datetime as dt
import itertools
from decimal import Decimal

from dashboards.core import rollups
from dashboards.models import AccountingRecord, AgentDefinition, Campaign, Cluster, Task, Team

#: The password ``ops_logins`` gives every user of ``ops_users`` but the admin.
PASSWORD = "ops-test-pw-1"
_job_numbers = itertools.count(900_000)


def make_campaign(*, team: Team, user, name: str = "hist", status: str = "finished", count: int = 0,
                  model: str = "", agent: AgentDefinition | None = None, job_number: int | None = None) -> Campaign:
    from django.utils import timezone

    from dashboards.core.clusters import cluster_get_default

    return Campaign.objects.create(
        name=name, cluster=cluster_get_default(), team=team,
        agent_definition=agent or AgentDefinition.objects.get(name="demo-agent"), launched_by=user,
        queue="agent.q", task_count=count, status=status, launched_at=timezone.now(), model=model,
        job_number=job_number if job_number is not None else next(_job_numbers))


def make_task(campaign: Campaign | None, *, task_number: int = 1, started_at: dt.datetime | None,
              wallclock_s: float = 0.0, slots: int = 1, state: str = "done", tokens: dict | None = None,
              cost_usd: Decimal | str | None = None, project: str | None = None, job_number: int | None = None,
              cluster: Cluster | None = None, account: bool = True) -> Task:
    """A finished task with its accounting record (started at ``started_at``), tokens and cost."""
    from dashboards.core.clusters import cluster_get_default

    cluster = cluster or (campaign.cluster if campaign else cluster_get_default())
    job = job_number or (campaign.job_number if campaign else next(_job_numbers))
    project = project or (campaign.team.project if campaign else "research")
    ended = started_at + dt.timedelta(seconds=wallclock_s) if started_at else None
    submitted = (started_at or dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)) - dt.timedelta(seconds=5)
    task = Task.objects.create(
        cluster=cluster, campaign=campaign, job_number=job, task_number=task_number, is_array=True,
        project=project, state=state, active=state not in ("done", "failed", "deleted", "lost"),
        submitted_at=submitted, started_at=started_at, ended_at=ended, wallclock_s=wallclock_s, slots=slots,
        cost_usd=Decimal(str(cost_usd)) if cost_usd is not None else None, **(tokens or {}))
    if account and started_at is not None:
        def us(value: dt.datetime) -> int:
            return int(value.timestamp()) * 1_000_000

        record = AccountingRecord.objects.create(
            cluster=cluster, task=task, job_number=job, task_number=task_number, submission_us=us(submitted),
            start_us=us(started_at), end_us=us(ended), submitted_at=submitted, started_at=started_at,
            ended_at=ended, job_name="x", owner="tco", group="tco", project=project, queue="agent.q",
            hostname="vm", slots=slots, wallclock_s=wallclock_s, cpu_s=0.0, maxvmem_bytes=0.0, failed=0,
            exit_status=0)
        rollups.records_added([record.id])
    # As ingest does: an ended task and its record are in the usage rollups (dashboards.core.rollups).
    rollups.tasks_added([task.id])
    return task


def timing(*, cluster, team, count, queue="agent.q", seats_per_task=1, concurrency_cap=None, priority=0,
           duration_s=None, now=None, agent_definition=None, predecessor_job=None, user=None, scheduler=None):
    """``launch.forecast.timing_forecast`` for a campaign of ``count`` tasks with these launch fields."""
    from dashboards.launch.forecast import timing_forecast
    from dashboards.launch.service import LaunchRequest

    request = LaunchRequest(team=team, agent_definition=agent_definition, inputs=[{}] * count, name="forecast",
                            queue=queue, seats_per_task=seats_per_task, concurrency_cap=concurrency_cap,
                            priority=priority, predecessor_job=predecessor_job)
    return timing_forecast(request, cluster=cluster, duration_s=duration_s, user=user, now=now, scheduler=scheduler)
