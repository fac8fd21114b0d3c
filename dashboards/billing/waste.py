"""Waste on the bill: what failed, what ran again, and model seats held while no model call ran.

Per team and campaign, for local days ``first``..``last`` in the cluster's time
zone, with the bill's definitions (``billing.bills``): a task's dollars count in
the period of its start, slot-seconds are its accounting records' wall clock x
slots (every attempt, as ``qacct`` sums them), records counted in the period of
their own start. Only tco's campaigns: jobs tco did not launch have no metering.

- **failed**: tasks that ended ``failed`` or ``lost`` by the agent, a limit or someone's
  decision (``core.failures``: kinds ``agent``, ``limit``, ``ended``);
- **infrastructure**: tasks that tco's infrastructure failed (``core.failures``, kind
  ``infrastructure``: a lost task or execution host, the scheduler's shepherd, tco's runner
  without a record, tco's metering proxy that never listened, so the agent never reached its
  model API). Shown apart and **not wasted**: a lead cannot cut it by changing the team's agents
  or inputs, and the campaign page's retry of the infrastructure's failures runs them again. Its
  dollars and slot-seconds stay in **spent**, as on the bill: finance pays for them all the same
  (a proxy that never started metered no model call, so those tasks have slot-seconds and no
  dollars);
- **verdict failed**: tasks that ended ``done`` and declared a failing verdict
  (:data:`FAILING_VERDICTS`, ``TCO_FAILING_VERDICTS``; case does not matter);
- **retries**: what ran again: the tasks of retry campaigns (``campaign_retry``) and
  the earlier attempts of tasks the scheduler ran again (every accounting record of a
  task but its last: a rerun after a lost host, a failed start). The runner meters one
  attempt per task, so earlier attempts have slot-seconds but no dollars;
- **wasted**: failed + verdict failed + the earlier attempts of the other tasks; each
  dollar and slot-second once. A retry campaign's own tasks are not wasted (they redo
  failed work; those that fail again are under failed). The infrastructure's failures and
  their earlier attempts are not wasted (they are under infrastructure).

Model seats (the ``TCO_SEAT_RESOURCE`` consumable, ``seats_per_task`` per task) per
campaign: **held** is each accounting record's wall clock x seats per task;
**in calls** is, per task, the union of its model requests' intervals (the metering
proxy's start ``at`` and ``latency_ms``; parallel requests of one task count once)
x seats per task. The peaks come from the same intervals: the most seats held at
once, and the most seats whose task was in a model call at once; the **suggested**
consumable size is that peak plus :data:`SEAT_HEADROOM` (``TCO_SEAT_HEADROOM``),
rounded up. Runner records keep at most ``TCO_REQUESTS_KEPT_PER_TASK`` request rows
per task: a task flagged ``requests_not_kept`` makes its campaign's in-call figures
a lower bound (``partial``).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import math
from decimal import Decimal
from typing import Any, Iterable, Sequence

from django.conf import settings
from django.db import connection
from django.db.models import (BigIntegerField, Count, Exists, ExpressionWrapper, F, FloatField, Func, OuterRef,
                              Q, Sum)
from django.db.models.functions import Round

from dashboards.billing.bills import COST_UNITS, used_tokens_q, whole_hour
from dashboards.billing.grains import rollup_sets
from dashboards.billing.periods import cluster_zone, local_midnight
from dashboards.core.errors import BillError
from dashboards.core.failures import infrastructure_sql
from dashboards.core.chunks import in_chunks
from dashboards.models import AccountingRecord, Campaign, Cluster, ModelRequest, Task, Team, WasteRollup
from dashboards.rollup_models import WASTE_RECORD_SUMS, WASTE_SUMS, WASTE_TASK_SUMS, WasteDayRollup

#: Verdicts (lower case) that say the agent's own work failed; ``TCO_FAILING_VERDICTS`` overrides. Not
#: "bad" or "rejected": a review agent's "bad" is its finding about the run it reviewed, work done.
FAILING_VERDICTS = ("fail", "failed", "failure", "error", "incorrect", "wrong", "unresolved")
#: Headroom over the in-call peak in the suggested seat count (0.15: 41 in calls -> 48 seats).
SEAT_HEADROOM = 0.15
#: At most this many days in one waste view (a year, as the bill's 400 daily periods).
MAX_DAYS = 400
FAILED_STATES = ("failed", "lost")
CATEGORIES = ("failed", "verdict_failed", "infrastructure", "retries", "wasted")
ZERO = Decimal(0)
#: The page's words for each figure (said under the tables and in the CSV's header note).
DEFINITIONS = {
    "failed": "tasks that ended failed or lost by the agent, a limit or a deletion (not the infrastructure's)",
    "infrastructure": ("tasks that tco's infrastructure failed: a lost host, the scheduler, tco's runner, or tco's "
                       "metering proxy that did not start (the agent never reached its model API); on the bill, "
                       "not wasted: the campaign page's retry of the infrastructure's failures runs them again"),
    "verdict_failed": "tasks that ended done with a failing verdict ({verdicts})",
    "retries": ("tasks of retry campaigns, and the earlier attempts of tasks the scheduler ran again "
                "(slot-seconds only: the runner meters one attempt per task)"),
    "wasted": ("failed + verdict failed + the earlier attempts of the other tasks, each once; a retry "
               "campaign's own tasks are not wasted (they redo failed work), nor are the infrastructure's failures"),
    "seats": ("held: each task's run time (accounting wall clock) x seats per task; in calls: the time its "
              "model requests were open (parallel requests count once) x seats per task"),
}


def failing_verdicts() -> tuple[str, ...]:
    """The failing verdicts in force, lower case."""
    return tuple(v.strip().lower() for v in getattr(settings, "TCO_FAILING_VERDICTS", FAILING_VERDICTS) if v.strip())


def seat_headroom() -> float:
    return float(getattr(settings, "TCO_SEAT_HEADROOM", SEAT_HEADROOM))


#: The most tasks whose model seat figures one waste view computes (``TCO_WASTE_SEAT_TASKS``; 0: no limit).
SEAT_TASKS = 1000


#: The most tasks (and records of jobs tco did not launch) a bill may count for the bills page to
#: show its waste figures beside it (``TCO_BILL_WASTE_TASKS``; 0: no limit).
BILL_TASKS = 20000


def bill_task_limit() -> int:
    """The most tasks a bill counts for the bills page to add its waste figures; 0 is no limit.

    The waste figures are summed from the waste rollups (and the active tasks' detail rows), as
    the bill is from the usage rollups; before those (issue 26) a month of 178,000 tasks took 2.4 s
    from the detail rows on the loaded bench host (``bench/bench_history.py``)."""
    return int(getattr(settings, "TCO_BILL_WASTE_TASKS", BILL_TASKS))


def seat_task_limit() -> int:
    """The most tasks a waste view reads the model requests of (the seat figures); 0 is no limit.

    The in-call figures and the peaks come from every model request and accounting record of the
    range, in Python: about 10 requests a task. On the bench host, loaded, a team's week (800 tasks)
    took 0.4 s with them, its month (4,000 tasks) 2.4 s, and a busy site's month (170,000 tasks, 1.7
    million requests) 16 s (``bench/bench_history.py``, 2026-12-02)."""
    return int(getattr(settings, "TCO_WASTE_SEAT_TASKS", SEAT_TASKS))


@dataclasses.dataclass
class Spend:
    """Tasks, dollars and slot-seconds of one category (``unpriced``: tasks with tokens and no cost)."""

    tasks: int = 0
    cost_usd: Decimal = ZERO
    unpriced: int = 0
    slot_s: float = 0.0
    attempts: int = 0  # earlier attempts (accounting records) counted here, slot-seconds only

    def add_task(self, cost: Decimal | None, has_tokens: bool) -> None:
        self.tasks += 1
        if cost is not None:
            self.cost_usd += cost
        elif has_tokens:
            self.unpriced += 1

    def add(self, other: "Spend") -> None:
        self.tasks += other.tasks
        self.cost_usd += other.cost_usd
        self.unpriced += other.unpriced
        self.slot_s += other.slot_s
        self.attempts += other.attempts

    def as_dict(self) -> dict[str, Any]:
        return {"tasks": self.tasks, "cost_usd": self.cost_usd, "unpriced": self.unpriced, "slot_s": self.slot_s,
                "slot_hours": self.slot_s / 3600, "attempts": self.attempts}


@dataclasses.dataclass
class Seats:
    """Model seats of one campaign (or of several: the peaks are then of their intervals together)."""

    held_s: float = 0.0          # seat-seconds held
    in_calls_s: float = 0.0      # seat-seconds whose task was in a model call
    requests: int = 0
    tasks: int = 0               # tasks with a run time
    partial: bool = False        # some requests were not kept as rows: in-call figures are a lower bound
    held: list[tuple[float, float, int]] = dataclasses.field(default_factory=list)   # (start, end, seats)
    calls: list[tuple[float, float, int]] = dataclasses.field(default_factory=list)  # merged, per task

    def add(self, other: "Seats") -> None:
        self.held_s += other.held_s
        self.in_calls_s += other.in_calls_s
        self.requests += other.requests
        self.tasks += other.tasks
        self.partial = self.partial or other.partial
        self.held.extend(other.held)
        self.calls.extend(other.calls)

    def as_dict(self) -> dict[str, Any]:
        peak_held, peak_calls = peak(self.held), peak(self.calls)
        suggested = math.ceil(peak_calls * (1 + seat_headroom()) - 1e-9) if peak_calls else 0
        utilization = self.in_calls_s / self.held_s if self.held_s else None
        return {"held_s": self.held_s, "held_hours": self.held_s / 3600, "in_calls_s": self.in_calls_s,
                "in_calls_hours": self.in_calls_s / 3600, "utilization": utilization, "requests": self.requests,
                "tasks": self.tasks, "partial": self.partial, "peak_held": peak_held, "peak_in_calls": peak_calls,
                "suggested": suggested, "text": sizing_text(peak_held, peak_calls, suggested)}


def sizing_text(peak_held: int, peak_calls: int, suggested: int) -> str:
    """The consumable sizing in words: "96 seats held, at most 41 in calls at once: 48 would have done"."""
    if not peak_held:
        return "no seats held"
    held = f"{peak_held} seat{'s' if peak_held != 1 else ''} held"
    if not peak_calls:
        return f"{held}, none in a model call"
    if suggested >= peak_held:
        return f"{held}, at most {peak_calls} in calls at once: about right"
    return f"{held}, at most {peak_calls} in calls at once: {suggested} would have done"


def peak(intervals: Iterable[tuple[float, float, int]]) -> int:
    """The largest sum of weights of ``(start, end, weight)`` intervals open at one moment.
    Intervals are half-open: one that ends when another starts does not overlap it."""
    events: list[tuple[float, int]] = []
    for start, end, weight in intervals:
        if end > start and weight:
            events.append((start, weight))
            events.append((end, -weight))
    events.sort(key=lambda e: (e[0], e[1]))  # at one moment, ends (negative) before starts
    best = now = 0
    for _, change in events:
        now += change
        best = max(best, now)
    return best


def merged(intervals: Iterable[tuple[float, float]]) -> list[tuple[float, float]]:
    """The union of ``(start, end)`` intervals as sorted, disjoint intervals."""
    out: list[list[float]] = []
    for start, end in sorted(intervals):
        if out and start <= out[-1][1]:
            out[-1][1] = max(out[-1][1], end)
        else:
            out.append([start, end])
    return [(a, b) for a, b in out]


def _campaign_row(campaign: dict[str, Any]) -> dict[str, Any]:
    return {"campaign_id": campaign["id"], "campaign": campaign["name"], "team": campaign["team__name"],
            "project": campaign["team__project"], "retry_of": campaign["retry_of_id"],
            "seats_per_task": campaign["seats_per_task"], "spent": Spend(),
            **{c: Spend() for c in CATEGORIES}, "seat": Seats()}


def waste(*, teams: Iterable[Team], first: dt.date, last: dt.date, clusters: Sequence[Cluster] | None = None,
          campaign: int | None = None, seats: bool = True, seat_limit: int = 0,
          from_detail: bool = False) -> dict[str, Any]:
    """Waste of ``teams``' campaigns whose tasks started on local days ``first``..``last`` (module doc).

    ``campaign`` narrows it to one campaign (id); ``seats`` False leaves the model-seat figures out
    (they read every model request); ``seat_limit`` > 0 leaves them out too when more tasks than that
    started in the range (``"seats_skipped"`` then says how many did, else 0). Returns ``{"first", "last",
    "time_zone", "failing_verdicts", "seats_skipped",
    "headroom", "definitions", "rows": [row], "teams": [team row], "totals": row}``: a row is
    ``{"campaign_id", "campaign", "team", "project", "retry_of", "seats_per_task", "spent",
    "failed", "verdict_failed", "infrastructure", "retries", "wasted"`` (each ``{"tasks", "cost_usd" (Decimal USD),
    "unpriced", "slot_s", "slot_hours", "attempts"}``; ``spent`` is everything, as on the bill),
    ``"wasted_share"`` (wasted / spent USD, None without spend), ``"seat"`` (``{"held_s",
    "in_calls_s", "utilization", "requests", "tasks", "partial", "peak_held", "peak_in_calls",
    "suggested", "text"}``, seat-seconds and seats) | None}``, sorted by team, then wasted dollars
    (most first). A team row has ``"team"``, ``"project"`` and the same sums over its campaigns;
    its seat peaks are of its campaigns' intervals together (one consumable). Raises
    ``BillError`` for a bad range.

    The sums come from the waste rollups kept at ingest (``WasteRollup``, per hour, campaign, end
    state, verdict and attempt; the failing verdicts applied here) plus the detail rows of the
    tasks still active, where the range's local midnights are whole UTC hours; else, or with
    ``from_detail``, from the detail rows alone (the same figures: ``tests/db/test_rollups.py``).
    The seat figures always read the detail rows (model requests and records).
    """
    if last < first:
        raise BillError("the last day is before the first day")
    if (last - first).days + 1 > MAX_DAYS:
        raise BillError(f"the waste view covers at most {MAX_DAYS} days")
    teams = list(teams)
    clusters = list(clusters) if clusters is not None else list(Cluster.objects.order_by("name"))
    verdicts = failing_verdicts()
    rows: dict[int, dict[str, Any]] = {}
    zones = sorted({c.time_zone or "UTC" for c in clusters}) or [settings.TCO_CLUSTER_TZ]
    spans = []
    for cluster in clusters if teams else ():
        tz = cluster_zone(cluster)
        begin, end = local_midnight(first, tz), local_midnight(last + dt.timedelta(days=1), tz)
        spans.append((cluster, begin, end))
        _accumulate(rows, cluster=cluster, begin=begin, end=end, teams=teams, campaign=campaign,
                    verdicts=verdicts, detail=from_detail)
    skipped = 0
    if seats and seat_limit > 0:
        # Tasks started in the range: the sums just made count them (no read of the detail rows).
        started = sum(r["spent"].tasks for r in rows.values())
        if started > seat_limit:
            seats, skipped = False, started
    if seats:
        for cluster, begin, end in spans:
            _seats(rows, cluster=cluster, begin=begin, end=end, campaigns=_campaigns(cluster, teams, campaign))
    out = sorted(rows.values(), key=lambda r: (r["team"], -r["wasted"].cost_usd, -r["wasted"].slot_s,
                                                r["campaign_id"]))
    team_rows: dict[str, dict[str, Any]] = {}
    totals = _sum_row({"team": "", "project": ""})
    for row in out:
        team = team_rows.setdefault(row["project"], _sum_row({"team": row["team"], "project": row["project"]}))
        for target in (team, totals):
            for name in ("spent", *CATEGORIES):
                target[name].add(row[name])
            target["seat"].add(row["seat"])
    return {"first": first, "last": last, "time_zone": ", ".join(zones), "failing_verdicts": verdicts,
            "seats_skipped": skipped,
            "headroom": seat_headroom(), "definitions": {k: v.format(verdicts=", ".join(verdicts))
                                                          for k, v in DEFINITIONS.items()},
            "rows": [_finished(r, seats) for r in out], "teams": [_finished(t, seats) for t in team_rows.values()],
            "totals": _finished(totals, seats)}


def _sum_row(row: dict[str, Any]) -> dict[str, Any]:
    return {**row, "spent": Spend(), **{c: Spend() for c in CATEGORIES}, "seat": Seats()}


def _finished(row: dict[str, Any], seats: bool) -> dict[str, Any]:
    out = {k: v for k, v in row.items() if not isinstance(v, (Spend, Seats))}
    for name in ("spent", *CATEGORIES):
        out[name] = row[name].as_dict()
    spent, wasted = row["spent"].cost_usd, row["wasted"].cost_usd
    out["wasted_share"] = (wasted / spent) if spent else None
    out["wasted_slot_share"] = (row["wasted"].slot_s / row["spent"].slot_s) if row["spent"].slot_s else None
    out["seat"] = row["seat"].as_dict() if seats else None
    return out


def _campaigns(cluster: Cluster, teams: list[Team], campaign: int | None):
    """``teams``' campaigns on ``cluster`` (or the one ``campaign`` of theirs), a queryset."""
    campaigns = Campaign.objects.filter(cluster=cluster, team__in=teams)
    return campaigns.filter(pk=campaign) if campaign else campaigns


