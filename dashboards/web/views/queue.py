"""The queue page (and its JSON): thin; every read goes through a scoped reader."""
from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from dashboards.live import queue
from dashboards.web.views.common import int_param


@login_required
def queue_page(request: HttpRequest) -> HttpResponse:
    summary = queue.queue_summary(request.user, seat_resource=settings.TCO_SEAT_RESOURCE,
                                      page=int_param(request, "page"))
    depth = {"hour": queue.queue_depth_history(request.user, "hour"),
             "day": queue.queue_depth_history(request.user, "day")}
    from dashboards.core.clusters import cluster_get_default
    from dashboards.launch.reservations import holders, rows_for
    cluster = cluster_get_default()
    reservations = rows_for(request.user, cluster)  # issue 17: advance reservations
    return render(request, "dashboards/queue.html", {"summary": summary, "depth": depth,
                                                     "reservations": reservations, "holders": holders(cluster),
                                                     "seat_resource": settings.TCO_SEAT_RESOURCE})


@login_required
def queue_json(request: HttpRequest) -> JsonResponse:
    return JsonResponse(queue.queue_summary(request.user, seat_resource=settings.TCO_SEAT_RESOURCE,
                                                page=int_param(request, "page")))
