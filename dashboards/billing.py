"""Bills, budgets and cost forecasts (reads and writes for team leads and launchers).

Units: tokens are integers, money is USD as ``Decimal``, times are seconds
(``wallclock_s`` float, ``slot_s`` = wall clock x slots).

Periods follow ``qacct -b/-e``: a task (and an accounting record) belongs to
the period of its **start time in the cluster's time zone**. ``qacct`` keeps
a record when ``begin <= start_time <= end`` (SoGE 8.1.9 ``qacct.c``,
``sge_read_rusage``), with whole seconds; a period here is ``[first local
midnight, next period's first local midnight)``, which is the same set, so
the wall clock of a team for a period equals ``qacct -P <project> -b
<start> -e <next start - 1 s>`` run in the cluster's time zone. Records
without a start (a failed start writes 0) belong to no period, as in qacct.

Sources: wall clock and slot-seconds come from ``AccountingRecord`` (every
record, including retried starts and PE task records, as qacct counts them);
tokens and cost from ``Task`` (filled by the metering of runner records).
A team's project is the scheduler's ``-P``; bills are per project.
"""
from __future__ import annotations

import calendar
import datetime as dt
import logging
from decimal import Decimal
from types import SimpleNamespace
from typing import Any, Iterable, Iterator, Sequence
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.mail import send_mail
from django.db import DatabaseError, IntegrityError, transaction
from django.db.models import (
    BigIntegerField,
    BooleanField,
    Case,
    Count,
    DateField,
    ExpressionWrapper,
    F,
    FloatField,
    Q,
    QuerySet,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Coalesce, NullIf, Round, Trunc
from django.utils import timezone

from execution.spool.contract import TOKEN_BUCKETS

from . import pricing_models
from .audit import audit
from .models import AccountingRecord, Budget, BudgetAlert, Cluster, Membership, Role, Task, Team
from .stages import quantile

log = logging.getLogger(__name__)

#: Disjoint token buckets (DESIGN.md, "Token metering and cost"); reasoning is part of output.
BUCKETS = TOKEN_BUCKETS
BUCKET_LABELS = {
    "input_tokens": "input",
    "cache_read_tokens": "cache read",
    "cache_write_5m_tokens": "cache w. 5m",
    "cache_write_1h_tokens": "cache w. 1h",
    "output_tokens": "output",
}
PERIODS = ("day", "week", "month")
PERIOD_ADJECTIVES = {"day": "daily", "week": "weekly", "month": "monthly"}
GROUPS = ("team", "model", "campaign", "launcher")
#: A "successful verdict": a task that ended done and declared a verdict (verdict.json), whatever it says.
SUCCESSFUL_VERDICT = "a task that ended done and declared a verdict (its verdict.json), whatever the verdict says"
#: A bill covers at most this many periods (a year of days).
MAX_PERIODS = 400
#: Costs are summed as integers of 1e-8 USD (Task.cost_usd has 8 decimals):
#: exact on every database (SQLite stores decimals as floats) up to 2**53 units.
COST_UNITS = Decimal("100000000")
UNSPECIFIED_MODEL = "(model not set)"
NOT_TCO = "(not launched by tco)"
#: The one definition of a team's usage, said on the bill page, in its CSV and by ``/api/usage/`` (issue 16, bug 6).
USAGE_DEFINITION = ("A team's usage is the tasks of its tco campaigns that started in the period (cluster time "
                    "zone) and their accounting records (wall clock and slot-seconds as qacct sums them); jobs run "
                    "under the team's project that tco did not launch are listed apart, never in the team's total, "
                    "and counted from their accounting records alone: each record is one finished task.")
#: Finished tasks of an agent definition read for a forecast (the newest first).
FORECAST_HISTORY = 5000
ZERO = Decimal("0")


class BillError(ValueError):
    """A bill or budget request out of bounds; ``str(err)`` is shown to the user."""


# --------------------------------------------------------------------------- periods

def cluster_zone(cluster: Cluster | None = None) -> ZoneInfo:
    """The time zone periods are cut in: the cluster's, else ``TCO_CLUSTER_TZ``."""
    name = cluster.time_zone if cluster is not None else settings.TCO_CLUSTER_TZ
    try:
        return ZoneInfo(name or "UTC")
    except (ZoneInfoNotFoundError, ValueError):
        log.warning("unknown time zone %r for cluster %s; using UTC", name, cluster)
        return ZoneInfo("UTC")


def period_start(day: dt.date, period: str) -> dt.date:
    """First day of the ``period`` (day, ISO week from Monday, month) that contains ``day``."""
    if period == "day":
        return day
    if period == "week":
        return day - dt.timedelta(days=day.weekday())
    if period == "month":
        return day.replace(day=1)
    raise BillError(f"period must be one of {', '.join(PERIODS)}, not {period!r}")


def next_period_start(start: dt.date, period: str) -> dt.date:
    """First day of the period after the one starting on ``start``."""
    if period == "day":
        return start + dt.timedelta(days=1)
    if period == "week":
        return start + dt.timedelta(days=7)
    if period == "month":
        days = calendar.monthrange(start.year, start.month)[1]
        return start.replace(day=1) + dt.timedelta(days=days)
    raise BillError(f"period must be one of {', '.join(PERIODS)}, not {period!r}")


def local_midnight(day: dt.date, tz: dt.tzinfo) -> dt.datetime:
    """``day`` 00:00 in ``tz`` as an aware UTC datetime (qacct uses mktime the same way)."""
    return dt.datetime.combine(day, dt.time(0), tzinfo=tz).astimezone(dt.timezone.utc)


def period_bounds(start: dt.date, period: str, tz: dt.tzinfo) -> tuple[dt.datetime, dt.datetime]:
    """``[begin, end)`` in UTC of the period starting on local day ``start``."""
    first = period_start(start, period)
    return local_midnight(first, tz), local_midnight(next_period_start(first, period), tz)


def qacct_time(moment: dt.datetime, tz: dt.tzinfo) -> str:
    """``moment`` in qacct's ``-b/-e`` format ``CCYYMMDDhhmm.SS``, in ``tz`` (run qacct with ``TZ`` = tz)."""
    return moment.astimezone(tz).strftime("%Y%m%d%H%M.%S")


def current_period(period: str, *, now: dt.datetime | None = None,
                   tz: dt.tzinfo | None = None) -> tuple[dt.date, dt.datetime, dt.datetime]:
    """The period containing ``now``: ``(first local day, begin UTC, end UTC)``."""
    tz = tz or cluster_zone(_default_cluster())
    now = now or timezone.now()
    first = period_start(now.astimezone(tz).date(), period)
    begin, end = period_bounds(first, period, tz)
    return first, begin, end


def _default_cluster() -> Cluster | None:
    return Cluster.objects.filter(name=settings.TCO_CLUSTER_NAME).first()


# --------------------------------------------------------------------------- bills

def teams_billable_by(user: AbstractBaseUser) -> QuerySet[Team]:
    """Teams whose bills and budgets ``user`` may see (roles.py capability ``bill``)."""
    from .roles import teams_with

    return teams_with(user, "bill")


def _model_expr(prefix: str):
    return Coalesce(
        NullIf(F(f"{prefix}campaign__model"), Value("")),
        NullIf(F(f"{prefix}campaign__agent_definition__default_model"), Value("")),
        Value(UNSPECIFIED_MODEL),
    )


def _empty_row(period: dt.date, project: str, key: Any) -> dict[str, Any]:
    row: dict[str, Any] = {"period": period, "project": project, "key": key, "tasks": 0, "records": 0,
                           "reasoning_tokens": 0, "total_tokens": 0, "cost_usd": ZERO, "unpriced_tasks": 0,
                           "finished_tasks": 0, "verdicts": 0, "wallclock_s": 0.0, "slot_s": 0.0}
    for bucket in BUCKETS:
        row[bucket] = 0
    return row


def bill(*, teams: Iterable[Team], period: str, first: dt.date, last: dt.date, group_by: str = "team",
         clusters: Sequence[Cluster] | None = None, campaign: int | None = None, model: str = "",
         launcher: str = "") -> dict[str, Any]:
    """A bill: usage per period and team (and model or campaign) for local days ``first``..``last``.

    ``period`` is ``day``, ``week`` or ``month``; ``first`` and ``last`` are
    widened to whole periods. ``group_by`` is ``team`` (one row per team and
    period), ``model`` (the campaign's model, else the agent definition's
    default model), ``campaign`` or ``launcher`` (who launched the campaign).
    ``campaign`` (id), ``model`` and ``launcher`` (user name) narrow the bill
    to that campaign, model or launcher's campaigns (usage tco did not launch
    then has none of them and is left out).

    Returns ``{"period", "group_by", "first", "last" (last day included),
    "time_zone", "rows": [row], "totals": row}`` where a row is ``{"period":
    date (first local day), "team", "project", "key", "label", "tasks"
    (tasks started; in a ``NOT_TCO`` row, accounting records), "records" (accounting records), each bucket of
    ``BUCKETS``, "reasoning_tokens" (part of output), "total_tokens",
    "cost_usd" (Decimal USD), "unpriced_tasks" (tokens without a cost),
    "finished_tasks" (done or failed), "verdicts" (``SUCCESSFUL_VERDICT``),
    "wallclock_s", "slot_s", "launched_by_tco"}``, sorted by period, team,
    label. Rows exist only where something started. Usage under a team's
    project that tco did not launch (another account's ``qsub -P``) is a row of
    its own, labelled ``NOT_TCO``, and is not in ``totals``: it is summed in
    ``not_tco_totals``. Raises ``BillError`` for a bad period,
    group or range.
    """
    if period not in PERIODS:
        raise BillError(f"period must be one of {', '.join(PERIODS)}")
    if group_by not in GROUPS:
        raise BillError(f"group by one of {', '.join(GROUPS)}")
    if last < first:
        raise BillError("the last day is before the first day")
    first = period_start(first, period)
    end_day = next_period_start(period_start(last, period), period)
    n_periods = 0
    cursor = first
    while cursor < end_day:
        n_periods += 1
        if n_periods > MAX_PERIODS:
            raise BillError(f"a bill covers at most {MAX_PERIODS} periods; choose a longer period or a shorter range")
        cursor = next_period_start(cursor, period)

    teams = list(teams)
    team_of = {t.project: t for t in teams}
    clusters = list(clusters) if clusters is not None else list(Cluster.objects.order_by("name"))
    rows: dict[tuple, dict[str, Any]] = {}
    tz_names = sorted({c.time_zone or "UTC" for c in clusters}) or [settings.TCO_CLUSTER_TZ]
    for cluster in clusters if team_of else ():
        tz = cluster_zone(cluster)
        _accumulate(rows, cluster=cluster, begin=local_midnight(first, tz), end=local_midnight(end_day, tz),
                    projects=list(team_of), group_by=group_by,
                    trunc=Trunc("started_at", period, output_field=DateField(), tzinfo=tz),
                    only={"campaign": campaign, "model": model, "launcher": launcher})

    labels: dict[Any, str] = {}
    if group_by == "campaign":
        from .models import Campaign

        ids = {k[3] for k in rows if k[3] is not None and k[2]}
        labels = {pk: f"{name} (#{pk})" for pk, name in Campaign.objects.filter(pk__in=ids).values_list("pk", "name")}
    out = []
    for (p, project, launched, key), row in rows.items():
        team = team_of.get(project)
        row["team"] = team.name if team else project
        if not launched:
            row["label"] = NOT_TCO
        elif group_by == "team":
            row["label"] = row["team"]
        elif group_by in ("model", "launcher"):
            row["label"] = key if key is not None else "(not recorded)"
        else:
            row["label"] = labels.get(key, NOT_TCO) if key is not None else NOT_TCO
        out.append(row)
    out.sort(key=lambda r: (r["period"], r["team"], not r["launched_by_tco"], str(r["label"])))
    totals = _sum_rows(r for r in out if r["launched_by_tco"])
    totals.update(period=first, team="", label="total")
    not_tco = _sum_rows(r for r in out if not r["launched_by_tco"])
    not_tco.update(period=first, team="", label=NOT_TCO)
    return {"period": period, "group_by": group_by, "first": first, "last": end_day - dt.timedelta(days=1),
            "time_zone": ", ".join(tz_names), "rows": out, "totals": totals, "not_tco_totals": not_tco}


def _launched_by_tco(prefix: str):
    """True for usage of a task of one of tco's campaigns (``prefix`` reaches the task)."""
    return Case(When(**{f"{prefix}campaign__isnull": False}, then=Value(True)), default=Value(False),
                output_field=BooleanField())


def _only(qs: QuerySet, only: dict[str, Any] | None, prefix: str) -> QuerySet:
    """``qs`` narrowed to one campaign (id), model or launcher (user name) when ``only`` says so."""
    only = only or {}
    if only.get("campaign"):
        qs = qs.filter(**{f"{prefix}campaign_id": only["campaign"]})
    if only.get("launcher"):
        qs = qs.filter(**{f"{prefix}campaign__launched_by__username": only["launcher"]})
    if only.get("model"):
        qs = qs.annotate(only_model=_model_expr(prefix)).filter(only_model=only["model"])
    return qs


def _accumulate(rows: dict[tuple, dict[str, Any]], *, cluster: Cluster, begin: dt.datetime, end: dt.datetime,
                projects: list[str], group_by: str, trunc, only: dict[str, Any] | None = None) -> None:
    """Add the usage started in ``[begin, end)`` on ``cluster`` to ``rows``, the one definition of a team's usage.

    ``rows`` is keyed ``(period date | None, project, launched_by_tco, group
    key | None)``. A team's usage is what tco launched for it: the tasks of
    its campaigns and their accounting records. Anything else run under the
    team's project (a ``qsub -P <project>`` by another account) is kept apart
    with ``launched_by_tco`` False, never in the team's sums, and counted from
    its accounting records only: tasks = finished tasks = records (the task
    rows of such jobs come and go with qstat polls; a job tco only saw in
    qstat has no record and is not usage until it ends). ``trunc`` (a ``Trunc`` of ``started_at``) cuts periods;
    None gives one row per key with period None.
    """
    # Wall clock and slot-seconds: every accounting record, as qacct sums them.
    records = (AccountingRecord.objects.filter(cluster=cluster, started_at__gte=begin, started_at__lt=end)
               .annotate(tp=Coalesce(F("task__campaign__team__project"), F("project")),
                         tco=_launched_by_tco("task__"))
               .filter(tp__in=projects))
    records = _only(records, only, "task__")
    records, key_fields = _grouped(records, group_by=group_by, trunc=trunc, prefix="task__")
    slot_s = ExpressionWrapper(F("wallclock_s") * F("slots"), output_field=FloatField())
    for item in (records.values(*key_fields)
                 .annotate(n=Count("id"), wall=Sum("wallclock_s"), slot=Sum(slot_s)).order_by()):
        row = _row_for(rows, item)
        row["records"] += item["n"]
        row["wallclock_s"] += float(item["wall"] or 0.0)
        row["slot_s"] += float(item["slot"] or 0.0)
        if not row["launched_by_tco"]:
            # Usage tco did not launch: counted from the accounting records alone (one record, one
            # finished task), never from the task rows qstat polls add and drop between two reads.
            row["tasks"] += item["n"]
            row["finished_tasks"] += item["n"]

    # Tasks, tokens and cost of tco's campaigns: tasks, by the start of their (last) run, in
    # their campaign's team. (Jobs tco did not launch were counted above, from their records.)
    tasks = (Task.objects.filter(cluster=cluster, campaign__isnull=False, started_at__gte=begin, started_at__lt=end)
             .annotate(tp=F("campaign__team__project"), tco=_launched_by_tco(""))
             .filter(tp__in=projects))
    tasks = _only(tasks, only, "")
    tasks, task_fields = _grouped(tasks, group_by=group_by, trunc=trunc, prefix="")
    any_tokens = _any_tokens()
    sums = {bucket: Sum(bucket) for bucket in (*BUCKETS, "reasoning_tokens")}
    cost_units = Sum(Round(F("cost_usd") * COST_UNITS), output_field=BigIntegerField())
    for item in (tasks.values(*task_fields)
                 .annotate(n=Count("id"), cost=cost_units,
                           unpriced=Count("id", filter=Q(cost_usd__isnull=True) & any_tokens),
                           finished=Count("id", filter=Q(state__in=("done", "failed"))),
                           verdicts=Count("id", filter=Q(state="done") & ~Q(verdict="")), **sums)
                 .order_by()):
        row = _row_for(rows, item)
        row["tasks"] += item["n"]
        row["unpriced_tasks"] += item["unpriced"]
        row["finished_tasks"] += item["finished"]
        row["verdicts"] += item["verdicts"]
        row["cost_usd"] += Decimal(int(item["cost"] or 0)) / COST_UNITS
        for bucket in (*BUCKETS, "reasoning_tokens"):
            row[bucket] += int(item[bucket] or 0)
        row["total_tokens"] = sum(row[b] for b in BUCKETS)


def _grouped(qs: QuerySet, *, group_by: str, trunc, prefix: str) -> tuple[QuerySet, list[str]]:
    """``qs`` annotated with the group key ``k`` (model or campaign) and the period ``p``, and the
    fields to group by: ``tp`` (team project), ``tco`` and those. ``prefix`` reaches the task."""
    fields = ["tp", "tco"]
    if group_by == "model":
        qs = qs.annotate(k=_model_expr(prefix))
        fields.append("k")
    elif group_by == "campaign":
        qs = qs.annotate(k=F(f"{prefix}campaign_id"))
        fields.append("k")
    elif group_by == "launcher":
        qs = qs.annotate(k=F(f"{prefix}campaign__launched_by__username"))
        fields.append("k")
    if trunc is not None:
        qs = qs.annotate(p=trunc)
        fields.append("p")
    return qs, fields


def _any_tokens() -> Q:
    """Tasks that used any tokens (those without a cost are "unpriced", not free)."""
    q = Q()
    for bucket in BUCKETS:
        q |= Q(**{f"{bucket}__gt": 0})
    return q


def _row_for(rows: dict[tuple, dict[str, Any]], item: dict[str, Any]) -> dict[str, Any]:
    launched = bool(item["tco"])
    key = (item.get("p"), item["tp"], launched, item.get("k") if launched else None)
    row = rows.get(key)
    if row is None:
        row = rows[key] = _empty_row(key[0], key[1], key[3])
        row["launched_by_tco"] = launched
    return row


def _sum_rows(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    total = _empty_row(None, "", None)
    for row in rows:
        for field in ("tasks", "records", "reasoning_tokens", "total_tokens", "unpriced_tasks", "finished_tasks",
                      "verdicts", *BUCKETS):
            total[field] += row[field]
        total["cost_usd"] += row["cost_usd"]
        total["wallclock_s"] += row["wallclock_s"]
        total["slot_s"] += row["slot_s"]
    return total


def usage_by_team(user: AbstractBaseUser, *, since: dt.datetime, until: dt.datetime) -> dict[str, list[dict[str, Any]]]:
    """Usage started in ``[since, until)`` per team where ``user`` may read bills (``/api/usage/``).

    The same definition as the bill page (``_accumulate``): ``{"teams":
    [row], "not_launched_by_tco": [row]}``, a row ``{team, project, tasks,
    records, finished_tasks (done or failed), wallclock_s, slot_s, input_tokens, cache_read_tokens,
    cache_write_5m_tokens, cache_write_1h_tokens, output_tokens,
    reasoning_tokens, tokens, cost_usd (Decimal USD), unpriced_tasks}``,
    sorted by team. Jobs run under a team's project that tco did not launch
    are in ``not_launched_by_tco``, never in the team's row.
    """
    teams = list(teams_billable_by(user))
    team_of = {t.project: t for t in teams}
    rows: dict[tuple, dict[str, Any]] = {}
    for cluster in Cluster.objects.order_by("name") if team_of else ():
        _accumulate(rows, cluster=cluster, begin=since, end=until, projects=list(team_of), group_by="team",
                    trunc=None)
    out: dict[str, list[dict[str, Any]]] = {"teams": [], "not_launched_by_tco": []}
    for (_p, project, launched, _k), row in sorted(rows.items(), key=lambda kv: team_of[kv[0][1]].name):
        out["teams" if launched else "not_launched_by_tco"].append({
            "team": team_of[project].name, "project": project, "tasks": row["tasks"], "records": row["records"],
            "finished_tasks": row["finished_tasks"], "wallclock_s": row["wallclock_s"], "slot_s": row["slot_s"],
            **{f: row[f] for f in (*BUCKETS, "reasoning_tokens")}, "tokens": row["total_tokens"],
            "cost_usd": row["cost_usd"], "unpriced_tasks": row["unpriced_tasks"]})
    return out


CSV_COLUMNS = ("period_start", "team", "project", "group_by", "group", "tasks", "accounting_records",
               *BUCKETS, "reasoning_tokens", "total_tokens", "cost_usd", "unpriced_tasks", "wallclock_s", "slot_s",
               "launched_by_tco", "finished_tasks", "successful_verdicts")


def bill_csv_rows(result: dict[str, Any]) -> Iterator[list[str]]:
    """The bill as CSV rows (header first): USD as exact decimals, seconds with 3 decimals."""
    yield list(CSV_COLUMNS)
    for row in result["rows"]:
        yield [row["period"].isoformat(), row["team"], row["project"], result["group_by"], str(row["label"]),
               str(row["tasks"]), str(row["records"]), *(str(row[b]) for b in BUCKETS), str(row["reasoning_tokens"]),
               str(row["total_tokens"]), format(row["cost_usd"].normalize(), "f"), str(row["unpriced_tasks"]),
               f"{row['wallclock_s']:.3f}", f"{row['slot_s']:.3f}", "yes" if row["launched_by_tco"] else "no",
               str(row["finished_tasks"]), str(row["verdicts"])]


# --------------------------------------------------------------------------- the bill page's views

def unit_costs(row: dict[str, Any]) -> dict[str, Any]:
    """Cost per finished task and per successful verdict (``SUCCESSFUL_VERDICT``) of a bill row:
    ``{"per_finished": Decimal | None, "per_verdict": Decimal | None, "complete": bool}``; None
    when there is nothing to divide by; ``complete`` False when some tasks are unpriced (the
    figures are then a lower bound, never shown as the whole cost)."""
    def per(n: int) -> Decimal | None:
        return (row["cost_usd"] / n).quantize(Decimal("0.000001")) if n else None

    return {"per_finished": per(row["finished_tasks"]), "per_verdict": per(row["verdicts"]),
            "complete": not row["unpriced_tasks"]}


def bill_chart(result: dict[str, Any]) -> dict[str, Any]:
    """The bill as a stacked chart's data: ``{"periods": [ISO date], "series": [{"label",
    "cost_usd": [float per period], "unpriced_tasks": [int per period], "launched_by_tco"}],
    "group_by"}``; one series per label, tco's first by total cost, usage tco did not launch last."""
    periods = sorted({r["period"] for r in result["rows"]})
    index = {p: i for i, p in enumerate(periods)}
    series: dict[tuple, dict[str, Any]] = {}
    for row in result["rows"]:
        label = str(row["label"]) if row["launched_by_tco"] else f"{row['team']} {NOT_TCO}"
        key = (row["launched_by_tco"], label)
        item = series.setdefault(key, {"label": label, "launched_by_tco": row["launched_by_tco"],
                                       "cost_usd": [0.0] * len(periods), "unpriced_tasks": [0] * len(periods)})
        item["cost_usd"][index[row["period"]]] += float(row["cost_usd"])
        item["unpriced_tasks"][index[row["period"]]] += row["unpriced_tasks"]
    ordered = sorted(series.values(), key=lambda s: (not s["launched_by_tco"], -sum(s["cost_usd"]), s["label"]))
    return {"periods": [p.isoformat() for p in periods], "series": ordered, "group_by": result["group_by"]}


def costliest_tasks(campaign_id: int, *, teams: Iterable[Team], limit: int = 20) -> list[Task]:
    """The campaign's tasks by cost, the costliest first (unpriced ones with tokens after them),
    at most ``limit``; only a campaign of one of ``teams``."""
    return list(Task.objects.filter(campaign_id=campaign_id, campaign__team__in=list(teams))
                .filter(Q(cost_usd__isnull=False) | _any_tokens())
                .order_by(F("cost_usd").desc(nulls_last=True), "task_number")[:limit])


def budget_burndown(budget: Budget, *, now: dt.datetime | None = None) -> dict[str, Any]:
    """The budget's current period day by day: ``{"budget", "first", "end_day" (last day), "days":
    [ISO date up to today], "cumulative_usd": [float], "amount_usd": float, "spent_usd": Decimal,
    "projected_usd": Decimal (spend so far / elapsed days x days in the period: the average daily
    rate carried to the period's end), "unpriced_tasks": int, "over": bool (projected > amount)}``."""
    tz = cluster_zone(_default_cluster())
    now = now or timezone.now()
    first, begin, end = current_period(budget.period, now=now, tz=tz)
    today = now.astimezone(tz).date()
    end_day = next_period_start(first, budget.period) - dt.timedelta(days=1)
    daily = dict(Task.objects.filter(campaign__team=budget.team, started_at__gte=begin, started_at__lt=end)
                 .annotate(d=Trunc("started_at", "day", output_field=DateField(), tzinfo=tz))
                 .values("d").annotate(cost=Sum(Round(F("cost_usd") * COST_UNITS), output_field=BigIntegerField()))
                 .order_by().values_list("d", "cost"))
    spend = team_spend(budget.team, budget.period, now=now)
    days, cumulative, running = [], [], ZERO
    cursor = first
    while cursor <= today:
        running += Decimal(int(daily.get(cursor) or 0)) / COST_UNITS
        days.append(cursor.isoformat())
        cumulative.append(float(running))
        cursor += dt.timedelta(days=1)
    elapsed = max((now - begin).total_seconds(), 1.0)
    projected = (spend["spent_usd"] * Decimal(str((end - begin).total_seconds() / elapsed))).quantize(
        Decimal("0.000001"))
    return {"budget": budget, "first": first, "end_day": end_day, "days": days, "cumulative_usd": cumulative,
            "amount_usd": float(budget.amount_usd), "spent_usd": spend["spent_usd"], "projected_usd": projected,
            "unpriced_tasks": spend["unpriced_tasks"], "over": projected > budget.amount_usd}


def presets(today: dt.date) -> list[dict[str, Any]]:
    """The bill's date presets: ``[{"key", "label", "first", "last", "period"}]`` for this week,
    last week (ISO weeks from Monday), this month and last month, by day."""
    week = period_start(today, "week")
    month = period_start(today, "month")
    last_month = period_start(month - dt.timedelta(days=1), "month")
    return [
        {"key": "this-week", "label": "this week", "first": week, "last": today, "period": "day"},
        {"key": "last-week", "label": "last week", "first": week - dt.timedelta(days=7),
         "last": week - dt.timedelta(days=1), "period": "day"},
        {"key": "this-month", "label": "this month", "first": month, "last": today, "period": "day"},
        {"key": "last-month", "label": "last month", "first": last_month, "last": month - dt.timedelta(days=1),
         "period": "day"},
    ]


# --------------------------------------------------------------------------- budgets

def team_spend(team: Team, period: str, *, now: dt.datetime | None = None) -> dict[str, Any]:
    """What ``team`` spent in the current ``period``: ``{"first": date, "begin", "end" (UTC),
    "spent_usd": Decimal, "unpriced_tasks": int}`` (tasks started in the period, cluster time zone)."""
    first, begin, end = current_period(period, now=now)
    # The team's usage as bills count it: the tasks of its campaigns (not another account's qsub -P).
    tasks = Task.objects.filter(campaign__team=team, started_at__gte=begin, started_at__lt=end)
    any_tokens = _any_tokens()
    agg = tasks.aggregate(cost=Sum(Round(F("cost_usd") * COST_UNITS), output_field=BigIntegerField()),
                          unpriced=Count("id", filter=Q(cost_usd__isnull=True) & any_tokens))
    return {"first": first, "begin": begin, "end": end,
            "spent_usd": Decimal(int(agg["cost"] or 0)) / COST_UNITS, "unpriced_tasks": agg["unpriced"]}


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


def usd_places(amounts: Iterable[Decimal], *, over: tuple[Decimal, Decimal] | None = None,
               tolerance: Decimal = Decimal("0.01")) -> int:
    """Decimal places (2 to 8) to show USD ``amounts`` with: the fewest that put every amount
    within ``tolerance`` (a fraction, 1 %) of itself and, when ``over = (a, b)`` with ``a > b``,
    keep ``a`` visibly above ``b``. ``[0.0072, 0.009]`` -> 4 ("$0.0072", "$0.0090")."""
    amounts = [Decimal(a) for a in amounts if a is not None]
    for places in range(2, 9):
        step = Decimal(1).scaleb(-places)
        if any(a and abs(a.quantize(step) - a) > abs(a) * tolerance for a in amounts):
            continue
        if over is not None and over[0] > over[1] and not over[0].quantize(step) > over[1].quantize(step):
            continue
        return places
    return 8


def usd_text(amount: Decimal | None, places: int | None = None) -> str:
    """``amount`` as ``$1,234.56``; with ``places`` None, as many places as ``usd_places`` needs
    for it alone (``$0.0072``, never a rounded ``$0.01``). ``"?"`` for None."""
    if amount is None:
        return "?"
    amount = Decimal(amount)
    if places is None:
        places = usd_places([amount])
    return f"${amount.quantize(Decimal(1).scaleb(-places)):,}"


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


_usd = usd_text


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
    from .roles import user_can

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
    from .roles import user_can

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
            kind, spent, amount = PERIOD_ADJECTIVES[budget.period], _usd(spend["spent_usd"]), _usd(budget.amount_usd)
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
    from .models import AuditEntry

    out: dict[int, dict[str, Any]] = {a.pk: {"sent": None, "detail": "e-mail not tried yet"} for a in alerts}
    by_target = {_alert_target(a): a.pk for a in alerts}
    for target, ok, result in (AuditEntry.objects.filter(action=ALERT_MAIL_ACTION, target__in=list(by_target))
                               .order_by("at", "id").values_list("target", "ok", "result")):
        out[by_target[target]] = {"sent": ok, "detail": result}
    return out
    return created


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


# --------------------------------------------------------------------------- forecasts

def price_table():
    """Today's price table (``execution.metering.prices.PriceTable``): the database's
    prices (``pricing_models.price_table``, edited in the admin), and for models it
    does not price, ``settings.TCO_PRICES`` in the prices file format
    (``{"model": {"input": 3, "output": 15, ...}}``, USD per million tokens);
    None when neither prices anything."""
    from execution.metering.prices import PriceTable, PriceTableError

    merged: dict = dict(getattr(settings, "TCO_PRICES", None) or {})
    try:
        with transaction.atomic():  # a savepoint: a missing table must not spoil the caller's transaction
            table = pricing_models.price_table()
        if table.models:
            # The database's prices win; TCO_PRICES prices the models it lacks.
            database = table.to_mapping()
            aliases = {**(merged.pop("aliases", None) or {}), **(database.pop("aliases", None) or {})}
            merged.update(database)
            if aliases:
                merged["aliases"] = aliases
    except (ImportError, LookupError, PriceTableError, DatabaseError) as exc:
        log.debug("no price table in the database: %s", exc)
    return PriceTable.from_mapping(merged) if merged else None


def _task_price(table, model: str, tokens: dict[str, int]) -> Decimal | None:
    """Cost of one task's ``tokens`` (bucket -> count) at today's price of ``model``; None if unpriced."""
    usage = SimpleNamespace(model=None, **{b: int(tokens.get(b) or 0) for b in BUCKETS})
    return table.price(usage, requested_model=model).cost_usd


def forecast(*, agent_definition, count: int, model: str = "") -> dict[str, Any]:
    """Cost forecast of ``count`` tasks from earlier finished runs of ``agent_definition``.

    Median tokens per task x ``count`` x price, with a range from the 10th to
    the 90th percentile. Every finished run counts, also one that used no
    tokens (an agent that calls no model forecasts 0 tokens and $0, not "no
    history"; issue 16, bug 10). Each earlier task is priced at today's price
    of ``model`` when the price table (``price_table``) has it, else at the
    cost metering recorded for it (a run without tokens costs $0).
    Returns ``{"history": n tasks, "no_history": bool, "count", "tokens_per_task":
    {p10, p50, p90}, "tokens": {p10, p50, p90} (x count), "metered_history":
    runs that used tokens, "cost_per_task": {p10, p50, p90} (Decimal USD) |
    None, "cost_usd": {p10, p50, p90} | None (x count), "priced_by": "price
    table" | "recorded cost" | None, "unpriced_history": n, "duration_s":
    {p10, p50, p90} (wall clock seconds per task) | None, "slots": {p10, p50,
    p90} slots per task}``; the token and cost figures are None when there is no history.
    """
    history = list(
        Task.objects.filter(campaign__agent_definition=agent_definition, state__in=("done", "failed"))
        .order_by("-ended_at", "-id")
        .values(*BUCKETS, "cost_usd", "wallclock_s", "slots")[:FORECAST_HISTORY]
    )
    result: dict[str, Any] = {"history": len(history), "no_history": not history, "count": count,
                              "tokens_per_task": None, "tokens": None, "cost_per_task": None, "cost_usd": None,
                              "priced_by": None, "unpriced_history": 0, "model": model, "metered_history": 0,
                              "duration_s": None}
    if not history:
        return result
    for h in history:
        h["total"] = sum(int(h[b] or 0) for b in BUCKETS)
        if h["total"] == 0 and h["cost_usd"] is None:
            h["cost_usd"] = ZERO  # no tokens: nothing to pay, not an unknown cost
    result["metered_history"] = sum(1 for h in history if h["total"])
    durations = sorted(float(h["wallclock_s"]) for h in history if h["wallclock_s"] is not None)
    if durations:
        result["duration_s"] = {name: quantile(durations, q) for name, q in (("p10", 0.1), ("p50", 0.5),
                                                                              ("p90", 0.9))}
    tokens = sorted(h["total"] for h in history)
    per_task = {name: quantile(tokens, q) for name, q in (("p10", 0.1), ("p50", 0.5), ("p90", 0.9))}
    result["tokens_per_task"] = {k: int(round(v)) for k, v in per_task.items()}
    result["tokens"] = {k: int(round(v * count)) for k, v in per_task.items()}
    table = price_table() if model else None
    priced = [_task_price(table, model, h) for h in history] if table is not None else []
    if priced and all(cost is not None for cost in priced):
        costs = sorted(priced)
        result["priced_by"] = "price table"
    else:
        costs = sorted(h["cost_usd"] for h in history if h["cost_usd"] is not None)
        result["unpriced_history"] = len(history) - len(costs)
        result["priced_by"] = "recorded cost" if costs else None
    if costs:
        cents = Decimal("0.000001")
        per = {name: quantile(costs, q) for name, q in (("p10", 0.1), ("p50", 0.5), ("p90", 0.9))}
        result["cost_per_task"] = {k: v.quantize(cents) for k, v in per.items()}
        result["cost_usd"] = {k: (v * count).quantize(cents) for k, v in per.items()}
    return result
