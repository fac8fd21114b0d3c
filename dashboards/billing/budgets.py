"""Team budgets: spend against a budget, the verdict at launch, alerts at thresholds (e-mail, audited).

Money is USD as ``Decimal``; a budget's period is a billing period
(``billing.periods``).
"""
from __future__ import annotations

import datetime as dt
import logging
from decimal import Decimal
from typing import Any, Iterable, Sequence

from django.contrib.auth.models import AbstractBaseUser
from django.core.mail import send_mail
from django.db import IntegrityError, transaction
from django.utils import timezone

from dashboards.billing.bills import ZERO, team_spend_between, teams_spend_between
from dashboards.billing.periods import (
    PERIOD_ADJECTIVES,
    PERIODS,
    cluster_zone,
    current_period,
    default_cluster,
    next_period_start,
)
from dashboards.core.audit import audit
from dashboards.core.encoding import usd_places, usd_text
from dashboards.core.errors import BillError
from dashboards.models import Budget, BudgetAlert, Membership, Team
from dashboards.team_models import Role

log = logging.getLogger(__name__)


def budget_burndown(budget: Budget, *, now: dt.datetime | None = None) -> dict[str, Any]:
    """The budget's current period day by day: ``{"budget", "first", "end_day" (last day), "days":
    [ISO date up to today], "cumulative_usd": [float], "amount_usd": float, "spent_usd": Decimal,
    "projected_usd": Decimal (spend so far / elapsed days x days in the period: the average daily
    rate carried to the period's end), "unpriced_tasks": int, "over": bool (projected > amount)}``."""
    return budget_burndowns([budget], now=now)[0]


def budget_burndowns(budgets: Sequence[Budget], *, now: dt.datetime | None = None) -> list[dict[str, Any]]:
    """:func:`budget_burndown` of each of ``budgets``, in their order, summed once for all the teams
    whose budgets share a period (the bill page shows every budget a lead or admin may see)."""
    tz = cluster_zone(default_cluster())
    now = now or timezone.now()
    today = now.astimezone(tz).date()
    out: dict[int, dict[str, Any]] = {}
    for period in sorted({b.period for b in budgets}):
        of_period = [b for b in budgets if b.period == period]
        first, begin, end = current_period(period, now=now, tz=tz)
        end_day = next_period_start(first, period) - dt.timedelta(days=1)
        spends = teams_spend_between([b.team for b in of_period], begin, end, days_tz=tz)
        elapsed = max((now - begin).total_seconds(), 1.0)
        for budget in of_period:
            sums = spends[budget.team.project]
            days, cumulative, running = [], [], ZERO
            cursor = first
            while cursor <= today:
                running += sums["daily"].get(cursor, ZERO)
                days.append(cursor.isoformat())
                cumulative.append(float(running))
                cursor += dt.timedelta(days=1)
            projected = (sums["spent_usd"] * Decimal(str((end - begin).total_seconds() / elapsed))).quantize(
                Decimal("0.000001"))
            out[id(budget)] = {"budget": budget, "first": first, "end_day": end_day, "days": days,
                               "cumulative_usd": cumulative, "amount_usd": float(budget.amount_usd),
                               "spent_usd": sums["spent_usd"], "projected_usd": projected,
                               "unpriced_tasks": sums["unpriced_tasks"], "over": projected > budget.amount_usd}
    return [out[id(b)] for b in budgets]


# --------------------------------------------------------------------------- budgets

def team_spend(team: Team, period: str, *, now: dt.datetime | None = None) -> dict[str, Any]:
    """What ``team`` spent in the current ``period``: ``{"first": date, "begin", "end" (UTC),
    "spent_usd": Decimal, "unpriced_tasks": int}`` (tasks started in the period, cluster time zone)."""
    first, begin, end = current_period(period, now=now)
    # The team's usage as bills count it: the tasks of its campaigns (not another account's qsub -P).
    sums = team_spend_between(team, begin, end)
    return {"first": first, "begin": begin, "end": end,
            "spent_usd": sums["spent_usd"], "unpriced_tasks": sums["unpriced_tasks"]}


