"""Template tags for the ops pages: navigation by capability, the "campaign finished" notice, USD."""
from __future__ import annotations

from decimal import Decimal

from django import template
from django.urls import NoReverseMatch, reverse

from dashboards.launch.notices import notice_expires_in, notices_to_show
from dashboards.core.roles import request_can

register = template.Library()

_LINKS = (
    ("ops-launch", "Launch", "launch"),
    ("ops-urgent", "Urgent", "urgent"),
    ("ops-reservations", "Reservations", "launch"),
    ("ops-bills", "Bills", "bill"),
    ("ops-budgets", "Budgets", "bill"),
    ("ops-triage", "Triage", "triage"),
    ("ops-audit", "Audit", "audit"),
)


@register.inclusion_tag("dashboards/launch_nav.html", takes_context=True)
def ops_nav(context) -> dict:
    """Links to the pages the user may use (none until ``dashboards.web.urls_ops`` is included):
    ``{"links": [(url, label)]}``. The user's capabilities are read once per request
    (``roles.request_can``: one query, none when the view asked already)."""
    request = context.get("request")
    user = getattr(request, "user", None)
    links = []
    if user is not None and user.is_authenticated:
        for name, label, capability in _LINKS:
            try:
                url = reverse(name)
            except NoReverseMatch:
                continue
            if request_can(request, capability):
                links.append((url, label))
        if request_can(request, "launch"):  # an admin has every capability
            try:
                links.append((reverse("ops-agents"), "Agents"))
            except NoReverseMatch:
                pass
    return {"links": links}


@register.inclusion_tag("dashboards/launch_notices.html", takes_context=True)
def campaign_notices(context) -> dict:
    """One notice line naming the campaigns the user launched that finished lately (``notices_to_show``:
    each expires after a while, a few pages, or a visit to its campaign's page): ``{"notices": [(Campaign,
    url, seconds until it is too old to show)]}``. A page a live page reads again in the background
    (``X-TCO-Live-Read``, triage_live.js) shows nothing new, so it counts as no page shown."""
    request = context.get("request")
    user = getattr(request, "user", None)
    live_read = request is not None and request.headers.get("X-TCO-Live-Read") == "1"
    session = None if live_read else getattr(request, "session", None)
    notices = []
    for campaign in notices_to_show(user, session) if user is not None else []:
        notices.append((campaign, reverse("campaign", args=[campaign.pk]), notice_expires_in(campaign)))
    return {"notices": notices}


@register.filter
def usd(value) -> str:
    """Decimal USD for display: cents, or 4 decimals below a dollar; '' for None."""
    if value is None or value == "":
        return ""
    value = Decimal(value)
    places = Decimal("0.0001") if abs(value) < 1 and value != 0 else Decimal("0.01")
    return f"${value.quantize(places):,}"


@register.filter
def seconds(value) -> str:
    """Seconds as ``1 h 02 min 03 s`` (``''`` for None)."""
    if value is None:
        return ""
    total = int(round(float(value)))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min {secs:02d} s"
    if minutes:
        return f"{minutes} min {secs:02d} s"
    return f"{secs} s"


@register.filter
def pct(value) -> str:
    return "" if value is None else f"{float(value) * 100:.0f}%"


@register.filter
def get(mapping, key):
    return mapping.get(key) if mapping else None


@register.filter
def hours(seconds, unit: str = "") -> str:
    """Seconds of ``unit`` time (slot, seat) in the unit that reads: ``2.50 slot-h`` from an hour up,
    ``1,240 slot-s`` below (a demo's tasks take seconds; a part and its whole then mostly share the unit),
    ``0 slot-h`` for none; '' for None."""
    if seconds is None or seconds == "":
        return ""
    value = float(seconds)
    prefix = f"{unit}-" if unit else ""
    if value == 0:
        return f"0 {prefix}h"
    if abs(value) >= 3600:
        return f"{value / 3600:,.2f} {prefix}h"
    return f"{value:,.0f} {prefix}s" if abs(value) >= 1 else f"< 1 {prefix}s"
