"""Find anomalies and record each once (``AnomalyAlert.key``), with an audit entry; delivery after commit.

Three checks, their thresholds per site in settings (``TCO_ALERT_*``, docs/standards.md):

- slow tasks: a campaign's tasks pending (running) longer than ``TCO_ALERT_SLOW_FACTOR`` times the
  ``TCO_ALERT_SLOW_PERCENTILE`` percentile of the queue waits (run times) of the last
  ``TCO_ALERT_HISTORY_TASKS`` tasks of the same queue and agent (the campaign's cluster queue and
  agent definition name, any version), and longer than ``TCO_ALERT_SLOW_MIN_S``. No alert without
  ``TCO_ALERT_MIN_HISTORY`` such tasks: no history, no "usual". One alert per campaign and phase
  (pending, running), naming how many tasks and the oldest.
- failure bursts: at least ``TCO_ALERT_FAILURE_BURST`` tasks of a campaign failed (or were lost)
  within the last ``TCO_ALERT_FAILURE_WINDOW_S``, at least ``TCO_ALERT_FAILURE_FRACTION`` of the
  tasks that ended then; only failures after the campaign's previous burst alert count again.
- budget burn: a budget whose spend rate since its period began (``billing.budgets.budget_burn_rates``)
  exhausts it before the period ends, once ``TCO_ALERT_BURN_MIN_ELAPSED`` of the period is gone;
  once per budget and period, naming the date.

Durations are seconds (UTC datetimes subtracted); the percentile is :func:`core.stages.quantile`
(linear between ranks, numpy's default).
"""
from __future__ import annotations

import datetime as dt
import logging
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Count, F, Max, Min, Q, Value
from django.db.models.functions import Coalesce, Greatest
from django.utils import timezone

from dashboards.billing.budgets import budget_burn_rates
from dashboards.billing.periods import PERIOD_ADJECTIVES, cluster_zone, default_cluster
from dashboards.core.audit import audit
from dashboards.core.encoding import usd_text
from dashboards.core.failures import decided_filter, infrastructure_filter
from dashboards.core.stages import EpochSeconds, quantile
from dashboards.models import AnomalyAlert, Campaign, Task
from schedulers.durations import duration_text

log = logging.getLogger(__name__)

#: The audit action of a recorded alert (its deliveries: ``delivery.MAIL_ACTION``, ``delivery.WEBHOOK_ACTION``).
ALERT_ACTION = "anomaly_alert"
FAILED_STATES = ("failed", "lost")
ENDED_STATES = ("done", "failed", "lost")


def anomaly_check(*, now: dt.datetime | None = None) -> list[AnomalyAlert]:
    """Run every check once; returns the alerts this call recorded (none twice, whoever runs it).

    Each new alert is audited (``ALERT_ACTION``) in its transaction and delivered (e-mail,
    webhook: ``delivery.alert_deliver``) after it commits.
    """
    now = now or timezone.now()
    created: list[AnomalyAlert] = []
    for phase in ("pending", "running"):
        created += slow_task_alerts(phase, now=now)
    created += failure_burst_alerts(now=now)
    created += budget_burn_alerts(now=now)
    return created


def _record(key: str, **fields: Any) -> AnomalyAlert | None:
    """Create the alert ``key`` unless it exists (a concurrent check may win: then None)."""
    try:
        with transaction.atomic():
            alert, made = AnomalyAlert.objects.get_or_create(key=key, defaults=fields)
            if made:
                audit(user=None, action=ALERT_ACTION, target=f"anomaly_alert:{alert.pk}",
                      params={"key": key, "kind": alert.kind, "team": alert.team.project, "details": alert.details},
                      ok=True, result=alert.title)
    except IntegrityError:
        return None
    if not made:
        return None
    from dashboards.alerts.delivery import alert_deliver

    transaction.on_commit(lambda: alert_deliver(alert.pk))
    return alert


# --------------------------------------------------------------------------- slow tasks

