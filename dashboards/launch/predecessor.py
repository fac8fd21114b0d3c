"""A campaign chained to a predecessor job (``-hold_jid_ad``): which jobs a launcher may name, and their size."""
from __future__ import annotations

from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Q

from dashboards.core.errors import LaunchError
from dashboards.core.roles import teams_with
from dashboards.models import Campaign, Cluster, Task


def visible_predecessor(user: AbstractBaseUser, job_number: int, cluster: Cluster) -> tuple[Campaign | None, Any]:
    """The ``-hold_jid_ad`` predecessor job ``job_number`` on ``cluster`` as ``user`` may see it:
    ``(campaign, tasks)`` with the latest campaign of that job of a team the user views (else None)
    and a Task queryset of the job's rows the user may see (the campaign's, and rows tco recorded
    without a campaign in a viewed team's project, such as the demo sweep). A job of another team
    gives ``(None, <no rows>)``: callers must then say only that it is not a job of a team the user
    can see (job numbers are sequential; anything more enumerates other teams' work)."""
    teams = teams_with(user, "view")
    campaign = (Campaign.objects.filter(cluster=cluster, job_number=job_number, team__in=teams)
                .select_related("team").order_by("-launched_at").first())
    tasks = Task.objects.filter(cluster=cluster, job_number=job_number)
    if campaign is not None:
        return campaign, tasks.filter(Q(campaign=campaign) | Q(campaign__isnull=True, project=campaign.team.project))
    return None, tasks.filter(campaign__isnull=True, project__in=teams.values("project"))


def predecessor_tasks(campaign: Campaign | None, rows) -> int:
    """How many tasks a visible predecessor has (:func:`visible_predecessor`'s pair): its campaign's
    task count, else the distinct task numbers of its active rows (a job tco recorded, such as the
    demo sweep); 0 when nothing of it is active."""
    if campaign is not None:
        return campaign.task_count
    return rows.filter(active=True).values("task_number").distinct().count()


def mismatch_text(job_number: int, predecessor_count: int, count: int) -> str:
    """Why ``-hold_jid_ad`` refuses ``count`` tasks on a predecessor of ``predecessor_count``: it pairs
    task N with task N (qsub(1) -hold_jid_ad: both arrays must have the same size)."""
    return (f"This campaign has {count} task{'s' if count != 1 else ''}, but -hold_jid_ad pairs task N with task N "
            f"of predecessor job {job_number}, which has {predecessor_count}: give it {predecessor_count} tasks.")


def check_predecessor(user: AbstractBaseUser, job_number: int | None, count: int, cluster: Cluster) -> None:
    """``-hold_jid_ad`` only on a job on ``cluster`` (the one the campaign is launched on) of a team
    the user sees, with the same number of tasks (:func:`visible_predecessor`; a job without a
    campaign must have active tasks). Raises LaunchError."""
    if job_number is None:
        return
    predecessor, rows = visible_predecessor(user, job_number, cluster)
    tasks = predecessor_tasks(predecessor, rows)
    if predecessor is None and not tasks:
        raise LaunchError(f"predecessor job {job_number}: not a campaign of a team you can see "
                          "(nor a job tco recorded for one)")
    if tasks != count:
        raise LaunchError(mismatch_text(job_number, tasks, count))
