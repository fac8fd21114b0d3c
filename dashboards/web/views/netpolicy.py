"""The campaign control page's network policy form (issue 17, item 4): change a running campaign's
``network_policies``, after a confirmation page. Thin: ``dashboards.control.netpolicy`` checks and audits."""
from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from dashboards.control import netpolicy
from dashboards.core.errors import ActionRefused, LaunchError
from dashboards.core.roles import teams_with
from dashboards.models import Campaign


@login_required
@require_POST
def campaign_network_policy_view(request: HttpRequest, campaign_id: int) -> HttpResponse:
    """POST ``network_policy`` (YAML, ``network_policies: {...}``): without ``confirm`` the
    confirmation page (the policy in force and the one asked for), with it the change. A user
    who cannot see the campaign gets 404; one who may not change it 403 (audited)."""
    campaign = (Campaign.objects.filter(pk=campaign_id, team__in=teams_with(request.user, "view"))
                .select_related("team", "agent_definition").first())
    if campaign is None:
        raise Http404("no such campaign")
    text = request.POST.get("network_policy", "")
    try:
        if request.POST.get("confirm") != "on":
            if not netpolicy.may_change(request.user, campaign):
                raise netpolicy.refuse_change(request.user, campaign, text)
            return render(request, "dashboards/netpolicy_confirm.html", {
                "campaign": campaign, "in_force": netpolicy.network_policy_in_force(campaign), "text": text})
        written = netpolicy.network_policy_change(user=request.user, campaign=campaign, text=text)
    except ActionRefused as exc:
        return render(request, "dashboards/launch_refused.html", {"message": str(exc)}, status=403)
    except LaunchError as exc:
        messages.error(request, f"Network policy not changed: {exc}")
    except OSError as exc:
        messages.error(request, f"Network policy not changed: the spool could not be written ({exc.strerror or exc}).")
    else:
        messages.success(request, f"Network policy version {written.policy_version} written; the campaign's "
                                  "runners apply it to new requests within a second.")
    return redirect("ops-campaign", campaign_id=campaign.pk)