def _accumulate(rows: dict[int, dict[str, Any]], *, cluster: Cluster, begin: dt.datetime, end: dt.datetime,
                teams: list[Team], campaign: int | None, verdicts: tuple[str, ...], detail: bool = False) -> None:
    """Add the tasks and accounting records of ``cluster`` that started in ``[begin, end)`` to ``rows``:
    from the waste rollups and the active tasks' detail rows where ``begin`` and ``end`` are whole
    UTC hours, else (or with ``detail``) from the detail rows."""
    campaigns = _campaigns(cluster, teams, campaign)
    info = {c["id"]: c for c in campaigns.values("id", "name", "team__name", "team__project", "retry_of_id",
                                                  "seats_per_task")}
    if not info:
        return

    def row_of(campaign_id: int) -> dict[str, Any]:
        row = rows.get(campaign_id)
        if row is None:
            row = rows[campaign_id] = _campaign_row(info[campaign_id])
        return row

    ids = campaigns.values("id")  # a subquery: no list of ids that could pass SQLite's variable limit
    if detail or not (whole_hour(begin) and whole_hour(end)):
        task_groups = _task_groups(cluster, ids, begin, end)
        record_groups = _record_groups(cluster, ids, begin, end)
    else:
        task_groups, record_groups = _rollup_groups(cluster, ids, begin, end)
        # The tasks still active are not in the rollups, nor are their records (the partial index
        # task_active_started finds them; their records by task).
        active = list(Task.objects.filter(cluster=cluster, active=True, campaign_id__in=ids)
                      .values_list("id", flat=True))
        task_groups += _task_groups(cluster, ids, begin, end, active=True)
        for chunk in in_chunks(sorted(active)):
            record_groups += _record_groups(cluster, ids, begin, end, task_ids=chunk)

    # Dollars: each task in the period of its start (the bill's rule); each group's category decided here.
    for campaign_id, state, verdict, infrastructure, n, unpriced, cost_units in task_groups:
        if campaign_id not in info:
            continue
        row = row_of(campaign_id)
        spend = Spend(tasks=n, cost_usd=Decimal(cost_units) / COST_UNITS, unpriced=unpriced)
        row["spent"].add(spend)
        kind = _kind(state, verdict, infrastructure, verdicts)
        if kind:
            row[kind].add(spend)
        if kind in WASTED_KINDS:
            row["wasted"].add(spend)
        if row["retry_of"]:
            row["retries"].add(spend)

    # Slot-seconds and held seats: every accounting record, in the period of its own start, by its
    # campaign, its task's state, verdict and whether the infrastructure failed it, and whether it is
    # an earlier attempt (a later record of the same task exists, wherever that one started).
    for campaign_id, state, verdict, infrastructure, earlier, n, wall, slot in record_groups:
        if campaign_id not in info:
            continue
        row = row_of(campaign_id)
        row["spent"].slot_s += slot
        kind = _kind(state, verdict, infrastructure, verdicts)
        if kind:
            row[kind].slot_s += slot
        if kind in WASTED_KINDS or (earlier and not kind):
            row["wasted"].slot_s += slot
            row["wasted"].attempts += n if earlier and not kind else 0
        if row["retry_of"] or earlier:
            row["retries"].slot_s += slot
            row["retries"].attempts += n if earlier else 0
        row["seat"].held_s += wall * row["seats_per_task"]


