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
from typing import Any, Iterable, Sequence

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
from dashboards.core.chunks import in_chunks
from dashboards.core.errors import BillError
from dashboards.models import AccountingRecord, Cluster, Task, Team
from execution.spool.contract import TOKEN_BUCKETS

#: Disjoint token buckets (DESIGN.md, "Token metering and cost"); reasoning is part of output.
BUCKETS = TOKEN_BUCKETS
BUCKET_LABELS = {
    "input_tokens": "input",
    "cache_read_tokens": "cache read",
    "cache_write_5m_tokens": "cache w. 5m",
    "cache_write_1h_tokens": "cache w. 1h",
    "output_tokens": "output",
}
GROUPS = ("team", "model", "campaign", "launcher", "cluster")
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


def model_expr(prefix: str):
    """The model a task ran, as a query expression: its campaign's ``model``, else the agent
    definition's ``default_model``, else :data:`UNSPECIFIED_MODEL`. ``prefix``: the lookup path from
    the queried model to the task (``""`` on ``Task``, ``"task__"`` on a task's rows)."""
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
         launcher: str = "", from_detail: bool = False, with_campaigns: bool = False) -> dict[str, Any]:
    """A bill: usage per period and team (and model or campaign) for local days ``first``..``last``.

    ``period`` is ``day``, ``week`` or ``month``; ``first`` and ``last`` are
    widened to whole periods. ``group_by`` is ``team`` (one row per team and
    period), ``model`` (the campaign's model, else the agent definition's
    default model), ``campaign``, ``launcher`` (who launched the campaign) or
    ``cluster`` (where it ran; ``clusters`` narrows the bill to some).
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

    The sums come from the hourly rollups kept at ingest (``UsageRollup``) and,
    for tasks still active, from the detail rows; a cluster whose periods do
    not start on whole UTC hours (a zone with a half-hour offset), or
    ``from_detail``, is summed from the detail rows alone (the same figures:
    ``tests/unit/test_rollups.py``).

    ``with_campaigns``: the result also holds ``"by_campaign"``, the same bill grouped by campaign (a
    copy of the result when ``group_by`` is ``campaign``), from the same reads: the usage is read once per
    campaign and summed into ``group_by``'s rows here (a campaign has one team, model, launcher and
    cluster), so the bill page's costliest campaign beside a bill grouped otherwise costs no second
    bill. Sums are the same as two bills' (wall clock and slot-seconds up to float rounding).
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
    tz_names = sorted({c.time_zone or "UTC" for c in clusters}) or [settings.TCO_CLUSTER_TZ]
    # Read per campaign when the campaigns' bill is wanted beside another grouping; then each cluster's
    # rows are kept apart (a cluster grouping's key) and summed into the grouping below.
    grain = "campaign" if with_campaigns else group_by
    shared: dict[tuple, dict[str, Any]] = {}
    per_cluster: list[tuple[str, dict[tuple, dict[str, Any]]]] = []
    for cluster in clusters if team_of else ():
        tz = cluster_zone(cluster)
        starts = [local_midnight(day, tz) for day in period_starts(first, end_day, period)]
        rows = shared if grain == group_by else {}
        _accumulate(rows, cluster=cluster, begin=starts[0], end=local_midnight(end_day, tz),
                    projects=list(team_of), group_by=grain, period=period, tz=tz,
                    boundaries=starts, only={"campaign": campaign, "model": model, "launcher": launcher},
                    detail=from_detail)
        per_cluster.append((cluster.name, rows))

    info = _campaign_info({k[3] for _name, rows in per_cluster for k in rows if k[3] is not None and k[2]},
                          keys=group_by in ("model", "launcher")) if grain == "campaign" else {}
    labels = {pk: facts["label"] for pk, facts in info.items()}
    shape = {"team_of": team_of, "period": period, "first": first, "end_day": end_day, "tz_names": tz_names}
    if grain == group_by:
        result = _bill_result(shared, group_by=group_by, labels=labels, **shape)
    else:
        result = _bill_result(_regroup(per_cluster, group_by, info), group_by=group_by, labels=labels, **shape)
    if with_campaigns:
        # A copy when the bill is so grouped itself (no dict holding itself: the result stays serialisable).
        result["by_campaign"] = dict(result) if group_by == "campaign" else _bill_result(
            _regroup(per_cluster, "campaign", info), group_by="campaign", labels=labels, **shape)
    return result


def _campaign_info(ids: set[int], *, keys: bool) -> dict[int, dict[str, Any]]:
    """``{campaign pk: {"label": "name (#pk)", "model", "launcher"}}`` for ``ids``, read in chunks;
    ``keys`` False reads the labels alone (``model`` and ``launcher`` are then None). The model is
    the campaign's as :func:`model_expr` names it, the launcher the user name (None without one)."""
    from dashboards.models import Campaign

    info: dict[int, dict[str, Any]] = {}
    for chunk in in_chunks(sorted(ids)):
        found = Campaign.objects.filter(pk__in=chunk)
        if keys:
            found = found.annotate(m=_campaign_model()).values_list("pk", "name", "m", "launched_by__username")
        else:
            found = found.values_list("pk", "name")
        for pk, name, *rest in found:
            model, launcher = rest if keys else (None, None)
            info[pk] = {"label": f"{name} (#{pk})", "model": model, "launcher": launcher}
    return info


