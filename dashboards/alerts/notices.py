"""The anomaly alerts a user is shown: their teams' where they lead, every team's for admins."""
from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from dashboards.core.roles import is_admin, teams_with
from dashboards.models import AnomalyAlert

#: At most this many alerts are listed on a page (the count says how many more).
SHOWN = 5


def alert_expires_in(alert: AnomalyAlert, *, now: dt.datetime | None = None) -> float:
    """Seconds until ``alert`` is too old to be shown (``TCO_ALERT_NOTICE_HOURS`` after it; 0 when it is):
    a page that stays open drops it then (notices.js)."""
    now = now or timezone.now()
    return max(0.0, (alert.at + dt.timedelta(hours=settings.TCO_ALERT_NOTICE_HOURS) - now).total_seconds())


def alert_notices(user: AbstractBaseUser, *, now: dt.datetime | None = None) -> dict:
    """``{"alerts": [AnomalyAlert] (newest first, at most SHOWN), "more": n}``: the alerts of the
    last ``TCO_ALERT_NOTICE_HOURS`` of the teams where ``user`` is a lead (roles' ``bill``), or
    of every team for an admin; none for anyone else."""
    if not getattr(user, "is_authenticated", False) or settings.TCO_ALERT_NOTICE_HOURS <= 0:
        return {"alerts": [], "more": 0}
    now = now or timezone.now()
    alerts = AnomalyAlert.objects.filter(at__gte=now - dt.timedelta(hours=settings.TCO_ALERT_NOTICE_HOURS))
    if not is_admin(user):
        alerts = alerts.filter(team__in=teams_with(user, "bill"))
    alerts = alerts.select_related("team", "campaign").order_by("-at", "-id")
    shown = list(alerts[:SHOWN])
    total = alerts.count() if len(shown) == SHOWN else len(shown)
    return {"alerts": shown, "more": total - len(shown)}