def budget_status(team: Team, *, now: dt.datetime | None = None) -> list[dict[str, Any]]:
    """Each budget of ``team`` with its current period: ``{"budget", "first", "spent_usd",
    "fraction" (float, spent / amount), "crossed": [thresholds], "alerts": [BudgetAlert], "deliveries":
    [(BudgetAlert, {"sent": bool | None, "detail": str})]}`` (``alert_deliveries``)."""
    out = []
    for budget in team.budgets.order_by("period"):
        spend = team_spend(team, budget.period, now=now)
        fraction = float(spend["spent_usd"] / budget.amount_usd) if budget.amount_usd > 0 else 0.0
        crossed = [t for t in budget.thresholds if fraction >= float(t)]
        alerts = list(budget.alerts.filter(period_start=spend["first"]).order_by("threshold"))
        delivery = alert_deliveries(alerts)
        out.append({"budget": budget, **spend, "fraction": fraction, "crossed": crossed, "alerts": alerts,
                    "deliveries": [(a, delivery[a.pk]) for a in alerts]})
    return out


def budget_verdict(team: Team, additional_usd: Decimal | None, *, now: dt.datetime | None = None) -> dict[str, Any]:
    """Whether a launch costing about ``additional_usd`` (None: unknown) may go ahead.

    A launch "crosses" a budget when the period's spend plus ``additional_usd``
    exceeds its amount, or the spend already reached it. An unknown cost is
    never taken as $0: a launch whose forecast is unknown, or a period whose
    spend includes tasks without a price (``unpriced_tasks``), cannot be shown
    to fit, and is treated as crossing every budget of the team (the message
    says the cost is unknown). Returns ``{"action": "submit" | "hold" |
    "refuse", "message": str, "budgets": [...]}``; refuse wins over hold when
    several budgets are crossed.
    """
    action, messages = "submit", []
    statuses = budget_status(team, now=now)
    for status in statuses:
        budget = status["budget"]
        unknown = additional_usd is None or status["unpriced_tasks"] > 0
        projected = status["spent_usd"] + (additional_usd or ZERO)
        if status["spent_usd"] >= budget.amount_usd or projected > budget.amount_usd or unknown:
            # One precision for every amount of the message, enough that each is within 1 % and
            # that "spent + forecast" visibly exceeds the budget when it does (issue 16, bug 7).
            shown = [budget.amount_usd, status["spent_usd"], projected]
            if additional_usd is not None:
                shown.append(additional_usd)
            places = usd_places(shown, over=(projected, budget.amount_usd))
            forecast_text = usd_text(additional_usd, places) if additional_usd is not None else "an unknown cost"
            spent_text = usd_text(status["spent_usd"], places)
            if status["unpriced_tasks"]:
                spent_text += f" plus {status['unpriced_tasks']} task(s) of unknown cost"
            total = (f" (together {usd_text(projected, places)})"
                     if additional_usd is not None and not status["unpriced_tasks"] else "")
            messages.append(f"the {PERIOD_ADJECTIVES[budget.period]} budget of {team.name} is "
                            f"{usd_text(budget.amount_usd, places)}; spent {spent_text} since "
                            f"{status['first'].isoformat()}, this launch is forecast at {forecast_text}{total}"
                            + ("; an unknown cost cannot be checked against the budget" if unknown else ""))
            if budget.on_exceed == "refuse":
                action = "refuse"
            elif action != "refuse":
                action = "hold"
    return {"action": action, "message": "; ".join(messages), "budgets": statuses}


def headroom_text(left: Decimal | None, places: int | None = None) -> str:
    """What is left of a budget, said plainly: ``$0.0046``, ``no headroom`` (exactly nothing left) or
    ``over budget by $0.0046`` (never ``$-0.0046``). ``"?"`` for None; ``places`` as in :func:`usd_text`."""
    if left is None:
        return "?"
    left = Decimal(left)
    if left < 0:
        return f"over budget by {usd_text(-left, places)}"
    if left == 0:
        return "no headroom"
    return usd_text(left, places)


def parse_thresholds(text: str) -> list[float]:
    """``"50, 80, 100"`` (percent) -> ``[0.5, 0.8, 1.0]``; raises BillError with the bad part."""
    values: list[float] = []
    for part in text.replace(";", ",").split(","):
        part = part.strip().rstrip("%").strip()
        if not part:
            continue
        try:
            pct = Decimal(part)
        except ArithmeticError:
            raise BillError(f"threshold {part!r} is not a number (write percentages like 50, 80, 100)") from None
        if not pct.is_finite() or not 1 <= pct <= 1000:
            raise BillError(f"threshold {part}%: use 1 to 1000 percent")
        values.append(float(pct / 100))
    if len(values) > 10:
        raise BillError("at most 10 thresholds")
    return sorted(set(values))