def _regroup(per_cluster: Sequence[tuple[str, dict[tuple, dict[str, Any]]]], group_by: str,
             info: dict[int, dict[str, Any]]) -> dict[tuple, dict[str, Any]]:
    """Rows read per campaign (each cluster's, keyed ``(period, project, launched_by_tco, campaign pk |
    None)``) summed into the rows of ``group_by``, keyed as :func:`_accumulate` keys them: no key for a
    team, the campaign's model or launcher (``info``: :func:`_campaign_info`), the cluster's name. Usage
    tco did not launch keeps no key in every grouping, as there."""
    out: dict[tuple, dict[str, Any]] = {}
    for cluster_name, rows in per_cluster:
        for (p, project, launched, pk), row in rows.items():
            if not launched or group_by == "team":
                key = None
            elif group_by == "campaign":
                key = pk
            elif group_by == "cluster":
                key = cluster_name
            else:
                key = (info.get(pk) or {}).get(group_by)
            target = out.get((p, project, launched, key))
            if target is None:
                target = out[(p, project, launched, key)] = _empty_row(p, project, key)
                target["launched_by_tco"] = launched
            _add_row(target, row)
    return out


def _bill_result(rows: dict[tuple, dict[str, Any]], *, group_by: str, labels: dict[Any, str],
                 team_of: dict[str, Team], period: str, first: dt.date, end_day: dt.date,
                 tz_names: list[str]) -> dict[str, Any]:
    """:func:`bill`'s answer from its rows (keyed as :func:`_accumulate` keys them): each row labelled
    and named by team, sorted, with the totals of tco's usage and of the rest. ``labels``: a campaign
    pk's label (``group_by`` campaign)."""
    out = []
    for (p, project, launched, key), row in rows.items():
        team = team_of.get(project)
        row["team"] = team.name if team else project
        if not launched:
            row["label"] = NOT_TCO
        elif group_by == "team":
            row["label"] = row["team"]
        elif group_by in ("model", "launcher", "cluster"):
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
        qs = qs.annotate(only_model=model_expr(prefix)).filter(only_model=only["model"])
    return qs


def period_starts(first: dt.date, end_day: dt.date, period: str) -> list[dt.date]:
    """The first local day of each period from ``first`` (a period's start) up to ``end_day``
    (excluded), then ``end_day``: every boundary a bill cuts at."""
    days, cursor = [], first
    while cursor < end_day:
        days.append(cursor)
        cursor = next_period_start(cursor, period)
    days.append(end_day)
    return days


