"""Bills per team, campaign, queue or model for a period: wall clock, slot-seconds, tokens and USD.

Units: tokens are integers, money is USD as ``Decimal``, times are seconds
(``wallclock_s`` float, ``slot_s`` = wall clock x slots). Wall clock and
slot-seconds come from ``AccountingRecord`` (every record, as ``qacct`` counts
them), tokens and cost from ``Task``; a team's project is the scheduler's
``-P``. A team's wall clock for a period equals ``qacct -P <project> -b <start>
-e <next start - 1 s>`` in the cluster's time zone (``billing.periods``).
"""
from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any, Iterable, Iterator, Sequence

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
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

from dashboards.billing.periods import (
    MAX_PERIODS,
    PERIODS,
    cluster_zone,
    local_midnight,
    next_period_start,
    period_start,
)
from dashboards.core.errors import BillError
from dashboards.models import AccountingRecord, Cluster, Task, Team
from execution.spool import TOKEN_BUCKETS

#: Disjoint token buckets (DESIGN.md, "Token metering and cost"); reasoning is part of output.
BUCKETS = TOKEN_BUCKETS
BUCKET_LABELS = {
    "input_tokens": "input",
    "cache_read_tokens": "cache read",
    "cache_write_5m_tokens": "cache w. 5m",
    "cache_write_1h_tokens": "cache w. 1h",
    "output_tokens": "output",
}
GROUPS = ("team", "model", "campaign", "launcher")
#: A "successful verdict": a task that ended done and declared a verdict (verdict.json), whatever it says.
SUCCESSFUL_VERDICT = "a task that ended done and declared a verdict (its verdict.json), whatever the verdict says"
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
ZERO = Decimal("0")


# --------------------------------------------------------------------------- bills

def teams_billable_by(user: AbstractBaseUser) -> QuerySet[Team]:
    """Teams whose bills and budgets ``user`` may see (roles.py capability ``bill``)."""
    from dashboards.core.roles import teams_with

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
        from dashboards.models import Campaign

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
    any_tokens = used_tokens_q()
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


def used_tokens_q() -> Q:
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
                .filter(Q(cost_usd__isnull=False) | used_tokens_q())
                .order_by(F("cost_usd").desc(nulls_last=True), "task_number")[:limit])
