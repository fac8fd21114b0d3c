"""Waste on the bill: what failed, what ran again, and model seats held while no model call ran.

Per team and campaign, for local days ``first``..``last`` in the cluster's time
zone, with the bill's definitions (``billing.bills``): a task's dollars count in
the period of its start, slot-seconds are its accounting records' wall clock x
slots (every attempt, as ``qacct`` sums them), records counted in the period of
their own start. Only tco's campaigns: jobs tco did not launch have no metering.

- **failed**: tasks that ended ``failed`` or ``lost``;
- **verdict failed**: tasks that ended ``done`` and declared a failing verdict
  (:data:`FAILING_VERDICTS`, ``TCO_FAILING_VERDICTS``; case does not matter);
- **retries**: what ran again: the tasks of retry campaigns (``campaign_retry``) and
  the earlier attempts of tasks the scheduler ran again (every accounting record of a
  task but its last: a rerun after a lost host, a failed start). The runner meters one
  attempt per task, so earlier attempts have slot-seconds but no dollars;
- **wasted**: failed + verdict failed + the earlier attempts of the other tasks; each
  dollar and slot-second once. A retry campaign's own tasks are not wasted (they redo
  failed work; those that fail again are under failed).

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
from django.db.models import Max

from dashboards.billing.bills import BUCKETS
from dashboards.billing.periods import cluster_zone, local_midnight
from dashboards.core.errors import BillError
from dashboards.models import AccountingRecord, Campaign, Cluster, ModelRequest, Task, Team

#: Verdicts (lower case) that say the agent's own work failed; ``TCO_FAILING_VERDICTS`` overrides. Not
#: "bad" or "rejected": a review agent's "bad" is its finding about the run it reviewed, work done.
FAILING_VERDICTS = ("fail", "failed", "failure", "error", "incorrect", "wrong", "unresolved")
#: Headroom over the in-call peak in the suggested seat count (0.15: 41 in calls -> 48 seats).
SEAT_HEADROOM = 0.15
#: At most this many days in one waste view (a year, as the bill's 400 daily periods).
MAX_DAYS = 400
FAILED_STATES = ("failed", "lost")
CATEGORIES = ("failed", "verdict_failed", "retries", "wasted")
ZERO = Decimal(0)
#: The page's words for each figure (said under the tables and in the CSV's header note).
DEFINITIONS = {
    "failed": "tasks that ended failed or lost",
    "verdict_failed": "tasks that ended done with a failing verdict ({verdicts})",
    "retries": ("tasks of retry campaigns, and the earlier attempts of tasks the scheduler ran again "
                "(slot-seconds only: the runner meters one attempt per task)"),
    "wasted": ("failed + verdict failed + the earlier attempts of the other tasks, each once; a retry "
               "campaign's own tasks are not wasted (they redo failed work)"),
    "seats": ("held: each task's run time (accounting wall clock) x seats per task; in calls: the time its "
              "model requests were open (parallel requests count once) x seats per task"),
}


def failing_verdicts() -> tuple[str, ...]:
    """The failing verdicts in force, lower case."""
    return tuple(v.strip().lower() for v in getattr(settings, "TCO_FAILING_VERDICTS", FAILING_VERDICTS) if v.strip())


def seat_headroom() -> float:
    return float(getattr(settings, "TCO_SEAT_HEADROOM", SEAT_HEADROOM))


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
          campaign: int | None = None, seats: bool = True) -> dict[str, Any]:
    """Waste of ``teams``' campaigns whose tasks started on local days ``first``..``last`` (module doc).

    ``campaign`` narrows it to one campaign (id); ``seats`` False leaves the model-seat figures out
    (they read every model request). Returns ``{"first", "last", "time_zone", "failing_verdicts",
    "headroom", "definitions", "rows": [row], "teams": [team row], "totals": row}``: a row is
    ``{"campaign_id", "campaign", "team", "project", "retry_of", "seats_per_task", "spent",
    "failed", "verdict_failed", "retries", "wasted"`` (each ``{"tasks", "cost_usd" (Decimal USD),
    "unpriced", "slot_s", "slot_hours", "attempts"}``; ``spent`` is everything, as on the bill),
    ``"wasted_share"`` (wasted / spent USD, None without spend), ``"seat"`` (``{"held_s",
    "in_calls_s", "utilization", "requests", "tasks", "partial", "peak_held", "peak_in_calls",
    "suggested", "text"}``, seat-seconds and seats) | None}``, sorted by team, then wasted dollars
    (most first). A team row has ``"team"``, ``"project"`` and the same sums over its campaigns;
    its seat peaks are of its campaigns' intervals together (one consumable). Raises
    ``BillError`` for a bad range.
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
    for cluster in clusters if teams else ():
        tz = cluster_zone(cluster)
        begin, end = local_midnight(first, tz), local_midnight(last + dt.timedelta(days=1), tz)
        _accumulate(rows, cluster=cluster, begin=begin, end=end, teams=teams, campaign=campaign,
                    verdicts=verdicts, seats=seats)
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