def whole_hour(moment: dt.datetime) -> bool:
    """Whether ``moment`` starts a UTC hour (its zone's offset is whole hours): where the rollups serve."""
    return moment.minute == 0 and moment.second == 0 and moment.microsecond == 0 and (
        moment.utcoffset() is None or moment.utcoffset().total_seconds() % 3600 == 0)


def _accumulate(rows: dict[tuple, dict[str, Any]], *, cluster: Cluster, begin: dt.datetime, end: dt.datetime,
                projects: list[str], group_by: str, period: str | None = None, tz: dt.tzinfo | None = None,
                boundaries: Sequence[dt.datetime] = (), only: dict[str, Any] | None = None,
                detail: bool = False) -> None:
    """Add the usage started in ``[begin, end)`` on ``cluster`` to ``rows``, the one definition of a team's usage.

    ``rows`` is keyed ``(period date | None, project, launched_by_tco, group
    key | None)``. A team's usage is what tco launched for it: the tasks of
    its campaigns and their accounting records. Anything else run under the
    team's project (a ``qsub -P <project>`` by another account) is kept apart
    with ``launched_by_tco`` False, never in the team's sums, and counted from
    its accounting records only: tasks = finished tasks = records (the task
    rows of such jobs come and go with qstat polls; a job tco only saw in
    qstat has no record and is not usage until it ends). ``period`` (in
    ``tz``) cuts periods at ``boundaries``; None gives one row per key with
    period None.

    The whole UTC hours inside ``[begin, end)`` are read from the rollups
    (``UsageRollup``: every accounting record and every ended task) plus the
    active tasks' detail rows; the part of an hour at either end from the
    detail rows. When a period boundary falls inside an hour (a zone with a
    half-hour offset), or with ``detail``, everything comes from the detail rows.
    """
    trunc = (lambda column: Trunc(column, period, output_field=DateField(), tzinfo=tz)) if period else None
    if detail or not all(whole_hour(b) for b in boundaries):
        _records_detail(rows, cluster=cluster, begin=begin, end=end, projects=projects, group_by=group_by,
                        trunc=trunc, only=only)
        _tasks_detail(rows, cluster=cluster, begin=begin, end=end, projects=projects, group_by=group_by,
                      trunc=trunc, only=only)
        return
    low = _hour_ceil(begin)
    high = max(_hour_floor(end), low)
    if low >= end:  # less than an hour, inside one hour
        low = high = begin
    for a, b in ((begin, min(low, end)), (max(high, begin), end)):
        if a < b:
            _check_retained(cluster, a)
            _records_detail(rows, cluster=cluster, begin=a, end=b, projects=projects, group_by=group_by,
                            trunc=trunc, only=only)
            _tasks_detail(rows, cluster=cluster, begin=a, end=b, projects=projects, group_by=group_by,
                          trunc=trunc, only=only)
    if low < high:
        _rollups(rows, cluster=cluster, begin=low, end=high, projects=projects, group_by=group_by, trunc=trunc,
                 only=only, boundaries=boundaries)
        _tasks_detail(rows, cluster=cluster, begin=low, end=high, projects=projects, group_by=group_by,
                      trunc=trunc, only=only, active=True)


def _hour_floor(moment: dt.datetime) -> dt.datetime:
    return moment.astimezone(dt.timezone.utc).replace(minute=0, second=0, microsecond=0)


def _hour_ceil(moment: dt.datetime) -> dt.datetime:
    floor = _hour_floor(moment)
    return floor if floor == moment else floor + dt.timedelta(hours=1)


def _check_retained(cluster: Cluster, moment: dt.datetime) -> None:
    """Refuse a part of an hour whose detail rows were dropped (``TCO_DETAIL_RETENTION_DAYS``)."""
    dropped = cluster.detail_dropped_before
    if dropped is not None and moment < dropped:
        raise BillError(f"usage before {dropped:%Y-%m-%d %H:%M} UTC on cluster {cluster.name} is kept per hour only: "
                        "start and end on whole hours")


