"""The assistant's answers: tco's read-only views, as the token's user sees them.

Plain Django (no MCP here): each function takes the user an API token
resolved to (``caller``) and returns a JSON-ready dict, reading only through
``dashboards.selectors`` (scoped to the user's teams, as the pages and the
REST API are) and ``dashboards.billing`` (teams where the user has ``bill``).
Something the user may not see raises :class:`Refused` with the same words
as something that does not exist, so a refusal tells nothing about other
teams. Nothing here writes to the database or the scheduler.
"""
from __future__ import annotations

import datetime as dt
import re
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser

from dashboards.core import accounts
from dashboards.billing import bills
from dashboards.billing import periods
from dashboards.core import encoding
from dashboards.core import errors
from dashboards.core import scope
from dashboards.live import campaign as live_campaign
from dashboards.live import cluster
from dashboards.live import queue
from dashboards.live import task as live_task
from schedulers import base
from dashboards.models import Campaign, Task
from dashboards.core.scheduler_cache import pending_position

from .facts import FactContext, held_predecessor_reasons, pending_facts

__all__ = ["Refused", "caller", "queue_summary", "campaign", "task", "why_pending", "team_bill", "find_task",
           "TASK_LOG_CHARS"]

#: Characters of a task's stdout/stderr an answer carries (the last ones; the page shows the file).
TASK_LOG_CHARS = 4000
#: States in which tco explains why a task is not running (``selectors.task_detail``).
WAITING_STATES = ("pending", "held", "error")


class Refused(Exception):
    """The caller may not have this answer (or it does not exist); ``str(err)`` is told to the assistant."""


def caller(key: str | None) -> AbstractBaseUser:
    """The active user whose tco API token is ``key``. Raises :class:`Refused` for none, a wrong, revoked
    or deactivated one (``dashboards.core.accounts.api_token_user``)."""
    if not key:
        raise Refused("no tco API token: set TCO_API_TOKEN (stdio) or send Authorization: Bearer <token> (HTTP)")
    user = accounts.api_token_user(key)
    if user is None:
        raise Refused("the tco API token is not valid (wrong, revoked, or its user is deactivated)")
    return user


def _page(page: int) -> int:
    if not isinstance(page, int) or page < 1:
        raise Refused("page must be a positive integer")
    return page


def queue_summary(user: AbstractBaseUser, *, page: int = 1) -> dict[str, Any]:
    """The live queue page for ``user``: ``selectors.queue_summary`` (clusters, totals per state, team and
    queue, a page of campaigns)."""
    return queue.queue_summary(user, seat_resource=settings.TCO_SEAT_RESOURCE, page=_page(page))


def campaign(user: AbstractBaseUser, campaign_id: int, *, page: int = 1, state: str | None = None) -> dict[str, Any]:
    """One campaign as its page shows it (``selectors.campaign_detail``). Raises :class:`Refused` when the
    user may not see it, it does not exist, or ``state`` is not a lifecycle state."""
    if state is not None and state not in base.LIFECYCLE_STATES:
        raise Refused(f"state must be one of {', '.join(base.LIFECYCLE_STATES)}")
    try:
        return live_campaign.campaign_detail(user, campaign_id, page=_page(page), state=state)
    except Campaign.DoesNotExist:
        raise Refused(f"no campaign {campaign_id} that you may see") from None


def _tail(read: dict | None) -> dict | None:
    if not isinstance(read, dict) or not isinstance(read.get("text"), str):
        return read
    text = read["text"]
    if len(text) <= TASK_LOG_CHARS:
        return read
    return {**read, "text": text[-TASK_LOG_CHARS:], "truncated": True}


#: A task as people write it: job.task as every page and qstat do ("1128.17"), a job number alone
#: ("1128"), or tco's own id after "#" ("#155", as in /tasks/155/).
TASK_TEXT = re.compile(r"^\s*(?:#(\d{1,18})|(\d{1,18})(?:\.(\d{1,18}))?)\s*$")


def find_task(user: AbstractBaseUser, task: int | str | None) -> Task:
    """The task ``task`` names, among those ``user`` may see.

    ``task`` is what the pages write: ``"1128.17"`` (job 1128, array task 17) or ``"1128"`` (job
    1128: a job that is not an array, else its first task still waiting, else its first task);
    ``"#155"`` or the integer 155 is tco's own id (``/tasks/155/``). Where a job number names
    several tasks (job numbers wrap; several clusters), the one in the scheduler now wins, then
    the newest. Raises :class:`Refused` for a task the user may not see, one that does not exist
    (the same words) and text of another form.
    """
    if task is None or isinstance(task, bool):
        raise Refused("name a task: job.task as the pages write it (1128.17), a job number (1128), or #155 "
                      "for tco's own id")
    if isinstance(task, int):
        internal, job, number = task, None, None
    else:
        match = TASK_TEXT.match(str(task))
        if match is None:
            raise Refused(f"task {str(task)[:40]!r}: write it as the pages do, job.task (1128.17), a job number "
                          "(1128), or #155 for tco's own id (/tasks/155/)")
        internal = int(match.group(1)) if match.group(1) else None
        job = int(match.group(2)) if match.group(2) else None
        number = int(match.group(3)) if match.group(3) is not None else None
    shown = str(task).strip()
    visible = scope.tasks_visible_to(user)
    if internal is not None:
        found = visible.filter(pk=internal).first()
    else:
        tasks = visible.filter(job_number=job).order_by("-active", "-id")
        if number is not None:
            found = tasks.filter(task_number=number).first()
        else:
            found = (tasks.filter(is_array=False).first()
                     or tasks.filter(active=True, state__in=WAITING_STATES).order_by("task_number", "-id").first()
                     or tasks.order_by("-active", "task_number", "-id").first())
    if found is None:
        raise Refused(f"no task {shown} that you may see")
    return found


