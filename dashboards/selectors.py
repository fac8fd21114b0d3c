"""Reads for pages, API and consumers; every read is scoped to what a user may see.

An admin (staff) sees every team; anyone else sees the teams whose Django
group they belong to. Queue-wide numbers (slots, seats, quotas) are the
cluster's and are shown to every signed-in user.
"""
from __future__ import annotations

import datetime as dt
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Case, Count, IntegerField, QuerySet, Value, When

from worker.schedulers.base import LIFECYCLE_STATES, TERMINAL_STATES

from .models import Campaign, Cluster, Task, Team
from .roles import is_admin, teams_with

RECENT_FINISHED = 20
CAMPAIGNS_ON_QUEUE_PAGE = 50


def teams_visible_to(user: AbstractBaseUser) -> QuerySet[Team]:
    """Teams whose campaigns ``user`` may see (roles.py, capability ``view``)."""
    return teams_with(user, "view")


def campaigns_visible_to(user: AbstractBaseUser) -> QuerySet[Campaign]:
    return Campaign.objects.filter(team__in=teams_visible_to(user))


def tasks_visible_to(user: AbstractBaseUser) -> QuerySet[Task]:
    """Tasks of campaigns the user may see; admins also see jobs tco did not launch."""
    if is_admin(user):
        return Task.objects.all()
    return Task.objects.filter(campaign__team__in=teams_visible_to(user))


def _iso(value: dt.datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


def _state_counts(rows) -> dict[str, int]:
    counts = {state: 0 for state in LIFECYCLE_STATES}
    for state, n in rows:
        counts[state] = counts.get(state, 0) + n
    return counts


def cluster_resources(cluster: Cluster, seat_resource: str) -> dict[str, Any]:
    """Slots per cluster queue, model API seats and RQS limits from the last status poll.

    Returns ``{"queues": [{name, used, resv, available, total}], "seats":
    {resource, used, capacity} | None, "quotas": [{rule, resource, limit, used}],
    "status_at": ISO}``. Seats are the global host's consumable: capacity from
    its ``complex_values`` and what ``qhost -F`` says is left.
    """
    status = cluster.status or {}
    seats = None
    for host in status.get("hosts", []):
        if host.get("name") == "global":
            value = (host.get("resources") or {}).get(seat_resource)
            if isinstance(value, dict):  # {"value": "13.000000", "dominance": "gc"}
                value = value.get("value")
            capacity = (status.get("global_capacity") or {}).get(seat_resource)
            if value is not None and capacity is not None:
                seats = {"resource": seat_resource, "capacity": capacity, "used": round(capacity - float(value), 6)}
    return {
        "queues": status.get("queues", []),
        "seats": seats,
        "quotas": status.get("quotas", []),
        "status_at": _iso(cluster.status_at),
    }


def queue_summary(user: AbstractBaseUser, *, seat_resource: str = "anthropic_api") -> dict[str, Any]:
    """Everything the live queue page shows, scoped to ``user``, as a JSON-ready dict.

    Shape: ``{"generated_at", "clusters": [{name, polled_at, poll_error, queues,
    seats, quotas}], "totals": {state: n}, "campaigns": [{id, name, team,
    job_number, task_count, status, states: {state: n}}], "other_jobs":
    {state: n} | None (admins only), "recent_finished": [{...}]}``. Aggregated
    in the database: the page never loads every task.
    """
    from django.utils import timezone

    campaigns = list(
        campaigns_visible_to(user)
        .select_related("team")
        .order_by("-launched_at")[:CAMPAIGNS_ON_QUEUE_PAGE]
    )
    by_campaign: dict[int, dict[str, int]] = {c.pk: _state_counts([]) for c in campaigns}
    rows = (
        Task.objects.filter(campaign_id__in=list(by_campaign))
        .values_list("campaign_id", "state")
        .annotate(n=Count("id"))
    )
    for campaign_id, state, n in rows:
        by_campaign[campaign_id][state] += n

    visible = tasks_visible_to(user)
    totals = _state_counts(visible.filter(active=True).values_list("state").annotate(n=Count("id")))
    other_jobs = None
    if is_admin(user):
        other_jobs = _state_counts(
            Task.objects.filter(campaign__isnull=True, active=True).values_list("state").annotate(n=Count("id"))
        )

    finished = (
        visible.filter(state__in=TERMINAL_STATES, ended_at__isnull=False)
        .select_related("campaign")
        .order_by("-ended_at", "-id")[:RECENT_FINISHED]
    )
    clusters = []
    for cluster in Cluster.objects.order_by("name"):
        clusters.append(
            {
                "name": cluster.name,
                "polled_at": _iso(cluster.polled_at),
                "poll_error": cluster.poll_error,
                **cluster_resources(cluster, seat_resource),
            }
        )
    return {
        "generated_at": _iso(timezone.now()),
        "states": list(LIFECYCLE_STATES),
        "clusters": clusters,
        "totals": totals,
        "campaigns": [
            {
                "id": c.pk,
                "name": c.name,
                "team": c.team.name,
                "job_number": c.job_number,
                "task_count": c.task_count,
                "status": c.status,
                "states": by_campaign[c.pk],
            }
            for c in campaigns
        ],
        "other_jobs": other_jobs,
        "recent_finished": [
            {
                "task_id": t.task_id,
                "name": t.name,
                "campaign": t.campaign.name if t.campaign else None,
                "campaign_id": t.campaign_id,
                "state": t.state,
                "project": t.project,
                "host": t.host,
                "wallclock_s": t.wallclock_s,
                "exit_status": t.exit_status,
                "failed_code": t.failed_code,
                "ended_at": _iso(t.ended_at),
            }
            for t in finished
        ],
    }


def campaign_detail(user: AbstractBaseUser, campaign_id: int, *, page: int = 1, per_page: int = 100) -> dict[str, Any]:
    """One campaign's progress and a page of its tasks (failures and errors first).

    Raises ``Campaign.DoesNotExist`` when the campaign is not visible to ``user``.
    """
    campaign = campaigns_visible_to(user).select_related("team", "agent_definition").get(pk=campaign_id)
    tasks = campaign.tasks.all()
    states = _state_counts(tasks.values_list("state").annotate(n=Count("id")))
    done = sum(states[s] for s in TERMINAL_STATES)
    first = (max(page, 1) - 1) * per_page
    # Failures and errors first, then the rest by task number.
    ordered = tasks.annotate(
        rank=Case(When(state__in=["error", "failed", "lost"], then=Value(0)), default=Value(1),
                  output_field=IntegerField())
    ).order_by("rank", "task_number")[first:first + per_page]
    return {
        "campaign": campaign,
        "states": states,
        "done": done,
        "progress_pct": round(100.0 * done / campaign.task_count, 1) if campaign.task_count else 0.0,
        "tasks": list(ordered),
        "page": page,
        "pages": max(1, -(-campaign.task_count // per_page)),
    }
