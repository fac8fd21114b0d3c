"""The queue page (and its JSON): thin; every read goes through a scoped reader.

The page's live parts (the summary and the depth history) come from the same snapshots the sockets
get (``live.snapshots.current``: no SQL when someone of the same audience watches); the database is
read directly only when the live store cannot answer.
"""
from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from dashboards.core.install import install_id
from dashboards.core.scope import scope_of
from dashboards.live import queue
from dashboards.live import snapshots
from dashboards.web.views.common import int_param


def live_mark(message: dict | None) -> dict | None:
    """What the page's socket needs to skip snapshots older than the page: ``{"view", "epoch", "seq"}``."""
    return {"view": message["view"], "epoch": message["epoch"], "seq": message["seq"]} if message else None


@login_required
def queue_page(request: HttpRequest) -> HttpResponse:
    audience = scope_of(request.user)
    live = snapshots.current(snapshots.queue_view(audience, int_param(request, "page")))
    if live is not None:
        summary = live["data"]
    else:
        summary = queue.queue_summary(audience, seat_resource=settings.TCO_SEAT_RESOURCE,
                                      page=int_param(request, "page"))
    live_depth = snapshots.current(snapshots.depth_view(audience))
    if live_depth is not None:
        depth = live_depth["data"]
    else:
        depth = {"hour": queue.queue_depth_history(audience, "hour"),
                 "day": queue.queue_depth_history(audience, "day")}
    from dashboards.core.clusters import cluster_get_default
    from dashboards.launch.reservations import holders, rows_for
    cluster = cluster_get_default()
    reservations = rows_for(request.user, cluster)  # issue 17: advance reservations
    # Admins read this install's id: its jobs' names start with tco-<id>-c (docs/settings.md, "Install id").
    install = install_id() if audience.admin else ""
    return render(request, "dashboards/queue.html", {"summary": summary, "depth": depth,
                                                     "reservations": reservations, "holders": holders(cluster),
                                                     "seat_resource": settings.TCO_SEAT_RESOURCE,
                                                     "live_mark": live_mark(live), "install_id": install})


@login_required
def queue_json(request: HttpRequest) -> JsonResponse:
    return JsonResponse(queue.queue_summary(request.user, seat_resource=settings.TCO_SEAT_RESOURCE,
                                                page=int_param(request, "page")))
