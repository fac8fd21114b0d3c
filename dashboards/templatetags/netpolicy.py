"""``{% network_policy_card campaign %}``: the network policy in force for a campaign (version, when
and by whom it changed) and, for users who may change it on the control page, the form (issue 17)."""
from __future__ import annotations

from django import template
from django.urls import NoReverseMatch, reverse

from dashboards.models import Campaign
from dashboards.control.netpolicy import CHANGEABLE, NARROWABLE, may_change, network_policy_in_force

register = template.Library()


@register.inclusion_tag("dashboards/netpolicy_card.html", takes_context=True)
def network_policy_card(context, campaign: Campaign | dict | int, form: bool = False) -> dict:
    """The card's context. ``campaign``: a Campaign, or the pages' ``{"id": ...}`` mapping or an id
    (looked up; the page has already checked the user may see it); ``form``: show the change form
    to a user who may change it."""
    if not isinstance(campaign, Campaign):
        pk = campaign.get("id") if isinstance(campaign, dict) else campaign
        campaign = Campaign.objects.select_related("team").filter(pk=pk).first()
    if campaign is None:
        return {"campaign": None}
    request = context.get("request")
    user = getattr(request, "user", None)
    try:
        action = reverse("ops-campaign-network-policy", args=[campaign.pk])
    except NoReverseMatch:  # the ops pages are not included
        action = ""
    can_change = bool(form and action and user is not None and campaign.status in CHANGEABLE + NARROWABLE
                      and may_change(user, campaign))
    return {"campaign": campaign, "in_force": network_policy_in_force(campaign), "can_change": can_change,
            "narrow_only": campaign.status in NARROWABLE, "action": action, "csrf_token": context.get("csrf_token")}
