"""What a launcher is told when a campaign finishes: the e-mail and the page notice."""
from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Count
from django.utils import timezone

from dashboards.billing import budgets
from dashboards.core import encoding
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


def finished_notices(user: AbstractBaseUser, *, hours: float = 6.0) -> list[Campaign]:
    """Campaigns ``user`` launched that finished in the last ``hours`` (for the page notice)."""
    if not getattr(user, "is_authenticated", False):
        return []
    since = timezone.now() - dt.timedelta(hours=hours)
    return list(Campaign.objects.filter(launched_by=user, status=CampaignStatus.FINISHED, finished_at__gte=since)
                .order_by("-finished_at")[:5])
