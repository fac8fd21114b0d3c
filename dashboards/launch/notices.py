"""What is told when a campaign finishes: the e-mail to its launcher and the page notice to those who may see it."""
from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Count
from django.utils import timezone

from dashboards.billing import budgets
from dashboards.core import encoding
from dashboards.core.scope import campaigns_visible_to
from dashboards.models import Campaign, CampaignStatus, Task


def campaign_finished_notify(*, campaign_id: int) -> bool:
    """E-mail the launcher that a campaign finished (counts, wall clock, cost) and check budgets.

    Called once per campaign, after the conditional update that marks it
    finished commits. Returns whether a mail was sent.
    """
    campaign = Campaign.objects.select_related("team", "launched_by").filter(pk=campaign_id).first()
    if campaign is None:
        return False
    budgets.budget_check_alerts(teams=[campaign.team])
    summary = campaign_summary(campaign)
    email = campaign.launched_by.email
    if not email:
        return False
    states = ", ".join(f"{n} {s}" for s, n in summary["states"].items() if n)
    body = (f"Campaign {campaign.name} (#{campaign.pk}, job {campaign.job_number}) of team {campaign.team.name} "
            f"finished at {campaign.finished_at:%Y-%m-%d %H:%M:%S} UTC.\n\nTasks: {states}.\n"
            f"Wall clock: {summary['wallclock_s']:.0f} s. Cost: {encoding.usd_text(summary['cost_usd'])}"
            f"{' (some tasks unpriced)' if summary['unpriced'] else ''}.\n")
    return budgets.mail_safely(f"[tco] campaign {campaign.name} finished: {states}", body, [email])


def campaign_summary(campaign: Campaign) -> dict[str, Any]:
    """``{"states": {state: n}, "wallclock_s", "cost_usd" (Decimal), "unpriced": n, "failed": n}``."""
    states = dict(Task.objects.filter(campaign=campaign).values_list("state").annotate(n=Count("id")).order_by())
    cost = Decimal(0)
    unpriced = 0
    wall = 0.0
    for c, w, out in Task.objects.filter(campaign=campaign).values_list("cost_usd", "wallclock_s", "output_tokens"):
        if c is not None:
            cost += c
        elif out:
            unpriced += 1
        wall += w or 0.0
    return {"states": states, "wallclock_s": wall, "cost_usd": cost, "unpriced": unpriced,
            "failed": states.get("failed", 0) + states.get("lost", 0)}


#: The session key counting the pages each "campaign finished" notice was shown on.
SHOWN_KEY = "tco_notices_shown"


def finished_notices(user: AbstractBaseUser, *, minutes: float | None = None) -> list[Campaign]:
    """Campaigns that finished in the last ``minutes`` (``TCO_NOTICE_MINUTES``) and that ``user`` may
    see (``core.scope.campaigns_visible_to``: its launcher while on its team, the team's members,
    admins), newest first, at most 5. Another team's campaign is never named to ``user``, nor one of
    a team its launcher has since left."""
    if not getattr(user, "is_authenticated", False):
        return []
    minutes = settings.TCO_NOTICE_MINUTES if minutes is None else minutes
    since = timezone.now() - dt.timedelta(minutes=minutes)
    return list(campaigns_visible_to(user).filter(status=CampaignStatus.FINISHED, finished_at__gte=since)
                .order_by("-finished_at", "-pk")[:5])


def notice_expires_in(campaign: Campaign, *, now: dt.datetime | None = None) -> float:
    """Seconds until ``campaign``'s "finished" notice is too old to show (``TCO_NOTICE_MINUTES`` after its
    finish; 0 when it is): a page that stays open (the live pages are never reloaded) drops it then."""
    if campaign.finished_at is None:
        return 0.0
    now = now or timezone.now()
    due = campaign.finished_at + dt.timedelta(minutes=settings.TCO_NOTICE_MINUTES)
    return max(0.0, (due - now).total_seconds())


def _notice_key(campaign: Campaign) -> str:
    return f"{campaign.pk}:{int(campaign.finished_at.timestamp())}" if campaign.finished_at else str(campaign.pk)


def notices_to_show(user: AbstractBaseUser, session) -> list[Campaign]:
    """The "campaign finished" notices for this page, counted as shown.

    A notice expires: ``TCO_NOTICE_MINUTES`` after the finish (:func:`notice_expires_in`; a page left
    open drops it then too, notices.js), after ``TCO_NOTICE_PAGES`` pages, or once the user opened the
    campaign's page (:func:`notice_seen`); a dismissed one stays hidden in that browser (notices.js).
    ``session``: the request's (None counts nothing: a live page reading itself again, triage_live.js).
    """
    campaigns = finished_notices(user)
    if session is None:
        return campaigns
    shown = dict(session.get(SHOWN_KEY) or {})
    out = []
    for campaign in campaigns:
        key = _notice_key(campaign)
        if shown.get(key, 0) >= settings.TCO_NOTICE_PAGES:
            continue
        shown[key] = shown.get(key, 0) + 1
        out.append(campaign)
    current = {_notice_key(c) for c in campaigns}
    session[SHOWN_KEY] = {k: v for k, v in shown.items() if k in current}  # the expired ones are forgotten
    return out


def notice_seen(session, campaign: Campaign) -> None:
    """The user opened ``campaign``'s page: its "finished" notice has done its work."""
    if session is not None and campaign.status == CampaignStatus.FINISHED:
        shown = dict(session.get(SHOWN_KEY) or {})
        shown[_notice_key(campaign)] = settings.TCO_NOTICE_PAGES
        session[SHOWN_KEY] = shown