def _task_groups(cluster: Cluster, campaigns, begin: dt.datetime, end: dt.datetime,
                 active: bool | None = None) -> list[tuple]:
    """The tasks of ``campaigns`` (a queryset of ids) that started in ``[begin, end)`` on ``cluster``
    (``active``: only those still active), summed by the database per campaign, state, verdict and
    whether the infrastructure failed them (``core.failures.infrastructure_sql``): ``[(campaign_id,
    state, verdict, infrastructure, tasks, unpriced tasks, cost in 1e-8 USD)]``."""
    tasks = Task.objects.filter(cluster=cluster, campaign_id__in=campaigns, started_at__gte=begin, started_at__lt=end)
    if active is not None:
        tasks = tasks.filter(active=active)
    unpriced = Q(cost_usd__isnull=True) & used_tokens_q()
    return [(item["campaign_id"], item["state"], item["verdict"], bool(item["infra"]), item["n"], item["unpriced"],
             int(item["cost"] or 0))
            for item in (tasks.annotate(infra=_infrastructure()).values("campaign_id", "state", "verdict", "infra")
                         .annotate(n=Count("id"), unpriced=Count("id", filter=unpriced),
                                   cost=Sum(Round(F("cost_usd") * COST_UNITS), output_field=BigIntegerField()))
                         .order_by())]