def _history(phase: str, queue: str, agent: str, limit: int) -> list[float]:
    """The last ``limit`` queue waits (``pending``) or run times (``running``) of the tasks of
    campaigns in ``queue`` with an agent named ``agent``, seconds, sorted."""
    tasks = Task.objects.filter(campaign__queue=queue, campaign__agent_definition__name=agent)
    if phase == "pending":
        start = Coalesce("task_started_at", "started_at")
        rows = (tasks.filter(submitted_at__isnull=False).filter(Q(task_started_at__isnull=False)
                                                                 | Q(started_at__isnull=False))
                .annotate(began=start, d=Greatest(EpochSeconds(start) - EpochSeconds("submitted_at"), Value(0.0)))
                .order_by("-began").values_list("d", flat=True)[:limit])
    else:
        rows = (tasks.filter(state__in=ENDED_STATES, started_at__isnull=False, ended_at__isnull=False)
                .annotate(d=EpochSeconds("ended_at") - EpochSeconds("started_at"))
                .order_by("-ended_at").values_list("d", flat=True)[:limit])
    return sorted(float(d) for d in rows if d is not None)


def slow_task_alerts(phase: str, *, now: dt.datetime) -> list[AnomalyAlert]:
    """Alerts for campaigns whose tasks have been ``phase`` (pending, running) much longer than usual."""
    start_field = "submitted_at" if phase == "pending" else "began"
    active = Task.objects.filter(active=True, state=phase, campaign__isnull=False)
    if phase == "running":
        active = active.annotate(began=Coalesce("task_started_at", "started_at"))
    active = active.filter(**{f"{start_field}__isnull": False})
    done_keys = set(AnomalyAlert.objects.filter(kind=f"task_{phase}").values_list("key", flat=True))
    percentile = settings.TCO_ALERT_SLOW_PERCENTILE
    created = []
    for group in (active.values("campaign__queue", "campaign__agent_definition__name").distinct()
                  .order_by("campaign__queue", "campaign__agent_definition__name")):
        queue, agent = group["campaign__queue"], group["campaign__agent_definition__name"]
        history = _history(phase, queue, agent, settings.TCO_ALERT_HISTORY_TASKS)
        if len(history) < settings.TCO_ALERT_MIN_HISTORY:
            continue
        usual = quantile(history, percentile / 100)
        threshold = max(settings.TCO_ALERT_SLOW_FACTOR * usual, settings.TCO_ALERT_SLOW_MIN_S)
        slow = (active.filter(campaign__queue=queue, campaign__agent_definition__name=agent,
                              **{f"{start_field}__lt": now - dt.timedelta(seconds=threshold)})
                .values("campaign_id").annotate(n=Count("id"), first=Min(start_field)).order_by("campaign_id"))
        for row in slow:
            key = f"task_{phase}:{row['campaign_id']}"
            if key in done_keys:
                continue
            alert = _slow_alert(phase, key, row, queue=queue, agent=agent, usual=usual, threshold=threshold,
                                history=len(history), now=now)
            if alert is not None:
                created.append(alert)
    return created


def _slow_alert(phase: str, key: str, row: dict, *, queue: str, agent: str, usual: float, threshold: float,
                history: int, now: dt.datetime) -> AnomalyAlert | None:
    campaign = Campaign.objects.select_related("team").get(pk=row["campaign_id"])
    start_field = F("submitted_at") if phase == "pending" else Coalesce("task_started_at", "started_at")
    oldest = (Task.objects.filter(campaign=campaign, active=True, state=phase)
              .annotate(began=start_field).filter(began=row["first"]).order_by("task_number").first())
    longest = (now - row["first"]).total_seconds()
    percentile = settings.TCO_ALERT_SLOW_PERCENTILE
    what = "queue waits" if phase == "pending" else "run times"
    verb = "pending" if phase == "pending" else "running"
    task_text = f"task {oldest.task_number}" if oldest is not None else "the oldest task"
    title = (f"{campaign.team.name}: {row['n']} task(s) of {campaign.name} (#{campaign.pk}) {verb} for up to "
             f"{duration_text(longest)}, the p{percentile:g} of {agent} in {queue} is {duration_text(usual)}")
    text = (f"{row['n']} task(s) of campaign {campaign.name} (#{campaign.pk}, job {campaign.job_number}) of team "
            f"{campaign.team.name} have been {verb} longer than usual: {task_text} for {duration_text(longest)} "
            f"(since {row['first']:%Y-%m-%d %H:%M:%S} UTC). The {percentile:g}th percentile of the last {history} "
            f"{what} of agent {agent} in {queue} is {duration_text(usual)}; tco alerts above "
            f"{settings.TCO_ALERT_SLOW_FACTOR:g} x that and at least {duration_text(settings.TCO_ALERT_SLOW_MIN_S)} "
            f"({duration_text(threshold)}).")
    details = {"phase": phase, "tasks": row["n"], "oldest_task": oldest.task_number if oldest else None,
               "longest_s": round(longest, 3), "percentile": percentile, "usual_s": round(usual, 3),
               "threshold_s": round(threshold, 3), "history": history, "queue": queue, "agent": agent}
    return _record(key, kind=f"task_{phase}", team=campaign.team, campaign=campaign, task=oldest, title=title[:200],
                   text=text, details=details, starts_at=row["first"])


