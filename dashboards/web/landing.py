"""The landing page's reads: a row of stat tiles that say at a glance what is happening, whether
anything is wrong and what is mine, and the user's campaigns (mine / my teams / all).

Every figure is scoped as the rest of the pages are (``core.scope``: an admin sees every team, anyone
else the teams they belong to) and read from the database and the last cluster poll; nothing here
asks the scheduler. Tiles: ``{"key", "label", "value" (text with its unit), "number" (the figure the
value shows: int, float or Decimal), "detail" (a line under it), "level" ("ok", "amber", "red" or
"info": no threshold applies), "href" (the page or anchor with the detail)}``.
"""
from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.core.paginator import Paginator
from django.db.models import Count, Q, Sum
from django.urls import NoReverseMatch, reverse
from django.utils import timezone

from dashboards.billing.bills import teams_billable_by, teams_spend_between
from dashboards.billing.budgets import budget_status
from dashboards.billing.periods import current_period
from dashboards.core.clock import duration_text
from dashboards.core.roles import is_admin
from dashboards.core.scope import campaigns_visible_to, tasks_visible_to
from dashboards.core.states import UNFINISHED_CAMPAIGN
from dashboards.models import Campaign, Cluster, Membership, Task
from dashboards.templatetags.ops import usd

#: A task pending longer than this (seconds) turns the "longest pending" tile amber; RED_S red.
PENDING_AMBER_S = 10 * 60
PENDING_RED_S = 60 * 60
#: Failed tasks in the last hour: any is amber; this fraction of the hour's ended tasks (and at
#: least FAILED_RED_MIN of them) is red.
FAILED_RED_FRACTION = 0.25
FAILED_RED_MIN = 3
#: Host states that are not trouble: up, and closed by its queues' calendar (planned).
HOST_FINE = ("up", "closed")
WAITING = ("pending", "held")


def _url(name: str, *args, query: str = "") -> str:
    """``reverse`` or '' where the URL is not installed (the ops pages are optional)."""
    try:
        return reverse(name, args=args) + (f"?{query}" if query else "")
    except NoReverseMatch:
        return ""


def _level(value: float, amber: float, red: float) -> str:
    return "red" if value >= red else "amber" if value >= amber else "ok"


def _tile(key: str, label: str, value: str, number, detail: str, level: str, href: str) -> dict[str, Any]:
    return {"key": key, "label": label, "value": value, "number": number, "detail": detail, "level": level,
            "href": href}


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def task_tiles(user: AbstractBaseUser, *, now: dt.datetime) -> list[dict[str, Any]]:
    """Running, waiting, longest pending and failed-in-the-last-hour tiles from the tasks ``user`` may see."""
    tasks = tasks_visible_to(user)
    active = tasks.filter(active=True)
    counts = active.aggregate(running=Count("id", filter=Q(state="running")),
                              pending=Count("id", filter=Q(state="pending")),
                              held=Count("id", filter=Q(state="held")),
                              error=Count("id", filter=Q(state="error")),
                              hosts=Count("host", filter=Q(state="running"), distinct=True),
                              long=Count("id", filter=Q(state="pending",
                                                        submitted_at__lt=now - dt.timedelta(seconds=PENDING_AMBER_S))))
    oldest = active.filter(state="pending", submitted_at__isnull=False).order_by("submitted_at", "pk").first()
    admin = is_admin(user)
    triage = _url("ops-triage") if admin else ""
    tiles = [
        _tile("running", "Running agents", _plural(counts["running"], "agent"), counts["running"],
              f"on {_plural(counts['hosts'], 'host')}", "info", "#by-team"),
        _tile("waiting", "Queued agents", _plural(counts["pending"] + counts["held"], "agent"),
              counts["pending"] + counts["held"],
              f"{counts['pending']} pending, {counts['held']} held" + (
                  f", {counts['error']} in error" if counts["error"] else ""),
              "red" if counts["error"] else "info", triage or "#campaigns"),
    ]
    if oldest is None:
        tiles.append(_tile("longest", "Longest pending", "none", 0, "no task is pending", "ok",
                           triage or "#campaigns"))
    else:
        wait = max(0.0, (now - oldest.submitted_at).total_seconds())
        tiles.append(_tile("longest", "Longest pending", duration_text(wait), wait,
                           f"task {oldest.task_id}; {counts['long']} pending longer than "
                           f"{duration_text(PENDING_AMBER_S)}",
                           _level(wait, PENDING_AMBER_S, PENDING_RED_S), _url("task", oldest.pk)))
    hour = tasks.filter(active=False, ended_at__gte=now - dt.timedelta(hours=1), ended_at__lte=now).aggregate(
        ended=Count("id"), failed=Count("id", filter=Q(state__in=("failed", "lost"))))
    failed, ended = hour["failed"], hour["ended"]
    level = "ok" if not failed else (
        "red" if failed >= FAILED_RED_MIN and failed >= FAILED_RED_FRACTION * ended else "amber")
    newest_failed = (tasks.filter(active=False, ended_at__gte=now - dt.timedelta(hours=1), state__in=("failed", "lost"),
                                  campaign__isnull=False).order_by("-ended_at").values("campaign_id").first())
    href = _url("campaign", newest_failed["campaign_id"], query="state=failed") if newest_failed else "#finished"
    tiles.append(_tile("failed", "Failed in the last hour", _plural(failed, "task"), failed,
                       f"of {_plural(ended, 'task')} that ended", level, href))
    return tiles


