"""A campaign's control page: cancel, pause, resume, after a confirmation."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_POST

from dashboards.control import actions
from dashboards.core import holds
from dashboards.core.errors import ActionRefused, LaunchError
from dashboards.core.roles import teams_with, user_can
from dashboards.launch import notices, service
from dashboards.models import Campaign
from dashboards.web.forms import CampaignControlForm
from dashboards.web.views.common import refused

# --------------------------------------------------------------------------- campaign control

def _visible_campaign(request: HttpRequest, campaign_id: int) -> Campaign:
    campaign = (Campaign.objects.filter(pk=campaign_id, team__in=teams_with(request.user, "view"))
                .select_related("team", "agent_definition", "launched_by", "retry_of").first())
    if campaign is None:
        raise Http404("no such campaign")
    return campaign


@login_required
def campaign_ops_page(request: HttpRequest, campaign_id: int) -> HttpResponse:
    campaign = _visible_campaign(request, campaign_id)
    history = []
    can_control = user_can(request.user, "control", campaign.team)
    if can_control:  # the campaign's launches and control actions, an admin's on its job included
        history = actions.campaign_actions(campaign)
    summary = notices.campaign_summary(campaign)
    summary["states"] = holds.campaign_states(campaign, summary["states"])
    ended = sum(n for s, n in summary["states"].items() if s in ("done", "failed", "deleted", "lost"))
    return render(request, "dashboards/launch_campaign.html", {
        "campaign": campaign, "summary": summary, "priority": holds.campaign_priority(campaign),
        "controls": actions.campaign_controls(campaign, summary["states"]), "ended": ended,
        "predecessor": holds.predecessor_campaign(campaign),
        "progress_pct": round(100.0 * ended / campaign.task_count, 1) if campaign.task_count else 0.0,
        "can_control": can_control, "history": history,
        "retries": list(campaign.retries.order_by("launched_at")), "now": timezone.now()})


@login_required
def campaign_controls_fragment(request: HttpRequest, campaign_id: int) -> HttpResponse:
    """The control page's buttons alone (``campaign_controls.html``), as the campaign is now: the
    page's script fetches it when the live status or task counts change, so Pause, Resume, Cancel
    and Retry follow the campaign without a reload. 403 for users who may not control it."""
    campaign = _visible_campaign(request, campaign_id)
    if not user_can(request.user, "control", campaign.team):
        return HttpResponse("You may not control this campaign.", status=403, content_type="text/plain")
    states = notices.campaign_summary(campaign)["states"]
    response = render(request, "dashboards/campaign_controls.html", {
        "campaign": campaign, "controls": actions.campaign_controls(campaign, states)})
    response["Cache-Control"] = "no-store"
    return response


@login_required
@require_POST
def campaign_control_view(request: HttpRequest, campaign_id: int) -> HttpResponse:
    campaign = _visible_campaign(request, campaign_id)
    form = CampaignControlForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Unknown action.")
        return redirect("ops-campaign", campaign_id=campaign.pk)
    action = form.cleaned_data["action"]
    if not form.cleaned_data["confirm"]:
        if not user_can(request.user, "control", campaign.team):
            return refused(request, f"You may not control campaigns of team {campaign.team.name}.",
                           action=f"campaign_{action}")
        return render(request, "dashboards/launch_confirm.html", {"campaign": campaign, "action": action,
                                                                  "summary": notices.campaign_summary(campaign)})
    try:
        if action == "retry":
            outcome = service.campaign_retry(user=request.user, campaign=campaign)
            messages.success(request, f"Retry campaign {outcome.campaign.name} (#{outcome.campaign.pk}) launched "
                                      f"with the {outcome.campaign.task_count} failed tasks.")
            return redirect("ops-campaign", campaign_id=outcome.campaign.pk)
        actions.campaign_control(user=request.user, campaign=campaign, action=action)
    except ActionRefused as exc:
        return refused(request, str(exc))
    except LaunchError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"{action.capitalize()} requested; the result appears below in a moment.")
    return redirect("ops-campaign", campaign_id=campaign.pk)