def _accumulate(rows: dict[int, dict[str, Any]], *, cluster: Cluster, begin: dt.datetime, end: dt.datetime,
                teams: list[Team], campaign: int | None, verdicts: tuple[str, ...], seats: bool) -> None:
    """Add the tasks and accounting records of ``cluster`` that started in ``[begin, end)`` to ``rows``."""
    campaigns = Campaign.objects.filter(cluster=cluster, team__in=teams)
    if campaign:
        campaigns = campaigns.filter(pk=campaign)
    info = {c["id"]: c for c in campaigns.values("id", "name", "team__name", "team__project", "retry_of_id",
                                                  "seats_per_task")}
    if not info:
        return

    def row_of(campaign_id: int) -> dict[str, Any]:
        row = rows.get(campaign_id)
        if row is None:
            row = rows[campaign_id] = _campaign_row(info[campaign_id])
        return row

    # Dollars: each task in the period of its start (the bill's rule).
    kinds: dict[int, str] = {}  # task id -> its category: failed, verdict_failed or "" (neither)
    ids = campaigns.values("id")  # a subquery: no list of ids that could pass SQLite's variable limit
    tasks = (Task.objects.filter(cluster=cluster, campaign_id__in=ids, started_at__gte=begin,
                                 started_at__lt=end)
             .values_list("id", "campaign_id", "state", "verdict", "cost_usd", *BUCKETS))
    for task_id, campaign_id, state, verdict, cost, *buckets in tasks.iterator(chunk_size=5000):
        row = row_of(campaign_id)
        has_tokens = any(buckets)
        row["spent"].add_task(cost, has_tokens)
        kind = _kind(state, verdict, verdicts)
        kinds[task_id] = kind
        if kind:
            row[kind].add_task(cost, has_tokens)
            row["wasted"].add_task(cost, has_tokens)
        if row["retry_of"]:
            row["retries"].add_task(cost, has_tokens)

    # Slot-seconds and held seats: every accounting record, in the period of its own start.
    in_period = AccountingRecord.objects.filter(cluster=cluster, task__campaign_id__in=ids, started_at__gte=begin,
                                                started_at__lt=end)
    records = list(in_period.values_list("task_id", "task__campaign_id", "task__state", "task__verdict", "start_us",
                                "started_at", "ended_at", "wallclock_s", "slots"))
    # Each task's last attempt, wherever it started (after the period too: the ones in it are then earlier).
    latest = dict(AccountingRecord.objects.filter(task_id__in=in_period.values("task_id")).values("task_id")
                  .annotate(last=Max("start_us")).values_list("task_id", "last").order_by())
    timed: dict[int, set[int]] = {}
    for task_id, campaign_id, state, verdict, start_us, started, ended, wall, slots in records:
        row = row_of(campaign_id)
        slot_s = float(wall or 0.0) * (slots or 1)
        row["spent"].slot_s += slot_s
        kind = kinds.get(task_id, _kind(state, verdict, verdicts))
        earlier = start_us < latest[task_id]
        if kind:
            row[kind].slot_s += slot_s
        if kind or earlier:
            row["wasted"].slot_s += slot_s
            row["wasted"].attempts += int(earlier and not kind)
        if row["retry_of"] or earlier:
            row["retries"].slot_s += slot_s
            row["retries"].attempts += int(earlier)
        seat = row["seat"]
        seat.held_s += float(wall or 0.0) * row["seats_per_task"]
        timed.setdefault(campaign_id, set()).add(task_id)
        if started is not None and ended is not None:
            seat.held.append((started.timestamp(), ended.timestamp(), row["seats_per_task"]))
    for campaign_id, task_ids in timed.items():
        rows[campaign_id]["seat"].tasks += len(task_ids)
    if seats:
        _seat_calls(rows, cluster=cluster, begin=begin, end=end, campaigns=ids)


def _kind(state: str, verdict: str, verdicts: tuple[str, ...]) -> str:
    if state in FAILED_STATES:
        return "failed"
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
    requests = (ModelRequest.objects.filter(task__in=tasks)
                .order_by("task_id", "seq").values_list("task_id", "task__campaign_id", "at", "latency_ms"))

    def close(campaign_id: int | None, spans: list[tuple[float, float]]) -> None:
        if campaign_id is None or campaign_id not in rows:
            return
        row = rows[campaign_id]
        for start, stop in merged(spans):
            row["seat"].in_calls_s += (stop - start) * row["seats_per_task"]
            row["seat"].calls.append((start, stop, row["seats_per_task"]))

    current, current_campaign, spans = None, None, []
    for task_id, campaign_id, at, latency_ms in requests.iterator(chunk_size=5000):
        if task_id != current:
            close(current_campaign, spans)
            current, current_campaign, spans = task_id, campaign_id, []
        if campaign_id in rows:
            rows[campaign_id]["seat"].requests += 1
        start = at.timestamp()
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