def cluster_tiles(user: AbstractBaseUser, seat_resource: str) -> list[dict[str, Any]]:
    """Slots, model API seats and hosts not up, summed over the clusters from their last status poll."""
    from dashboards.live.cluster import cluster_resources
    from schedulers.hosts import host_states

    slots_used = slots_total = 0
    seats_used = seats_total = 0.0
    has_seats = False
    hosts_total = 0
    down: list[str] = []
    for cluster in Cluster.objects.order_by("name"):
        status = cluster.status or {}
        resources = cluster_resources(cluster, seat_resource, set())
        for row in resources["slots"]:
            slots_used += row.get("in_use") or 0
            slots_total += row.get("total") or 0
        if resources["seats"]:
            has_seats = True
            seats_used += float(resources["seats"]["used"] or 0)
            seats_total += float(resources["seats"]["capacity"] or 0)
        for host in host_states(status.get("hosts") or [], status.get("queue_instances") or []):
            hosts_total += 1
            if host["state"] not in HOST_FINE:
                down.append(f"{host['name']} {host['state']}")
    tiles = [_tile("slots", "Slots in use", f"{slots_used} of {_plural(slots_total, 'slot')}", slots_used,
                   f"{slots_used / slots_total:.0%} of the cluster's slots" if slots_total else "no queue polled yet",
                   "info", "#clusters")]
    if has_seats:
        tiles.append(_tile("seats", "Model API seats in use", f"{seats_used:g} of {seats_total:g} seats", seats_used,
                           f"consumable {seat_resource}", "info", "#seats"))
    level = "ok" if not down else ("red" if len(down) * 2 > hosts_total else "amber")
    tiles.append(_tile("hosts", "Hosts down", f"{len(down)} of {_plural(hosts_total, 'host')}", len(down),
                       "; ".join(down[:3]) + (" …" if len(down) > 3 else "") if down else "every host is up",
                       level, "#hosts-card"))
    return tiles


def spend_tile(user: AbstractBaseUser, *, now: dt.datetime) -> dict[str, Any] | None:
    """Today's spend of the teams whose bill ``user`` reads, against their most used budget; None for
    a user who reads no bill (spend is for team leads and admins)."""
    teams = list(teams_billable_by(user).order_by("name"))
    if not teams:
        return None
    _first, begin, end = current_period("day", now=now)
    spent = sum((s["spent_usd"] for s in teams_spend_between(teams, begin, end).values()), Decimal(0))
    worst = None
    for team in teams:
        for status in budget_status(team, now=now):
            if worst is None or status["fraction"] > worst["fraction"]:
                worst = {**status, "team": team}
    if worst is None:
        detail, level = "no budget set", "info"
    else:
        budget = worst["budget"]
        detail = (f"{worst['team'].name}: {usd(worst['spent_usd'])} of its {usd(budget.amount_usd)} "
                  f"{budget.period} budget ({worst['fraction']:.0%})")
        level = "red" if worst["fraction"] >= 1 else "amber" if worst["crossed"] else "ok"
    return _tile("spend", "Spend today", f"{usd(spent) or '$0.00'} (USD)", spent, detail, level,
                 _url("ops-bills", query="period=day"))


