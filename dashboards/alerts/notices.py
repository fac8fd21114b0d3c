"""The anomaly alerts a user is shown: their teams' where they lead, every team's for admins."""
from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Exists, OuterRef
from django.utils import timezone

from dashboards.core.roles import is_admin, teams_with
from dashboards.models import AnomalyAlert, Task

#: At most this many alerts are listed on a page (the count says how many more).
SHOWN = 5


def alert_expires_in(alert: AnomalyAlert, *, now: dt.datetime | None = None) -> float:
    """Seconds until ``alert`` is too old to be shown (``TCO_ALERT_NOTICE_HOURS`` after it; 0 when it is):
    a page that stays open drops it then (notices.js)."""
    now = now or timezone.now()
    return max(0.0, (alert.at + dt.timedelta(hours=settings.TCO_ALERT_NOTICE_HOURS) - now).total_seconds())


def _ongoing(state: str) -> Exists:
    """Whether the alert's campaign has a task in ``state`` now (an Exists over its active tasks)."""
    return Exists(Task.objects.filter(campaign=OuterRef("campaign"), active=True, state=state))


def alert_notices(user: AbstractBaseUser, *, now: dt.datetime | None = None) -> dict:
    """``{"alerts": [AnomalyAlert] (newest first, at most SHOWN), "more": n}``: the alerts of the
    last ``TCO_ALERT_NOTICE_HOURS`` of the teams where ``user`` is a lead (roles' ``bill``), or
    of every team for an admin; none for anyone else. A slow-tasks alert is shown while its campaign
    still has a task in that phase (pending, running)."""
    if not getattr(user, "is_authenticated", False) or settings.TCO_ALERT_NOTICE_HOURS <= 0:
        return {"alerts": [], "more": 0}
    now = now or timezone.now()
    alerts = AnomalyAlert.objects.filter(at__gte=now - dt.timedelta(hours=settings.TCO_ALERT_NOTICE_HOURS))
    # A "tasks pending (running) longer than usual" alert ends with its campaign's last pending (running) task:
    # it said "60 task(s) of demo (#1) running for up to 7 min" for a day after they had ended.
    alerts = (alerts.annotate(pending_now=_ongoing("pending"), running_now=_ongoing("running"))
              .exclude(kind="task_pending", pending_now=False).exclude(kind="task_running", running_now=False))
    if not is_admin(user):
        alerts = alerts.filter(team__in=teams_with(user, "bill"))
    alerts = alerts.select_related("team", "campaign").order_by("-at", "-id")
    shown = list(alerts[:SHOWN])
    total = alerts.count() if len(shown) == SHOWN else len(shown)
    return {"alerts": shown, "more": total - len(shown)}