def _record_groups(cluster: Cluster, campaigns, begin: dt.datetime, end: dt.datetime,
                   task_ids: Sequence[int] | None = None) -> list[tuple]:
    """The accounting records of ``campaigns``' tasks (or of the tasks ``task_ids``) started in
    ``[begin, end)`` on ``cluster``, per campaign, task state, verdict and infrastructure, and earlier
    attempt: ``[(campaign_id, state, verdict, infrastructure, earlier, records, wall clock s, slot-seconds)]``."""
    in_period = _records(cluster, campaigns, begin, end)
    if task_ids is not None:
        in_period = in_period.filter(task_id__in=task_ids)
    later = AccountingRecord.objects.filter(task_id=OuterRef("task_id"), start_us__gt=OuterRef("start_us"))
    slot_s = ExpressionWrapper(F("wallclock_s") * F("slots"), output_field=FloatField())
    return [(item["task__campaign_id"], item["task__state"], item["task__verdict"], bool(item["infra"]),
             bool(item["earlier"]), item["n"], float(item["wall"] or 0.0), float(item["slot"] or 0.0))
            for item in (in_period.annotate(earlier=Exists(later), infra=_infrastructure())
                         .values("task__campaign_id", "task__state", "task__verdict", "infra", "earlier")
                         .annotate(n=Count("id"), wall=Sum("wallclock_s"), slot=Sum(slot_s)).order_by())]