def budget_set(*, user: AbstractBaseUser, team: Team, period: str, amount_usd: Decimal, thresholds: list[float],
               on_exceed: str, alert_emails: list[str]) -> Budget:
    """Create or replace ``team``'s budget for ``period`` (audited). Raises PermissionError, BillError."""
    from dashboards.core.roles import user_can

    if not user_can(user, "bill", team):
        audit(user=user, action="budget_set", target=f"team:{team.project}", params={"period": period}, ok=False,
              result="refused: no bill role")
        raise PermissionError(f"you may not set budgets for {team.name}")
    if period not in PERIODS:
        raise BillError(f"period must be one of {', '.join(PERIODS)}")
    if on_exceed not in dict(Budget.ON_EXCEED):
        raise BillError("on exceed: refuse or hold")
    if not isinstance(amount_usd, Decimal) or not amount_usd.is_finite() or amount_usd <= 0:
        raise BillError("amount: a positive number of USD")
    budget, _ = Budget.objects.update_or_create(
        team=team, period=period,
        defaults={"amount_usd": amount_usd, "thresholds": thresholds, "on_exceed": on_exceed,
                  "alert_emails": "\n".join(alert_emails)})
    audit(user=user, action="budget_set", target=f"team:{team.project}",
          params={"period": period, "amount_usd": str(amount_usd), "thresholds": thresholds, "on_exceed": on_exceed},
          ok=True, result="saved")
    return budget


def budget_delete(*, user: AbstractBaseUser, budget: Budget) -> None:
    from dashboards.core.roles import user_can

    if not user_can(user, "bill", budget.team):
        raise PermissionError(f"you may not change budgets for {budget.team.name}")
    audit(user=user, action="budget_delete", target=f"team:{budget.team.project}", params={"period": budget.period},
          ok=True, result="deleted")
    budget.delete()


def _alert_recipients(budget: Budget) -> list[str]:
    addresses = [line.strip() for line in budget.alert_emails.splitlines() if line.strip()]
    leads = Membership.objects.filter(team=budget.team, role=Role.LEAD).exclude(user__email="")
    addresses += list(leads.values_list("user__email", flat=True))
    return sorted(set(addresses))


def budget_check_alerts(*, teams: Iterable[Team] | None = None, now: dt.datetime | None = None) -> list[BudgetAlert]:
    """Record (once per budget, period and threshold) every threshold crossed, and e-mail it.

    Idempotent: the ``alert_once`` constraint decides who sends; a second
    run, or a concurrent one, sends nothing more. Mail goes through Django's
    mail settings after the alert commits; a failure to send is logged.
    Returns the alerts created by this call.
    """
    created: list[BudgetAlert] = []
    budgets = Budget.objects.select_related("team")
    if teams is not None:
        budgets = budgets.filter(team__in=list(teams))
    for budget in budgets:
        spend = team_spend(budget.team, budget.period, now=now)
        if budget.amount_usd <= 0:
            continue
        fraction = spend["spent_usd"] / budget.amount_usd
        for threshold in sorted(budget.thresholds):
            value = Decimal(str(threshold)).quantize(Decimal("0.001"))
            if fraction < value:
                continue
            try:
                with transaction.atomic():
                    alert, made = BudgetAlert.objects.get_or_create(
                        budget=budget, period_start=spend["first"], threshold=value,
                        defaults={"spent_usd": spend["spent_usd"]})
            except IntegrityError:
                continue  # a concurrent check created it first
            if not made:
                continue
            created.append(alert)
            kind, spent, amount = PERIOD_ADJECTIVES[budget.period], usd_text(spend["spent_usd"]), usd_text(budget.amount_usd)
            subject = f"[tco] {budget.team.name}: {int(value * 100)}% of the {kind} budget ({spent} of {amount})"
            body = (f"Team {budget.team.name} (project {budget.team.project}) has spent {spent} of its {kind} "
                    f"budget of {amount} since {spend['first'].isoformat()}. Launches that would cross it are "
                    f"{'refused' if budget.on_exceed == 'refuse' else 'submitted on hold'}.\n")
            recipients = _alert_recipients(budget)
            if recipients:
                transaction.on_commit(lambda a=alert, s=subject, b=body, r=recipients: _alert_mail(a, s, b, r))
            else:
                _alert_delivery_record(alert, [], "not sent: no recipients (the budget lists no alert e-mails and "
                                                  "no lead of the team has an e-mail address)")
    return created


