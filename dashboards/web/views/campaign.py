"""The campaign page: live counts, stages and its task table (a campaign the user may not see is a 404).

Who may see the campaign is checked here; what the page shows comes from the campaign view's latest
snapshot (``live.snapshots.current``), the same for every user who may see it, or from the database
when the live store cannot answer.
"""
from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import render

from dashboards.core import scope
from dashboards.launch.forecast_record import forecast_outcome, outcome_view
from dashboards.launch.notices import notice_seen
from dashboards.live import campaign, snapshots
from dashboards.models import Campaign
from dashboards.web.views.common import int_param
from dashboards.web.views.queue import live_mark


@login_required
def campaign_page(request: HttpRequest, campaign_id: int) -> HttpResponse:
    try:
        row = scope.campaign_for(request.user, campaign_id)
    except Campaign.DoesNotExist:
        raise Http404("no such campaign") from None
    view = snapshots.campaign_view(campaign_id, page=int_param(request, "page"), state=request.GET.get("state"),
                                   sort=request.GET.get("sort"), direction=request.GET.get("dir"),
                                   q=request.GET.get("q"), host=request.GET.get("host"))
    live = snapshots.current(view)
    if live is not None:
        detail = live["data"]
    else:
        try:
            detail = campaign.campaign_detail(request.user, campaign_id, page=view.page, state=view.state,
                                              sort=view.sort, descending=view.descending, q=view.q, host=view.host)
        except Campaign.DoesNotExist:
            raise Http404("no such campaign") from None
    from dashboards.core.roles import user_can

    notice_seen(getattr(request, "session", None), row)
    # A snapshot an older producer built has no "outcome" (the card then waits for the next push): read it here.
    if "outcome" not in detail:
        detail["outcome"] = outcome_view(forecast_outcome(row))
    # The columns are the API's state keys (held reads "waiting" while the tasks wait for the predecessor).
    return render(request, "dashboards/campaign.html", {
        "detail": detail, "states": list(detail["states"]),
        "can_control": user_can(request.user, "control", row.team), "live_mark": live_mark(live)})
