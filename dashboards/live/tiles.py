"""The landing page's tiles of one audience scope: running, waiting, longest pending and failed-in-the-last-hour
from the tasks the scope sees, and slots, model seats and hosts not up from the clusters' last status poll.

They are the same for everyone who sees the same teams (``core.scope.Scope``), so the live producer builds
them once per audience and change, in the queue page's snapshot (``queue.queue_summary``'s ``tiles``); the
page GET and the landing fragment read them from there (issue 22: no aggregate over the tasks per page GET).
Tiles: ``{"key", "label", "value" (text with its unit), "number" (the figure the value shows: int, float or
Decimal), "detail" (a line under it), "level" ("ok", "amber", "red" or "info": no threshold applies),
"href" (the page or anchor with the detail)}``; the longest pending tile also has "since" (epoch seconds: the
submission its wait runs from), so that the page keeps its value moving between two snapshots
(``templatetags/clock.py``).
"""
from __future__ import annotations

import datetime as dt
from typing import Any

from django.db.models import Count, Q
from django.urls import NoReverseMatch, reverse

from dashboards.core.failures import decided_filter, infrastructure_filter
from dashboards.core.scope import Scope, tasks_visible_to
from dashboards.models import Cluster
from schedulers.durations import duration_text

#: A task pending longer than this (seconds) turns the "longest pending" tile amber; RED_S red.
PENDING_AMBER_S = 10 * 60
PENDING_RED_S = 60 * 60
#: Failed tasks in the last hour: any is amber; this fraction of the hour's ended tasks (and at
#: least FAILED_RED_MIN of them) is red.
FAILED_RED_FRACTION = 0.25
FAILED_RED_MIN = 3
WAITING = ("pending", "held")


def url_or_blank(name: str, *args, query: str = "") -> str:
    """``reverse`` or '' where the URL is not installed (the ops pages are optional)."""
    try:
        return reverse(name, args=args) + (f"?{query}" if query else "")
    except NoReverseMatch:
        return ""


def _level(value: float, amber: float, red: float) -> str:
    return "red" if value >= red else "amber" if value >= amber else "ok"


def tile(key: str, label: str, value: str, number, detail: str, level: str, href: str) -> dict[str, Any]:
    """One tile (the shape in the module's docstring)."""
    return {"key": key, "label": label, "value": value, "number": number, "detail": detail, "level": level,
            "href": href}