# --------------------------------------------------------------------------- failure bursts

def failure_burst_alerts(*, now: dt.datetime) -> list[AnomalyAlert]:
    """Alerts for campaigns with a burst of failed (or lost) tasks in the last window."""
    window = dt.timedelta(seconds=settings.TCO_ALERT_FAILURE_WINDOW_S)
    ended = (Task.objects.filter(campaign__isnull=False, state__in=ENDED_STATES)
             .annotate(end=Coalesce("ended_at", "gone_at")).filter(end__gt=now - window, end__lte=now))
    last_alert = dict(AnomalyAlert.objects.filter(kind="campaign_failures").values("campaign_id")
                      .annotate(last=Max("at")).values_list("campaign_id", "last"))
    created = []
    candidates = (ended.values("campaign_id")
                  .annotate(failed=Count("id", filter=Q(state__in=FAILED_STATES)))
                  .filter(failed__gte=settings.TCO_ALERT_FAILURE_BURST).order_by("campaign_id"))
    for row in candidates:
        campaign_id = row["campaign_id"]
        since = max(now - window, last_alert.get(campaign_id) or now - window)
        mine = ended.filter(campaign_id=campaign_id, end__gt=since)
        counts = mine.aggregate(ended=Count("id"), failed=Count("id", filter=Q(state__in=FAILED_STATES)),
                                infrastructure=Count("id", filter=Q(state__in=FAILED_STATES) & infrastructure_filter()),
                                decided=Count("id", filter=decided_filter()),
                                first=Min("end", filter=Q(state__in=FAILED_STATES)))
        # Tasks killed by a delete asked of tco (a cancel) are no fault, and no part of the tasks that ended
        # either: a cancelled campaign's running tasks made a "35 of 35 failed" alert (core.failures).
        counts["failed"] -= counts["decided"]
        counts["ended"] -= counts["decided"]
        if counts["failed"] < settings.TCO_ALERT_FAILURE_BURST:
            continue
        if counts["failed"] < settings.TCO_ALERT_FAILURE_FRACTION * counts["ended"]:
            continue
        previous = AnomalyAlert.objects.filter(kind="campaign_failures", campaign_id=campaign_id).count()
        alert = _burst_alert(f"campaign_failures:{campaign_id}:{previous + 1}", campaign_id, counts, since, now)
        if alert is not None:
            created.append(alert)
    return created