def _records(cluster: Cluster, campaigns, begin: dt.datetime, end: dt.datetime):
    return AccountingRecord.objects.filter(cluster=cluster, task__campaign_id__in=campaigns, started_at__gte=begin,
                                           started_at__lt=end)


def _rollup_groups(cluster: Cluster, campaigns, begin: dt.datetime, end: dt.datetime) -> tuple[list, list]:
    """The waste rollups of ``campaigns`` for the whole UTC hours ``[begin, end)`` on ``cluster``: the
    ended tasks' groups and their records' groups, as :func:`_task_groups` and :func:`_record_groups`
    give them (``WasteRollup``: per campaign, hour, end state, verdict and attempt; its whole UTC
    days from ``WasteDayRollup``, ``billing.grains``)."""
    tasks, records = [], []
    items = []
    for stored, _field in rollup_sets(WasteRollup, WasteDayRollup, cluster=cluster, begin=begin, end=end):
        items += (stored.filter(campaign_id__in=campaigns)
                  .values("campaign_id", "state", "verdict", "infrastructure", "earlier")
                  .annotate(**{s: Sum(s) for s in WASTE_SUMS}).order_by())
    for item in items:
        sums = {s: int(item[s] or 0) for s in WASTE_SUMS}
        if any(sums[s] for s in WASTE_TASK_SUMS):
            tasks.append((item["campaign_id"], item["state"], item["verdict"], bool(item["infrastructure"]),
                          sums["tasks"], sums["unpriced_tasks"], sums["cost_units"]))
        if any(sums[s] for s in WASTE_RECORD_SUMS):
            records.append((item["campaign_id"], item["state"], item["verdict"], bool(item["infrastructure"]),
                            bool(item["earlier"]),
                            sums["records"], sums["wallclock_us"] / 1e6, sums["slot_us"] / 1e6))
    return tasks, records


