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
    can see (job numbers are sequential; anything more enumerates other teams' work).

    The number is the job Grid Engine holds on *now*, so it is another team's when the latest
    campaign tco launched with that number on ``cluster`` is another team's, or when any active row
    of it is (a campaign of a team the user does not view, or a row without a campaign in another
    team's project), even if an older campaign of the user's team once had the same number (job
    numbers start again after a wrap or a new cluster spool)."""
    teams = teams_with(user, "view")
    tasks = Task.objects.filter(cluster=cluster, job_number=job_number)
    latest = Campaign.objects.filter(cluster=cluster, job_number=job_number).order_by("-launched_at", "-pk").first()
    mine = Q(campaign__team__in=teams) | Q(campaign__isnull=True, project__in=teams.values("project"))
    if ((latest is not None and not teams.filter(pk=latest.team_id).exists())
            or tasks.filter(active=True).exclude(mine).exists()):
        return None, tasks.none()
    campaign = latest
    if campaign is not None:
        return campaign, tasks.filter(Q(campaign=campaign) | Q(campaign__isnull=True, project=campaign.team.project))
    return None, tasks.filter(campaign__isnull=True, project__in=teams.values("project"))


def invisible_text(job_number: int) -> str:
    """Why a launch or its forecast refuses predecessor job ``job_number`` that is no job the user
    may see (:func:`visible_predecessor`): the same words for another team's job and an unknown
    number, so the answer tells nothing of which numbers are other teams' jobs."""
    return (f"predecessor job {job_number}: not a campaign of a team you can see "
            "(nor a job tco recorded for one)")


def check_visible(user: AbstractBaseUser, job_number: int, cluster: Cluster) -> int:
    """``job_number`` must be a job on ``cluster`` the user may see
    (:func:`visible_predecessor`: a campaign of a team the user views, else active rows tco recorded
    in such a team's project). The launch form checks it for a forecast and a launch alike, the
    launch service again (:func:`check_predecessor`). Returns its task count
    (:func:`predecessor_tasks`). Raises LaunchError (:func:`invisible_text`)."""
    predecessor, rows = visible_predecessor(user, job_number, cluster)
    tasks = predecessor_tasks(predecessor, rows)
    if predecessor is None and not tasks:
        raise LaunchError(invisible_text(job_number))
    return tasks


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
    the user sees (:func:`check_visible`), with the same number of tasks (a job without a campaign
    must have active tasks). Raises LaunchError."""
    if job_number is None:
        return
    tasks = check_visible(user, job_number, cluster)
    if tasks != count:
        raise LaunchError(mismatch_text(job_number, tasks, count))