def _records_detail(rows: dict[tuple, dict[str, Any]], *, cluster: Cluster, begin: dt.datetime, end: dt.datetime,
                    projects: list[str], group_by: str, trunc, only: dict[str, Any] | None) -> None:
    """Wall clock and slot-seconds of every accounting record started in ``[begin, end)``, as qacct sums them."""
    records = (AccountingRecord.objects.filter(cluster=cluster, started_at__gte=begin, started_at__lt=end)
               .annotate(tp=Coalesce(F("task__campaign__team__project"), F("project")),
                         tco=_launched_by_tco("task__"))
               .filter(tp__in=projects))
    records = _only(records, only, "task__")
    records, key_fields = _grouped(records, group_by=group_by, trunc=trunc and trunc("started_at"), prefix="task__",
                                   cluster=cluster)
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


def _tasks_detail(rows: dict[tuple, dict[str, Any]], *, cluster: Cluster, begin: dt.datetime, end: dt.datetime,
                  projects: list[str], group_by: str, trunc, only: dict[str, Any] | None,
                  active: bool | None = None) -> None:
    """Tasks, tokens and cost of tco's campaigns: tasks, by the start of their (last) run, in
    their campaign's team (jobs tco did not launch are counted from their records). ``active``
    True: only the tasks still active (those the rollups do not hold yet)."""
    tasks = Task.objects.filter(cluster=cluster, campaign__isnull=False, started_at__gte=begin, started_at__lt=end)
    if active is not None:
        tasks = tasks.filter(active=active)
    tasks = tasks.annotate(tp=F("campaign__team__project"), tco=_launched_by_tco("")).filter(tp__in=projects)
    tasks = _only(tasks, only, "")
    tasks, task_fields = _grouped(tasks, group_by=group_by, trunc=trunc and trunc("started_at"), prefix="",
                                  cluster=cluster)
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


def _rollups(rows: dict[tuple, dict[str, Any]], *, cluster: Cluster, begin: dt.datetime, end: dt.datetime,
             projects: list[str], group_by: str, trunc, only: dict[str, Any] | None,
             boundaries: Sequence[dt.datetime] = ()) -> None:
    """Add the rollups of the whole hours ``[begin, end)``: every accounting record, and every task
    of tco's campaigns that ended (``UsageRollup``; the whole UTC days between two ``boundaries``
    from ``UsageDayRollup``, ``billing.grains``). A campaign's team, model and launcher are
    the campaign's own, read here as the detail rows' query joins them."""
    from dashboards.billing.grains import rollup_sets
    from dashboards.models import Campaign, UsageRollup
    from dashboards.rollup_models import SUMS, UsageDayRollup

    campaigns = Campaign.objects.filter(team__project__in=projects)
    only = only or {}
    if only.get("campaign"):
        campaigns = campaigns.filter(pk=only["campaign"])
    if only.get("launcher"):
        campaigns = campaigns.filter(launched_by__username=only["launcher"])
    if only.get("model"):
        campaigns = campaigns.annotate(only_model=_campaign_model()).filter(only_model=only["model"])
    # Two reads per grain, each one an index serves: the campaigns' rows, and those of jobs tco did not launch.
    parts = []
    for stored, field in rollup_sets(UsageRollup, UsageDayRollup, cluster=cluster, begin=begin, end=end,
                                     boundaries=boundaries):
        parts.append((stored.filter(campaign_id__in=campaigns.values("pk")), field))
        if not any(only.get(k) for k in ("campaign", "launcher", "model")):
            parts.append((stored.filter(campaign_id=0, project__in=projects), field))
    fields = ["campaign_id", "project"]
    items = []
    for found, field in parts:
        if trunc is not None:
            found = found.annotate(p=trunc(field))
        items += found.values(*fields, *(["p"] if trunc is not None else [])).annotate(
            **{f"s_{s}": Sum(s) for s in SUMS}).order_by()
    info = {}
    ids = sorted({item["campaign_id"] for item in items if item["campaign_id"]})
    for chunk in in_chunks(ids):
        for pk, project, model, launcher in (Campaign.objects.filter(pk__in=chunk)
                                             .annotate(m=_campaign_model())
                                             .values_list("pk", "team__project", "m", "launched_by__username")):
            info[pk] = (project, {"model": model, "campaign": pk, "launcher": launcher,
                                  "cluster": cluster.name}.get(group_by))
    for item in items:
        sums = {s: int(item[f"s_{s}"] or 0) for s in SUMS}
        tco = bool(item["campaign_id"])
        if tco and item["campaign_id"] not in info:
            continue  # a campaign deleted since: its usage went with it, as its tasks did
        project, key = info[item["campaign_id"]] if tco else (item["project"], None)
        row = _row_for(rows, {"tp": project, "tco": tco, "k": key, "p": item.get("p")})
        row["records"] += sums["records"]
        row["wallclock_s"] += sums["wallclock_us"] / 1e6
        row["slot_s"] += sums["slot_us"] / 1e6
        if not tco:
            row["tasks"] += sums["records"]
            row["finished_tasks"] += sums["records"]
            continue
        row["tasks"] += sums["tasks"]
        row["unpriced_tasks"] += sums["unpriced_tasks"]
        row["finished_tasks"] += sums["finished_tasks"]
        row["verdicts"] += sums["verdicts"]
        row["cost_usd"] += Decimal(sums["cost_units"]) / COST_UNITS
        for bucket in (*BUCKETS, "reasoning_tokens"):
            row[bucket] += sums[bucket]
        row["total_tokens"] = sum(row[b] for b in BUCKETS)