def _seats(rows: dict[int, dict[str, Any]], *, cluster: Cluster, begin: dt.datetime, end: dt.datetime,
           campaigns) -> None:
    """The model-seat figures of ``campaigns`` (a queryset) for ``[begin, end)`` on ``cluster``, from
    the detail rows: tasks with a run time, held intervals (records), in-call intervals (requests)."""
    in_period = _records(cluster, campaigns.values("id"), begin, end)
    for campaign_id, n in (in_period.values("task__campaign_id").annotate(n=Count("task_id", distinct=True))
                           .values_list("task__campaign_id", "n").order_by()):
        if campaign_id in rows:
            rows[campaign_id]["seat"].tasks += n
    # The held intervals, for the peaks: one per record that started and ended.
    for campaign_id, started, ended in (in_period.filter(ended_at__isnull=False)
                                        .annotate(s=_epoch("started_at"), e=_epoch("ended_at"))
                                        .values_list("task__campaign_id", "s", "e")
                                        .iterator(chunk_size=5000)):
        row = rows.get(campaign_id)
        if row is not None:
            row["seat"].held.append((_seconds(started), _seconds(ended), row["seats_per_task"]))
    _seat_calls(rows, cluster=cluster, begin=begin, end=end, campaigns=campaigns.values("id"))


