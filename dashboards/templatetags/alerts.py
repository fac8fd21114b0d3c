"""``{% anomaly_notices %}``: the anomaly alerts of the user's teams (leads) or of all (admins), on every page."""
from __future__ import annotations

from django import template

from dashboards.alerts.delivery import alert_link
from dashboards.alerts.notices import alert_expires_in, alert_notices

register = template.Library()


@register.inclusion_tag("dashboards/anomaly_notices.html", takes_context=True)
def anomaly_notices(context) -> dict:
    """The latest alerts with their links and the seconds until each is too old to show:
    ``{"alerts": [(AnomalyAlert, url, expires_in)], "more": n}``."""
    request = context.get("request")
    user = getattr(request, "user", None)
    found = alert_notices(user) if user is not None else {"alerts": [], "more": 0}
    return {"alerts": [(a, alert_link(a, absolute=False), alert_expires_in(a)) for a in found["alerts"]],
            "more": found["more"]}
