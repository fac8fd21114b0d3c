"""Pages: thin; every read goes through a scoped selector."""
from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from . import selectors
from .models import Campaign


@login_required
def queue_page(request: HttpRequest) -> HttpResponse:
    summary = selectors.queue_summary(request.user, seat_resource=settings.TCO_SEAT_RESOURCE)
    return render(request, "dashboards/queue.html", {"summary": summary})


@login_required
def queue_json(request: HttpRequest) -> JsonResponse:
    return JsonResponse(selectors.queue_summary(request.user, seat_resource=settings.TCO_SEAT_RESOURCE))


@login_required
def campaign_page(request: HttpRequest, campaign_id: int) -> HttpResponse:
    try:
        page = int(request.GET.get("page", "1"))
    except ValueError:
        page = 1
    try:
        detail = selectors.campaign_detail(request.user, campaign_id, page=page)
    except Campaign.DoesNotExist:
        raise Http404("no such campaign") from None
    return render(request, "dashboards/campaign.html", detail)


def healthz(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok", content_type="text/plain")
