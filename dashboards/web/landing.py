"""The landing page's reads: a row of stat tiles that say at a glance what is happening, whether
anything is wrong and what is mine, and the user's campaigns (mine / my teams / all).

Every figure is scoped as the rest of the pages are (``core.scope``: an admin sees every team, anyone
else the teams they belong to) and read from the database and the last cluster poll; nothing here
asks the scheduler. The tiles of the user's audience (tasks, slots, seats, hosts) are
``live.tiles.scope_tiles``, built once per audience by the live producer in the queue page's snapshot;
the user's own (spend, campaigns) are read here. Tiles: see ``dashboards.live.tiles``.
"""
from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.core.paginator import Paginator
from django.db.models import Count, Q, Sum
from django.utils import timezone

from dashboards.billing.bills import teams_billable_by, teams_spend_between
from dashboards.billing.budgets import budget_status
from dashboards.billing.periods import current_period
from dashboards.core.roles import is_admin
from dashboards.core.scope import campaigns_visible_to, scope_of
from dashboards.core.states import UNFINISHED_CAMPAIGN
from dashboards.live.tiles import WAITING, plural, scope_tiles, tile, url_or_blank
from dashboards.models import Campaign, Membership, Task
from dashboards.templatetags.ops import usd

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
    return tile("spend", "Spend today", f"{usd(spent) or '$0.00'} (USD)", spent, detail, level,
                 url_or_blank("ops-bills", query="period=day"))


def failed_tile(audience_tile: dict[str, Any], *, now: dt.datetime) -> dict[str, Any]:
    """An admin's failures tile with the failures of jobs tco did not launch said as theirs (another
    account's qsub, or the demo's sweep, whose runs 5 and 8 fail on purpose), and the tile opening
    the newest such task when no campaign's task failed (the snapshot's tile then opens
    ``#finished``). Only admins see those jobs (``core.scope``); one query over the hour's failures."""
    others = list(Task.objects.filter(campaign__isnull=True, active=False, state__in=("failed", "lost"),
                                      ended_at__gte=now - dt.timedelta(hours=1), ended_at__lte=now)
                  .order_by("-ended_at", "-pk").values("pk", "job_number")[:1000])
    if not others:
        return audience_tile
    jobs = sorted({o["job_number"] for o in others})
    detail = (f"{audience_tile['detail']}; {len(others)} task{'s' if len(others) > 1 else ''} of jobs tco did not "
              f"launch (job{'s' if len(jobs) > 1 else ''} "
              f"{', '.join(str(j) for j in jobs[:3])}{' …' if len(jobs) > 3 else ''})")
    href = audience_tile["href"] if audience_tile["href"] != "#finished" else url_or_blank("task", others[0]["pk"])
    return {**audience_tile, "detail": detail, "href": href}


def landing_tiles(user: AbstractBaseUser, *, seat_resource: str, now: dt.datetime | None = None,
                  audience: list[dict[str, Any]] | None = None) -> list[dict[str, Any]]:
    """Every tile for ``user``, in the order the page shows them (``now``: aware UTC, default the clock).
    ``audience``: the tiles of the user's audience scope as the live queue snapshot holds them
    (``live.tiles.scope_tiles``, the same list); None reads them from the database here."""
    now = now or timezone.now()
    tiles = list(audience) if audience is not None else scope_tiles(scope_of(user), seat_resource=seat_resource,
                                                                      now=now)
    tiles = [failed_tile(t, now=now) if t["key"] == "failed" and is_admin(user) else t for t in tiles]
    spend = spend_tile(user, now=now)
    if spend is not None:
        tiles.append(spend)
    mine = Campaign.objects.filter(launched_by=user, status__in=UNFINISHED_CAMPAIGN).count()
    teams = campaigns_visible_to(user).filter(status__in=UNFINISHED_CAMPAIGN).count()
    tiles.append(tile("mine", "My campaigns running", plural(mine, "campaign"), mine,
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
    ``teams``; any other value: ``mine``, or for a user who launched none ``all`` for an admin and ``teams``
    for anyone else), filtered by name (``q``) and ``status`` ("unfinished" or a campaign status), sorted
    by a key of :data:`CAMPAIGN_SORTS`. Returns ``{"rows": [{"id", "name", "team", "launched_by",
    "launched_at", "status", "tasks", "ended", "failed", "running", "waiting", "progress_pct",
    "cost_usd" (Decimal | None)}], "scope", "scopes": [allowed scopes], "page": Paginator page,
    "sort", "descending", "q", "status"}``."""
    admin = is_admin(user)
    scopes = list(SCOPES if admin else SCOPES[:2])
    if scope not in scopes:  # by default mine; when I launched none, all (an admin) or my teams'
        # make demo launches as the teams' launchers: its admin launched none and is on no team.
        scope = "mine" if Campaign.objects.filter(launched_by=user).exists() else ("all" if admin else "teams")
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