def plural(n: int, word: str) -> str:
    """``"1 agent"``, ``"2 agents"``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def task_tiles(scope: Scope, *, now: dt.datetime) -> list[dict[str, Any]]:
    """Running, waiting, longest pending and failed-in-the-last-hour tiles from the tasks ``scope`` sees
    (``now``: aware UTC)."""
    tasks = tasks_visible_to(scope)
    active = tasks.filter(active=True)
    counts = active.aggregate(running=Count("id", filter=Q(state="running")),
                              pending=Count("id", filter=Q(state="pending")),
                              held=Count("id", filter=Q(state="held")),
                              error=Count("id", filter=Q(state="error")),
                              hosts=Count("host", filter=Q(state="running"), distinct=True),
                              long=Count("id", filter=Q(state="pending",
                                                        submitted_at__lt=now - dt.timedelta(seconds=PENDING_AMBER_S))))
    oldest = active.filter(state="pending", submitted_at__isnull=False).order_by("submitted_at", "pk").first()
    triage = url_or_blank("ops-triage") if scope.admin else ""
    tiles = [
        tile("running", "Running agents", plural(counts["running"], "agent"), counts["running"],
              f"on {plural(counts['hosts'], 'host')}", "info", "#by-team"),
        tile("waiting", "Queued agents", plural(counts["pending"] + counts["held"], "agent"),
              counts["pending"] + counts["held"],
              f"{counts['pending']} pending, {counts['held']} held" + (
                  f", {counts['error']} in error" if counts["error"] else ""),
              "red" if counts["error"] else "info", triage or "#campaigns"),
    ]
    if oldest is None:
        tiles.append(tile("longest", "Longest pending", "none", 0, "no task is pending", "ok",
                           triage or "#campaigns"))
    else:
        wait = max(0.0, (now - oldest.submitted_at).total_seconds())
        tiles.append({**tile("longest", "Longest pending", duration_text(wait), wait,
                              f"task {oldest.task_id}; {counts['long']} pending longer than "
                              f"{duration_text(PENDING_AMBER_S)}",
                              _level(wait, PENDING_AMBER_S, PENDING_RED_S), url_or_blank("task", oldest.pk)),
                      "since": oldest.submitted_at.timestamp()})
    # The infrastructure's share is said apart (a lost host, the scheduler, tco's runner or proxy:
    # core.failures): a fresh user read a host crash's 22 failed tasks as the agents'.
    hour = tasks.filter(active=False, ended_at__gte=now - dt.timedelta(hours=1), ended_at__lte=now).aggregate(
        ended=Count("id"), failed=Count("id", filter=Q(state__in=("failed", "lost"))),
        infrastructure=Count("id", filter=Q(state__in=("failed", "lost")) & infrastructure_filter()),
        decided=Count("id", filter=decided_filter()))
    # Tasks killed by a cancel or delete asked of tco are someone's decision, not failures, and not counted
    # among the ended ones either (core.failures.decided_filter; the failure-burst alert's rule).
    decided = hour["decided"]
    failed, ended = hour["failed"] - decided, hour["ended"] - decided
    infrastructure = f"; {hour['infrastructure']} the infrastructure's" if hour["infrastructure"] else ""
    if decided:
        infrastructure += f"; {decided} more killed by a cancel, not counted"
    level = "ok" if not failed else (
        "red" if failed >= FAILED_RED_MIN and failed >= FAILED_RED_FRACTION * ended else "amber")
    newest_failed = (tasks.filter(active=False, ended_at__gte=now - dt.timedelta(hours=1), state__in=("failed", "lost"),
                                  campaign__isnull=False).order_by("-ended_at").values("campaign_id").first())
    href = url_or_blank("campaign", newest_failed["campaign_id"], query="state=failed") if newest_failed else "#finished"
    tiles.append(tile("failed", "Failed in the last hour", plural(failed, "task"), failed,
                       f"of {plural(ended, 'task')} that ended{infrastructure}", level, href))
    return tiles


def cluster_tiles(seat_resource: str) -> list[dict[str, Any]]:
    """Slots, model API seats (``seat_resource``, the consumable's name) and hosts not up, summed over the
    clusters from their last status poll; the same for every user. A host in load alarm is busy, not down
    (``core.health.host_trouble``), and is said apart with its load against the threshold."""
    from dashboards.core.health import host_trouble
    from dashboards.live.cluster import cluster_resources

    slots_used = slots_total = 0
    seats_used = seats_total = 0.0
    has_seats = False
    clusters = list(Cluster.objects.order_by("name"))
    for cluster in clusters:
        resources = cluster_resources(cluster, seat_resource, set())
        for row in resources["slots"]:
            slots_used += row.get("in_use") or 0
            slots_total += row.get("total") or 0
        if resources["seats"]:
            has_seats = True
            seats_used += float(resources["seats"]["used"] or 0)
            seats_total += float(resources["seats"]["capacity"] or 0)
    tiles = [tile("slots", "Slots in use", f"{slots_used} of {plural(slots_total, 'slot')}", slots_used,
                   f"{slots_used / slots_total:.0%} of the cluster's slots" if slots_total else "no queue polled yet",
                   "info", "#clusters")]
    if has_seats:
        tiles.append(tile("seats", "Model API seats in use", f"{seats_used:g} of {seats_total:g} seats", seats_used,
                           f"consumable {seat_resource}", "info", "#seats"))
    trouble = host_trouble(clusters)
    down, total = trouble.down, trouble.hosts
    detail = "; ".join(down[:3]) + (" …" if len(down) > 3 else "") if down else "every host is up"
    if trouble.busy:
        detail += "; " + "; ".join(trouble.busy[:2]) + (" …" if len(trouble.busy) > 2 else "")
    level = "ok" if not down else ("red" if len(down) * 2 > total else "amber")
    tiles.append(tile("hosts", "Hosts down", f"{len(down)} of {plural(total, 'host')}", len(down), detail, level,
                      "#hosts-card"))
    return tiles


def scope_tiles(scope: Scope, *, seat_resource: str, now: dt.datetime) -> list[dict[str, Any]]:
    """:func:`task_tiles` then :func:`cluster_tiles`: the tiles of one audience, in the page's order."""
    return task_tiles(scope, now=now) + cluster_tiles(seat_resource)