def _burst_alert(key: str, campaign_id: int, counts: dict, since: dt.datetime,
                 now: dt.datetime) -> AnomalyAlert | None:
    campaign = Campaign.objects.select_related("team").get(pk=campaign_id)
    codes = list(Task.objects.filter(campaign=campaign, state__in=FAILED_STATES).exclude(decided_filter())
                 .annotate(end=Coalesce("ended_at", "gone_at")).filter(end__gt=since, end__lte=now)
                 .values("exit_status", "failed_code").annotate(n=Count("id")).order_by("-n")[:3])
    why = "; ".join(f"{c['n']} with " + ", ".join(
        [f"exit status {c['exit_status']}"] * (c["exit_status"] is not None)
        + [f"Grid Engine's failed code {c['failed_code']}"] * bool(c["failed_code"]) or ["no exit status"])
        for c in codes)
    minutes = duration_text(settings.TCO_ALERT_FAILURE_WINDOW_S)
    # The infrastructure's share said apart (core.failures): a lost host's burst read as the agents' (fresh user).
    infrastructure = counts["infrastructure"]
    theirs = f" ({infrastructure} the infrastructure's)" if infrastructure else ""
    decided = counts.get("decided", 0)
    title = (f"{campaign.team.name}: {counts['failed']} of {counts['ended']} tasks of {campaign.name} "
             f"(#{campaign.pk}) failed within {minutes}{theirs}")
    text = (f"Campaign {campaign.name} (#{campaign.pk}, job {campaign.job_number}) of team {campaign.team.name}: "
            f"{counts['failed']} of the {counts['ended']} tasks that ended since {since:%Y-%m-%d %H:%M:%S} UTC "
            f"failed or were lost ({why or 'no exit status recorded'})"
            + (f"; {decided} more were killed by a cancel or delete asked of tco, not counted" if decided else "")
            + ". tco alerts at "
            f"{settings.TCO_ALERT_FAILURE_BURST} failures within {minutes} that are at least "
            f"{settings.TCO_ALERT_FAILURE_FRACTION:.0%} of the tasks ended.")
    details = {"failed": counts["failed"], "ended": counts["ended"], "infrastructure": infrastructure,
               "decided": decided,
               "since": since.isoformat(),
               "window_s": settings.TCO_ALERT_FAILURE_WINDOW_S, "burst": settings.TCO_ALERT_FAILURE_BURST,
               "fraction": settings.TCO_ALERT_FAILURE_FRACTION, "causes": codes}
    return _record(key, kind="campaign_failures", severity="critical", team=campaign.team, campaign=campaign,
                   title=title[:200], text=text, details=details, starts_at=counts["first"] or now)


# --------------------------------------------------------------------------- budgets

def budget_burn_alerts(*, now: dt.datetime) -> list[AnomalyAlert]:
    """Alerts for budgets the spend rate exhausts before their period ends (once per budget and period)."""
    tz = cluster_zone(default_cluster())
    created = []
    for row in budget_burn_rates(now=now):
        exhausted = row["exhausted_at"]
        if exhausted is None or exhausted >= row["end"] or row["elapsed_ratio"] < settings.TCO_ALERT_BURN_MIN_ELAPSED:
            continue
        budget, team = row["budget"], row["team"]
        key = f"budget_burn:{budget.pk}:{row['begin'].isoformat()}"
        if AnomalyAlert.objects.filter(key=key).exists():
            continue
        kind = PERIOD_ADJECTIVES[budget.period]
        day = exhausted.astimezone(tz).date()
        last_day = (row["end"] - dt.timedelta(seconds=1)).astimezone(tz).date()
        per_day = row["rate_usd_per_s"] * 86400
        title = (f"{team.name}: the {kind} budget of {usd_text(budget.amount_usd)} runs out on {day.isoformat()}, "
                 f"before the period ends on {last_day.isoformat()}")
        text = (f"Team {team.name} (project {team.project}) has spent {usd_text(row['spent_usd'])} of its {kind} "
                f"budget of {usd_text(budget.amount_usd)} since {row['begin'].astimezone(tz):%Y-%m-%d %H:%M} "
                f"({row['elapsed_ratio']:.0%} of the period), about {usd_text(per_day)} a day. At that rate the "
                f"budget runs out on {day.isoformat()} ({exhausted.astimezone(tz):%H:%M} {tz}), before the period "
                f"ends on {last_day.isoformat()}. Launches that would cross it are "
                f"{'refused' if budget.on_exceed == 'refuse' else 'submitted on hold'}."
                + (f" {row['unpriced_tasks']} task(s) have no price and are not in the rate." if row["unpriced_tasks"]
                   else ""))
        details = {"period": budget.period, "amount_usd": str(budget.amount_usd), "spent_usd": str(row["spent_usd"]),
                   "usd_per_day": str(per_day.quantize(Decimal("0.000001"))),
                   "exhausted_on": day.isoformat(), "exhausted_at": exhausted.isoformat(),
                   "period_ends_on": last_day.isoformat(), "elapsed_ratio": round(row["elapsed_ratio"], 6),
                   "unpriced_tasks": row["unpriced_tasks"]}
        alert = _record(key, kind="budget_burn", team=team, budget=budget, title=title[:200], text=text,
                        details=details, starts_at=now)
        if alert is not None:
            created.append(alert)
    return created