def _epoch(field: str):
    """``field`` (a datetime) as POSIX seconds, a float the database computes (PostgreSQL: reading
    a million datetimes into Python objects took most of the seat figures' time); elsewhere the
    datetime itself (:func:`_seconds` makes it seconds)."""
    if connection.vendor == "postgresql":
        return Func(F(field), template="date_part('epoch', %(expressions)s)", output_field=FloatField())
    return F(field)


def _seconds(value: float | dt.datetime) -> float:
    return value if isinstance(value, float) else value.timestamp()


#: The categories whose dollars and slot-seconds are wasted (the infrastructure's failures are not).
WASTED_KINDS = ("failed", "verdict_failed")


def _infrastructure():
    """Whether the infrastructure failed the task, as an annotation of a ``Task`` queryset or of one
    that joins ``Task`` once (``AccountingRecord`` through ``task``): the waste rollups' SQL on the task
    table (``core.failures.infrastructure_sql``)."""
    from django.db.models import BooleanField
    from django.db.models.expressions import RawSQL

    return RawSQL(infrastructure_sql(connection.ops.quote_name(Task._meta.db_table)), [],
                  output_field=BooleanField())


def _kind(state: str, verdict: str, infrastructure: bool, verdicts: tuple[str, ...]) -> str:
    """The category of a task (or of its records): ``infrastructure``, ``failed``, ``verdict_failed``
    or "" (none)."""
    if state in FAILED_STATES:
        return "infrastructure" if infrastructure else "failed"
    if state == "done" and (verdict or "").strip().lower() in verdicts:
        return "verdict_failed"
    return ""