def task(user: AbstractBaseUser, task_id: int | str | None) -> dict[str, Any]:
    """One agent (task) as its page shows it (``selectors.task_detail``), stdout/stderr cut to their last
    ``TASK_LOG_CHARS`` characters. ``task_id``: tco's id, or text :func:`find_task` reads (``"1128.17"``).
    Raises :class:`Refused` when the user may not see it or it does not exist."""
    row = find_task(user, task_id)
    try:
        detail = live_task.task_detail(user, row.pk)
    except Task.DoesNotExist:
        raise Refused(f"no task {task_id} that you may see") from None
    detail["stdout"], detail["stderr"] = _tail(detail.get("stdout")), _tail(detail.get("stderr"))
    return detail


def why_pending(user: AbstractBaseUser, task_id: int | str | None) -> dict[str, Any]:
    """Why a task is not running: tco's plain-words reasons and the scheduler facts behind them.

    ``task_id``: the task as the pages write it (``"1128.17"``, ``"1128"``, ``"#155"``) or tco's
    id (an integer), :func:`find_task`.

    Returns ``{"task": {id, task_id, job_number, task_number, state, project,
    queue, campaign}, "waiting": bool, "reasons": [{text, raw}] (the task page's:
    tco's own hold first (who paused it, when, what lets it run), explain_pending,
    the policy position; then a held predecessor the user may see; [] when the
    task is not waiting), "facts": {name:
    value} (``facts.PROVIDERS``: dependencies, requests, consumables, quotas,
    share_tree, queues, calendars, reservations, position, scheduler_messages;
    present only when they say something), "scheduler": {"fetched_at", "error"}
    | None, "status_at": ISO of the cluster poll}``. Raises :class:`Refused`
    when the user may not see the task.
    """
    found = find_task(user, task_id)
    try:
        row = scope.task_for(user, found.pk)
        detail = live_task.task_detail(user, found.pk)
    except Task.DoesNotExist:
        raise Refused(f"no task {task_id} that you may see") from None
    waiting = row.active and row.state in WAITING_STATES
    scheduler = detail.get("scheduler") or None
    job = (scheduler or {}).get("detail") if waiting else None
    visible = scope.visible_team_ids(user)
    projects = None if visible is None else set(
        scope.teams_visible_to(user).values_list("project", flat=True))
    resources = cluster.cluster_resources(row.cluster, settings.TCO_SEAT_RESOURCE, projects)
    position = pending_position(row.cluster, row.job_number, row.project, user=user) if waiting else []
    facts = pending_facts(FactContext(task=row, detail=job, status=row.cluster.status or {},
                                      resources=resources, position=position,
                                      visible_tasks=scope.tasks_visible_to(user))) if waiting else {}
    reasons = list(detail.get("pending_reasons") or [])
    reasons += [r for r in held_predecessor_reasons(facts.get("dependencies")) if r not in reasons]
    return {
        "task": {"id": row.pk, "task_id": row.task_id, "job_number": row.job_number,
                 "task_number": row.task_number, "state": row.state, "project": row.project,
                 "queue": row.queue, "campaign": detail.get("campaign")},
        "waiting": waiting,
        "reasons": reasons,
        "facts": encoding.jsonable(facts),
        "scheduler": ({"fetched_at": scheduler.get("fetched_at"), "error": scheduler.get("error")}
                      if scheduler else None),
        "status_at": resources.get("status_at"),
    }


def _day(text: str | None, name: str, default: dt.date) -> dt.date:
    if not text:
        return default
    try:
        return dt.date.fromisoformat(text)
    except ValueError:
        raise Refused(f"{name} must be a date, YYYY-MM-DD") from None


def team_bill(user: AbstractBaseUser, team: str, *, period: str = "day", first: str | None = None,
              last: str | None = None, group_by: str = "team") -> dict[str, Any]:
    """A team's bill, as the bills page computes it (``billing.bill``), JSON-ready.

    ``team``: the team's project (or name). ``first``/``last``: local days
    ``YYYY-MM-DD`` (default: the 1st of this month to today, in the cluster's
    time zone); ``period``: day, week or month; ``group_by``: team, model or
    campaign. Costs are USD strings. Raises :class:`Refused` when the user
    has no ``bill`` capability on the team (lead role, or admin), the team
    does not exist, or the range is out of bounds (``billing.BillError``).
    """
    teams = bills.teams_billable_by(user)
    found = teams.filter(project=team).first() or teams.filter(name=team).first()
    if found is None:
        raise Refused(f"no bill of team {team!r} that you may read (bills need the team's lead role)")
    today, _, _ = periods.current_period("day")
    first_day = _day(first, "first", today.replace(day=1))
    last_day = _day(last, "last", today)
    try:
        result = bills.bill(teams=[found], period=period, first=first_day, last=last_day, group_by=group_by)
    except errors.BillError as exc:
        raise Refused(str(exc)) from None
    return {"team": found.name, "project": found.project, **encoding.jsonable(result)}