def _campaign_model():
    """A campaign's model as bills name it: its own, else its agent definition's default."""
    return Coalesce(NullIf(F("model"), Value("")), NullIf(F("agent_definition__default_model"), Value("")),
                    Value(UNSPECIFIED_MODEL))


def _grouped(qs: QuerySet, *, group_by: str, trunc, prefix: str,
             cluster: Cluster | None = None) -> tuple[QuerySet, list[str]]:
    """``qs`` annotated with the group key ``k`` (model or campaign) and the period ``p``, and the
    fields to group by: ``tp`` (team project), ``tco`` and those. ``prefix`` reaches the task."""
    fields = ["tp", "tco"]
    if group_by == "model":
        qs = qs.annotate(k=model_expr(prefix))
        fields.append("k")
    elif group_by == "campaign":
        qs = qs.annotate(k=F(f"{prefix}campaign_id"))
        fields.append("k")
    elif group_by == "launcher":
        qs = qs.annotate(k=F(f"{prefix}campaign__launched_by__username"))
        fields.append("k")
    elif group_by == "cluster":
        qs = qs.annotate(k=Value(cluster.name if cluster is not None else ""))
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


def _add_row(total: dict[str, Any], row: dict[str, Any]) -> None:
    """Add ``row``'s sums (counts, tokens, cost, wall clock, slot-seconds) to ``total``'s."""
    for field in ("tasks", "records", "reasoning_tokens", "total_tokens", "unpriced_tasks", "finished_tasks",
                  "verdicts", *BUCKETS):
        total[field] += row[field]
    total["cost_usd"] += row["cost_usd"]
    total["wallclock_s"] += row["wallclock_s"]
    total["slot_s"] += row["slot_s"]


def _sum_rows(rows: Iterable[dict[str, Any]]) -> dict[str, Any]:
    total = _empty_row(None, "", None)
    for row in rows:
        _add_row(total, row)
    return total