def _seat_calls(rows: dict[int, dict[str, Any]], *, cluster: Cluster, begin: dt.datetime, end: dt.datetime,
                campaigns) -> None:
    """The model requests of the tasks started in ``[begin, end)``: per task the union of their
    intervals, into each campaign's in-call seat-seconds and intervals."""
    tasks = Task.objects.filter(cluster=cluster, campaign_id__in=campaigns, started_at__gte=begin, started_at__lt=end)
    for campaign_id, flags in tasks.exclude(usage_flags=[]).values_list("campaign_id", "usage_flags"):
        if campaign_id in rows and "requests_not_kept" in (flags or ()):
            rows[campaign_id]["seat"].partial = True
    # The tasks first, then their requests a chunk of tasks at a time, each chunk by the (task, seq) index:
    # one server-side cursor over the join let PostgreSQL plan for the cursor's first rows and walk that
    # index over every request of the table (a lead's month of 600 tasks: 2.6 s, against 0.13 s).
    campaign_of = dict(tasks.values_list("id", "campaign_id"))

    def requests():
        for chunk in in_chunks(sorted(campaign_of)):
            for task_id, at, latency_ms in (ModelRequest.objects.filter(task_id__in=chunk).annotate(at_s=_epoch("at"))
                                            .order_by("task_id", "seq").values_list("task_id", "at_s", "latency_ms")):
                yield task_id, campaign_of[task_id], at, latency_ms

    def close(campaign_id: int | None, spans: list[tuple[float, float]]) -> None:
        if campaign_id is None or campaign_id not in rows:
            return
        row = rows[campaign_id]
        for start, stop in merged(spans):
            row["seat"].in_calls_s += (stop - start) * row["seats_per_task"]
            row["seat"].calls.append((start, stop, row["seats_per_task"]))

    current, current_campaign, spans = None, None, []
    for task_id, campaign_id, at, latency_ms in requests():
        if task_id != current:
            close(current_campaign, spans)
            current, current_campaign, spans = task_id, campaign_id, []
        if campaign_id in rows:
            rows[campaign_id]["seat"].requests += 1
        start = _seconds(at)
        spans.append((start, start + max(0.0, float(latency_ms or 0.0)) / 1000.0))
    close(current_campaign, spans)


CSV_COLUMNS = ("team", "project", "campaign_id", "campaign", "retry_of", "seats_per_task", "tasks", "cost_usd",
               "slot_s", *(f"{c}_{f}" for c in CATEGORIES for f in ("tasks", "cost_usd", "slot_s")),
               "earlier_attempts", "unpriced_tasks", "seat_held_s", "seat_in_calls_s", "seat_peak_held",
               "seat_peak_in_calls", "seat_suggested", "seat_requests", "seat_in_calls_partial")


def waste_csv_rows(result: dict[str, Any]) -> Iterable[list[Any]]:
    """The waste view's campaign rows as CSV rows (header first): USD as exact decimals, seconds with
    3 decimals, the seat figures empty when they were left out."""
    yield list(CSV_COLUMNS)
    for r in result["rows"]:
        seat = r["seat"] or {}
        yield [r["team"], r["project"], r["campaign_id"], r["campaign"], r["retry_of"] or "", r["seats_per_task"],
               r["spent"]["tasks"], format(r["spent"]["cost_usd"].normalize(), "f"), f"{r['spent']['slot_s']:.3f}",
               *(v for c in CATEGORIES for v in (r[c]["tasks"], format(r[c]["cost_usd"].normalize(), "f"),
                                                 f"{r[c]['slot_s']:.3f}")),
               r["retries"]["attempts"], r["spent"]["unpriced"],
               *((f"{seat['held_s']:.3f}", f"{seat['in_calls_s']:.3f}", seat["peak_held"], seat["peak_in_calls"],
                  seat["suggested"], seat["requests"], "yes" if seat["partial"] else "no") if seat else [""] * 7)]