#: The audit action that records each budget alert's e-mail, sent or not (issue 16, bug 8).
ALERT_MAIL_ACTION = "budget_alert_mail"


def _alert_target(alert: BudgetAlert) -> str:
    return f"budget_alert:{alert.pk}"


def _alert_delivery_record(alert: BudgetAlert, recipients: list[str], failure: str) -> None:
    """Record how ``alert``'s e-mail went: sent to ``recipients`` (``failure`` "") or not (why)."""
    audit(user=None, action=ALERT_MAIL_ACTION, target=_alert_target(alert),
          params={"budget": alert.budget_id, "threshold": str(alert.threshold), "recipients": len(recipients)},
          ok=not failure, result=failure or f"sent to {len(recipients)} address(es)")


def _alert_mail(alert: BudgetAlert, subject: str, body: str, recipients: list[str]) -> None:
    error = mail_error(subject, body, recipients)
    _alert_delivery_record(alert, recipients, f"not sent: {error}" if error else "")


def alert_deliveries(alerts: Sequence[BudgetAlert]) -> dict[int, dict[str, Any]]:
    """alert id -> ``{"sent": bool | None (not yet tried), "detail": str}`` from the audit log."""
    from dashboards.models import AuditEntry

    out: dict[int, dict[str, Any]] = {a.pk: {"sent": None, "detail": "e-mail not tried yet"} for a in alerts}
    by_target = {_alert_target(a): a.pk for a in alerts}
    for target, ok, result in (AuditEntry.objects.filter(action=ALERT_MAIL_ACTION, target__in=list(by_target))
                               .order_by("at", "id").values_list("target", "ok", "result")):
        out[by_target[target]] = {"sent": ok, "detail": result}
    return out


def mail_error(subject: str, body: str, recipients: list[str]) -> str:
    """Send one e-mail through Django's mail settings: "" when sent, else why not (a failure is
    logged, never raised)."""
    if not recipients:
        return "no recipients"
    try:
        sent = send_mail(subject, body, None, recipients, fail_silently=False)
    except Exception as exc:  # noqa: BLE001 - mail is a notice; the page shows the same facts
        log.warning("could not send %r to %s", subject, recipients, exc_info=True)
        return f"{type(exc).__name__}: {exc}"[:300] or type(exc).__name__
    return "" if sent else "the mail backend sent nothing"


def mail_safely(subject: str, body: str, recipients: list[str]) -> bool:
    """Send one e-mail through Django's mail settings; True when sent (a failure is logged)."""
    return not mail_error(subject, body, recipients)


def budget_burn_rates(*, now: dt.datetime | None = None) -> list[dict[str, Any]]:
    """Every budget's current period and how fast it is spent, for /metrics and the anomaly alerts.

    ``[{"budget": Budget, "team": Team, "project", "period", "amount_usd": Decimal, "spent_usd":
    Decimal, "unpriced_tasks": n, "begin", "end" (UTC), "elapsed_ratio": float (0..1, the part of
    the period gone), "rate_usd_per_s": Decimal (spend so far / seconds elapsed), "exhausted_at":
    aware UTC datetime | None (when the budget runs out at that rate; None when nothing is spent
    or it is already spent)}]``, by project and period. Spend is :func:`team_spend`'s (the bill's).
    """
    now = now or timezone.now()
    out = []
    for budget in Budget.objects.select_related("team").order_by("team__project", "period"):
        spend = team_spend(budget.team, budget.period, now=now)
        begin, end = spend["begin"], spend["end"]
        elapsed = min(max((now - begin).total_seconds(), 1.0), (end - begin).total_seconds())
        rate = spend["spent_usd"] / Decimal(str(elapsed))
        exhausted_at = None
        if rate > 0 and spend["spent_usd"] < budget.amount_usd:
            left_s = min(float((budget.amount_usd - spend["spent_usd"]) / rate), 100 * 365 * 86400.0)
            exhausted_at = now + dt.timedelta(seconds=left_s)
        out.append({"budget": budget, "team": budget.team, "project": budget.team.project, "period": budget.period,
                    "amount_usd": budget.amount_usd, "spent_usd": spend["spent_usd"],
                    "unpriced_tasks": spend["unpriced_tasks"], "begin": begin, "end": end,
                    "elapsed_ratio": elapsed / (end - begin).total_seconds(), "rate_usd_per_s": rate,
                    "exhausted_at": exhausted_at})
    return out