def landing_tiles(user: AbstractBaseUser, *, seat_resource: str, now: dt.datetime | None = None
                  ) -> list[dict[str, Any]]:
    """Every tile for ``user``, in the order the page shows them (``now``: aware UTC, default the clock)."""
    now = now or timezone.now()
    tiles = task_tiles(user, now=now) + cluster_tiles(user, seat_resource)
    spend = spend_tile(user, now=now)
    if spend is not None:
        tiles.append(spend)
    mine = Campaign.objects.filter(launched_by=user, status__in=UNFINISHED_CAMPAIGN).count()
    teams = campaigns_visible_to(user).filter(status__in=UNFINISHED_CAMPAIGN).count()
    tiles.append(_tile("mine", "My campaigns running", _plural(mine, "campaign"), mine,
                       f"{teams} unfinished on {'every team' if is_admin(user) else 'my teams'}", "info",
                       "#my-campaigns"))
    return tiles


# --------------------------------------------------------------------------- my campaigns

#: Sort keys of the campaign table: URL value -> (ORM ordering, label).
CAMPAIGN_SORTS = {"launched": ("launched_at", "Launched"), "name": ("name", "Campaign"),
                  "team": ("team__name", "Team"), "status": ("status", "Status"),
                  "tasks": ("task_count", "Tasks"), "cost": ("cost", "Cost (USD)")}
SCOPES = ("mine", "teams", "all")
CAMPAIGNS_PER_PAGE = 20


def my_campaigns(user: AbstractBaseUser, *, scope: str = "", q: str = "", status: str = "",
                 sort: str = "launched", descending: bool = True, page: int = 1) -> dict[str, Any]:
    """The campaigns of ``scope``: ``mine`` (launched by ``user``), ``teams`` (the teams ``user`` is
    on; for an admin, every team they belong to) or ``all`` (admins: every team; anyone else gets
    ``teams``; any other value: ``mine``, or ``teams`` for a user who launched none), filtered by name (``q``) and ``status`` ("unfinished" or a campaign status), sorted
    by a key of :data:`CAMPAIGN_SORTS`. Returns ``{"rows": [{"id", "name", "team", "launched_by",
    "launched_at", "status", "tasks", "ended", "failed", "running", "waiting", "progress_pct",
    "cost_usd" (Decimal | None)}], "scope", "scopes": [allowed scopes], "page": Paginator page,
    "sort", "descending", "q", "status"}``."""
    admin = is_admin(user)
    scopes = list(SCOPES if admin else SCOPES[:2])
    if scope not in scopes:  # by default mine, or my teams' when I launched none
        scope = "mine" if Campaign.objects.filter(launched_by=user).exists() else "teams"
    if scope == "mine":
        campaigns = campaigns_visible_to(user).filter(launched_by=user)
    elif scope == "teams":
        campaigns = Campaign.objects.filter(team_id__in=Membership.objects.filter(user=user).values("team_id"))
    else:
        campaigns = Campaign.objects.all()
    q = q.strip()[:100]
    if q:
        campaigns = campaigns.filter(name__icontains=q)
    if status == "unfinished":
        campaigns = campaigns.filter(status__in=UNFINISHED_CAMPAIGN)
    elif status:
        campaigns = campaigns.filter(status=status)
    field = CAMPAIGN_SORTS.get(sort, CAMPAIGN_SORTS["launched"])[0]
    sort = sort if sort in CAMPAIGN_SORTS else "launched"
    campaigns = campaigns.select_related("team", "launched_by").annotate(cost=Sum("tasks__cost_usd"))
    order = f"-{field}" if descending else field
    campaigns = campaigns.order_by(order, "-pk" if descending else "pk")
    page_obj = Paginator(campaigns, CAMPAIGNS_PER_PAGE).get_page(page)
    rows = list(page_obj.object_list)
    counts = {r["campaign_id"]: r for r in (
        Task.objects.filter(campaign_id__in=[c.pk for c in rows])
        .values("campaign_id").annotate(
            ended=Count("id", filter=Q(active=False)), failed=Count("id", filter=Q(state__in=("failed", "lost"))),
            running=Count("id", filter=Q(active=True, state="running")),
            waiting=Count("id", filter=Q(active=True, state__in=WAITING)))
        .order_by())}
    out = []
    for c in rows:
        n = counts.get(c.pk, {})
        ended = n.get("ended", 0)
        out.append({"id": c.pk, "name": c.name, "team": c.team.name, "launched_by": c.launched_by.get_username(),
                    "launched_at": c.launched_at, "status": c.status, "urgent": c.urgent, "tasks": c.task_count,
                    "ended": ended, "failed": n.get("failed", 0), "running": n.get("running", 0),
                    "waiting": n.get("waiting", 0),
                    "progress_pct": round(100 * ended / c.task_count) if c.task_count else 0, "cost_usd": c.cost})
    return {"rows": out, "scope": scope, "scopes": scopes, "page": page_obj, "sort": sort,
            "descending": descending, "q": q, "status": status}