def usage_by_team(user: AbstractBaseUser, *, since: dt.datetime, until: dt.datetime,
                  from_detail: bool = False) -> dict[str, list[dict[str, Any]]]:
    """Usage started in ``[since, until)`` per team where ``user`` may read bills (``/api/usage/``).

    The same definition as the bill page (``_accumulate``): ``{"teams":
    [row], "not_launched_by_tco": [row]}``, a row ``{team, project, tasks,
    records, finished_tasks (done or failed), wallclock_s, slot_s, input_tokens, cache_read_tokens,
    cache_write_5m_tokens, cache_write_1h_tokens, output_tokens,
    reasoning_tokens, tokens, cost_usd (Decimal USD), unpriced_tasks}``,
    sorted by team. Jobs run under a team's project that tco did not launch
    are in ``not_launched_by_tco``, never in the team's row. The whole hours
    come from the rollups, the parts of an hour at either end from the detail
    rows (``from_detail``: everything from them).
    """
    teams = list(teams_billable_by(user))
    team_of = {t.project: t for t in teams}
    rows: dict[tuple, dict[str, Any]] = {}
    for cluster in Cluster.objects.order_by("name") if team_of else ():
        _accumulate(rows, cluster=cluster, begin=since, end=until, projects=list(team_of), group_by="team",
                    detail=from_detail)
    out: dict[str, list[dict[str, Any]]] = {"teams": [], "not_launched_by_tco": []}
    for (_p, project, launched, _k), row in sorted(rows.items(), key=lambda kv: team_of[kv[0][1]].name):
        out["teams" if launched else "not_launched_by_tco"].append({
            "team": team_of[project].name, "project": project, "tasks": row["tasks"], "records": row["records"],
            "finished_tasks": row["finished_tasks"], "wallclock_s": row["wallclock_s"], "slot_s": row["slot_s"],
            **{f: row[f] for f in (*BUCKETS, "reasoning_tokens")}, "tokens": row["total_tokens"],
            "cost_usd": row["cost_usd"], "unpriced_tasks": row["unpriced_tasks"]})
    return out


def team_spend_between(team: Team, begin: dt.datetime, end: dt.datetime, *, days_tz: dt.tzinfo | None = None
                       ) -> dict[str, Any]:
    """What ``team``'s campaigns cost for tasks started in ``[begin, end)`` on every cluster (budgets):
    ``{"spent_usd": Decimal, "unpriced_tasks": int, "daily": {local date: Decimal}}``; ``daily``
    only with ``days_tz`` (``begin`` and ``end`` are then local midnights there). The bill's own
    sums (``_accumulate``): the rollups, and the detail rows of the active tasks."""
    return teams_spend_between([team], begin, end, days_tz=days_tz)[team.project]


def teams_spend_between(teams: Sequence[Team], begin: dt.datetime, end: dt.datetime, *,
                        days_tz: dt.tzinfo | None = None) -> dict[str, dict[str, Any]]:
    """:func:`team_spend_between` of several teams at once: ``{project: sums}``, one read for all."""
    rows: dict[tuple, dict[str, Any]] = {}
    projects = sorted({t.project for t in teams})
    boundaries: list[dt.datetime] = [begin, end]
    if days_tz is not None:
        first, last = begin.astimezone(days_tz).date(), end.astimezone(days_tz).date()
        boundaries = [local_midnight(day, days_tz) for day in period_starts(first, last, "day")]
    for cluster in Cluster.objects.order_by("name") if projects else ():
        _accumulate(rows, cluster=cluster, begin=begin, end=end, projects=projects, group_by="team",
                    period="day" if days_tz is not None else None, tz=days_tz, boundaries=boundaries)
    out: dict[str, dict[str, Any]] = {p: {"spent_usd": ZERO, "unpriced_tasks": 0, "daily": {}} for p in projects}
    for (day, project, launched, _key), row in rows.items():
        if not launched:
            continue
        sums = out[project]
        sums["spent_usd"] += row["cost_usd"]
        sums["unpriced_tasks"] += row["unpriced_tasks"]
        if day is not None:
            sums["daily"][day] = sums["daily"].get(day, ZERO) + row["cost_usd"]
    return out
