"""Pages: thin; every read goes through a scoped selector (a page the user may not see is a 404)."""
from __future__ import annotations

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods

from . import accounts, selectors, spool_files
from .models import ApiToken, Campaign, Task


def _int_param(request: HttpRequest, name: str, default: int = 1) -> int:
    try:
        return max(1, int(request.GET.get(name, default)))
    except ValueError:
        return default


@login_required
def queue_page(request: HttpRequest) -> HttpResponse:
    summary = selectors.queue_summary(request.user, seat_resource=settings.TCO_SEAT_RESOURCE,
                                      page=_int_param(request, "page"))
    depth = {"hour": selectors.queue_depth_history(request.user, "hour"),
             "day": selectors.queue_depth_history(request.user, "day")}
    from .clusters import cluster_get_default
    from .reservations import rows_for
    reservations = rows_for(request.user, cluster_get_default())  # issue 17: advance reservations
    return render(request, "dashboards/queue.html", {"summary": summary, "depth": depth,
                                                     "reservations": reservations})


@login_required
def queue_json(request: HttpRequest) -> JsonResponse:
    return JsonResponse(selectors.queue_summary(request.user, seat_resource=settings.TCO_SEAT_RESOURCE,
                                                page=_int_param(request, "page")))


@login_required
def campaign_page(request: HttpRequest, campaign_id: int) -> HttpResponse:
    state = request.GET.get("state") or None
    if state not in (None, *selectors.LIFECYCLE_STATES, "waiting"):
        state = None
    try:
        choice = selectors.task_table_choice(request.GET.get("sort"), request.GET.get("dir"), request.GET.get("q"))
        detail = selectors.campaign_detail(request.user, campaign_id, page=_int_param(request, "page"), state=state,
                                           host=selectors.host_filter(request.GET.get("host")), **choice)
    except Campaign.DoesNotExist:
        raise Http404("no such campaign") from None
    from .roles import user_can

    team = Campaign.objects.select_related("team").get(pk=detail["campaign"]["id"]).team
    # The columns are the API's state keys (held reads "waiting" while the tasks wait for the predecessor).
    return render(request, "dashboards/campaign.html", {"detail": detail, "states": list(detail["states"]),
                                                        "can_control": user_can(request.user, "control", team)})


@login_required
def task_page(request: HttpRequest, task_id: int) -> HttpResponse:
    try:
        detail = selectors.task_detail(request.user, task_id)
    except Task.DoesNotExist:
        raise Http404("no such task") from None
    return render(request, "dashboards/agent.html", {"detail": detail})


@login_required
def task_logs(request: HttpRequest, task_id: int) -> JsonResponse:
    """The live tail of a task's stdout and stderr (JSON, ``selectors.task_logs``), polled by the agent page."""
    try:
        return JsonResponse(selectors.task_logs(request.user, task_id))
    except Task.DoesNotExist:
        raise Http404("no such task") from None


@login_required
def task_output(request: HttpRequest, task_id: int, name: str) -> HttpResponse:
    """One file of the agent's work directory, as text (the last ``TCO_LOG_VIEW_CAP`` bytes)."""
    try:
        found = spool_files.task_output_file(selectors.task_for(request.user, task_id), name)
    except Task.DoesNotExist:
        raise Http404("no such task") from None
    if found["error"]:
        raise Http404(found["error"])
    response = HttpResponse(found["text"], content_type="text/plain; charset=utf-8")
    if found["truncated"]:
        response["X-TCO-Truncated"] = f"last {len(found['text'].encode())} of {found['size']} bytes"
    return response


@login_required
@require_http_methods(["GET", "POST"])
def token_page(request: HttpRequest) -> HttpResponse:
    """The user's API token: shown once, in the answer to the POST that made it; POST ``action=rotate|revoke``.

    The new key is rendered straight into that answer (never kept in the
    session, which the database stores in the clear).
    """
    new_key = None
    if request.method == "POST":
        if request.POST.get("action") == "revoke":
            accounts.api_token_revoke(user=request.user)
            return redirect("token")
        new_key = accounts.api_token_rotate(user=request.user).key
    token = ApiToken.objects.filter(user=request.user).first()
    response = render(request, "dashboards/token.html", {"token": token, "new_key": new_key})
    response["Cache-Control"] = "no-store"
    return response


def healthz(request: HttpRequest) -> HttpResponse:
    return HttpResponse("ok", content_type="text/plain")
