"""``{% health_notices %}``: the banner of dashboards/health.py on every page (scheduler, Redis, execds)."""
from __future__ import annotations

from django import template
from django.urls import NoReverseMatch, reverse

from dashboards.core import health

register = template.Library()


@register.inclusion_tag("dashboards/health_notices.html", takes_context=True)
def health_notices(context) -> dict:
    """The scheduler outages, whether live updates are paused, and (admins) hosts whose execd is silent."""
    request = context.get("request")
    found = health.notices(getattr(request, "user", None))
    try:
        found["triage_url"] = reverse("ops-triage")
    except NoReverseMatch:
        found["triage_url"] = ""
    return found
