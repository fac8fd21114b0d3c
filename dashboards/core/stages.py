"""Stage statistics: how long each part of an agent's life took (DESIGN.md "Stages").

The runner's six timestamps (execution/spool/contract.py ``STAGES``) become the
durations the pages show (``DURATIONS``: submit, queue wait, sandbox start,
agent work, integration overhead): per task (:func:`task_stages`,
:func:`timeline`) and per campaign (:func:`campaign_stages`: median, p10,
p90, range and a histogram per stage, computed by the database and cached for
``TCO_STAGE_CACHE_S``). :func:`quantile` is the one percentile function of
tco (billing's forecast uses it too).
"""
from __future__ import annotations

import datetime as dt
import math
import statistics
from decimal import Decimal
from typing import Any, Sequence

from django.conf import settings
from django.core.cache import cache
from django.db import connection
from django.db.models import FloatField, Func

from dashboards.models import Campaign, Task
from execution.spool.contract import DURATIONS


def iso(value: dt.datetime | None) -> str | None:
    """A datetime as ISO-8601 text, UTC written ``Z``; None stays None."""
    return value.isoformat().replace("+00:00", "Z") if value else None


def seconds_between(start: dt.datetime | None, end: dt.datetime | None) -> float | None:
    """``end - start`` in seconds (6 decimals); None when either is missing."""
    if start is None or end is None:
        return None
    return round((end - start).total_seconds(), 6)


class EpochSeconds(Func):
    """A datetime column as seconds since the epoch (float), computed by the database."""

    output_field = FloatField()
    arity = 1

    def as_sqlite(self, compiler, connection, **extra_context):
        return self.as_sql(compiler, connection, template="((julianday(%(expressions)s) - 2440587.5) * 86400.0)",
                           **extra_context)

    def as_postgresql(self, compiler, connection, **extra_context):
        return self.as_sql(compiler, connection, template="EXTRACT(EPOCH FROM %(expressions)s)::double precision",
                           **extra_context)

    def as_mysql(self, compiler, connection, **extra_context):
        return self.as_sql(compiler, connection, template="UNIX_TIMESTAMP(%(expressions)s)", **extra_context)


HISTOGRAM_BINS = 30


def queue_wait_start(task: Task) -> dt.datetime | None:
    """When a task's queue wait began: its submission time, but never after it started.

    Until a poll or the accounting record gives the scheduler's submission time,
    a campaign task carries tco's (when DRMAA returned), which can be after the
    qmaster started the task; the wait is then bounded by the start (0 s), never
    negative.
    """
    start = task.task_started_at or task.started_at
    if task.submitted_at is not None and start is not None and start < task.submitted_at:
        return start
    return task.submitted_at


def submit_span(campaign: Campaign | None, task: Task | None = None) -> tuple[dt.datetime, dt.datetime | None] | None:
    """The "submit" stage as ``(start, end)``: launch request accepted (``launched_at``) -> the DRMAA
    call returned (``submitted_at``; None while it has not). None without a campaign.

    The one definition of the stage: the campaign's stage table (:func:`submit_seconds`) and the
    agent page's timeline (:func:`timeline`) both read it. For one ``task`` that started (its
    runner's first timestamp, else the scheduler's start) before DRMAA returned, the stage ends at
    that start. The end is never before the start, so the stage is never negative; the scheduler's
    own submission time (whole seconds, it can read before ``launched_at``) bounds the queue wait,
    never this stage.
    """
    if campaign is None or campaign.launched_at is None:
        return None
    start, end = campaign.launched_at, campaign.submitted_at
    began = (task.task_started_at or task.started_at) if task is not None else None
    if end is not None and began is not None and began < end:
        end = began
    if end is not None and end < start:
        end = start
    return start, end


def submit_seconds(campaign: Campaign | None, task: Task | None = None) -> float | None:
    """The "submit" stage in seconds (:func:`submit_span`), never negative; None until DRMAA returned."""
    span = submit_span(campaign, task)
    return seconds_between(*span) if span is not None else None


def task_stages(task: Task) -> dict[str, float | None]:
    """One task's stage durations in seconds (DESIGN.md "Stages"); None where not reached.

    ``queue_wait``: scheduler submission time -> ``task_started_at`` (the
    runner's first timestamp; the scheduler's start when there is no runner
    record yet). ``integration_overhead``: (``teardown_done_at`` -
    ``task_started_at``) minus sandbox start minus agent work.
    """
    queue_wait = seconds_between(queue_wait_start(task), task.task_started_at or task.started_at)
    sandbox = seconds_between(task.sandbox_create_at, task.sandbox_ready_at)
    agent = seconds_between(task.agent_started_at, task.agent_exited_at)
    total = seconds_between(task.task_started_at, task.teardown_done_at)
    overhead = None
    if total is not None and agent is not None:
        overhead = round(total - (sandbox or 0.0) - agent, 6)
    return {"queue_wait": queue_wait, "sandbox_start": sandbox, "agent_work": agent,
            "integration_overhead": overhead}


def quantile(ordered: Sequence, q: float):
    """The ``q`` quantile (0..1) of a sorted sequence, interpolated linearly between the closest
    ranks (numpy's default); None when it is empty. Decimal values give a Decimal, others a float."""
    if not ordered:
        return None
    pos = (len(ordered) - 1) * q
    lo = math.floor(pos)
    hi = min(lo + 1, len(ordered) - 1)
    frac = pos - lo
    a, b = ordered[lo], ordered[hi]
    if isinstance(a, Decimal):
        return a + (b - a) * Decimal(str(frac))
    return a + (b - a) * frac


def _histogram(ordered: list[float], bins: int = HISTOGRAM_BINS) -> dict[str, list[float]]:
    """``{"edges": [bins + 1 floats], "counts": [bins ints]}`` of a sorted, non-empty list."""
    lo, hi = ordered[0], ordered[-1]
    if hi <= lo:
        return {"edges": [lo, lo], "counts": [len(ordered)]}
    bins = max(1, min(bins, int(math.sqrt(len(ordered))) + 1))
    width = (hi - lo) / bins
    counts = [0] * bins
    for v in ordered:
        counts[min(int((v - lo) / width), bins - 1)] += 1
    return {"edges": [round(lo + i * width, 6) for i in range(bins + 1)], "counts": counts}


def _stage_row(key: str, label: str, values: list[float]) -> dict[str, Any]:
    values.sort()
    if not values:
        return {"stage": key, "label": label, "n": 0, "median_s": None, "p10_s": None, "p90_s": None,
                "min_s": None, "max_s": None, "histogram": None}
    return {
        "stage": key,
        "label": label,
        "n": len(values),
        "median_s": round(statistics.median(values), 6),
        "p10_s": round(quantile(values, 0.1), 6),
        "p90_s": round(quantile(values, 0.9), 6),
        "min_s": round(values[0], 6),
        "max_s": round(values[-1], 6),
        "histogram": _histogram(values),
    }


def campaign_stages(campaign: Campaign, states: dict[str, int] | None = None) -> dict[str, Any]:
    """The seed's stage table for one campaign: median (and p10, p90, range) per stage, with histograms.

    Shape ``{"rows": [{stage, label, n, median_s, p10_s, p90_s, min_s,
    max_s, histogram: {edges, counts} | None}], "tasks_with_record": n}``
    in the order submit, queue wait, sandbox start, agent work, integration
    overhead; seconds. ``submit`` is the campaign's one value (launch request
    accepted -> DRMAA returned). The durations are computed by the database
    (one row of four floats per task that has a runner record) and cached for
    ``TCO_STAGE_CACHE_S``.
    """
    # Keyed by the state counts too: a task that ends (its accounting read) is counted
    # at once, and the cache only spares repeated reads between two changes.
    version = ",".join(f"{s}={n}" for s, n in sorted((states or {}).items()) if n)
    key = f"campaign-stages:{campaign.pk}:{version}"
    ttl = settings.TCO_STAGE_CACHE_S
    if ttl > 0:
        cached = cache.get(key)
        if cached is not None:
            return cached
    started = EpochSeconds("task_started_at")
    rows = (
        Task.objects.filter(campaign=campaign, task_started_at__isnull=False)
        .annotate(
            qw=started - EpochSeconds("submitted_at"),
            sb=EpochSeconds("sandbox_ready_at") - EpochSeconds("sandbox_create_at"),
            ag=EpochSeconds("agent_exited_at") - EpochSeconds("agent_started_at"),
            tot=EpochSeconds("teardown_done_at") - started,
        )
        .values_list("qw", "sb", "ag", "tot")
        .order_by()
    )
    queue_wait: list[float] = []
    sandbox: list[float] = []
    agent: list[float] = []
    overhead: list[float] = []
    n = 0
    # One plain read: a server-side cursor (iterator) made PostgreSQL hold the whole result first, and
    # Django's per-row converters cost more than the query (10,000 tasks: 120 ms, bench_history.py).
    with connection.cursor() as cur:
        cur.execute(*rows.query.sql_with_params())
        fetched = cur.fetchall()
    for qw, sb, ag, tot in fetched:
        n += 1
        if qw is not None:
            queue_wait.append(max(qw, 0.0))  # tco's submission time may follow the start (queue_wait_start)
        if sb is not None:
            sandbox.append(sb)
        if ag is not None:
            agent.append(ag)
            if tot is not None:
                overhead.append(tot - (sb or 0.0) - ag)
    submit = submit_seconds(campaign)
    values = {"submit": [submit] if submit is not None else [],
              "queue_wait": queue_wait, "sandbox_start": sandbox, "agent_work": agent,
              "integration_overhead": overhead}
    result = {
        "rows": [_stage_row(key, label, values[key]) for key, label in DURATIONS],
        "tasks_with_record": n,
    }
    if ttl > 0:
        cache.set(key, result, ttl)
    return result


def timeline(task: Task) -> list[dict[str, Any]]:
    """The segments of one agent's life, in order; ``overhead`` marks the parts of integration overhead.

    ``[{stage, label, start, end (ISO, None while in progress), seconds, overhead}]``. The submit
    segment is the campaign's (:func:`submit_span`, never negative); the queue wait starts at the
    scheduler's submission time (:func:`queue_wait_start`), which has whole-second resolution, so
    the two may overlap by under a second.
    """
    campaign = task.campaign
    segments = []

    def add(stage: str, label: str, start, end, overhead: bool = False) -> None:
        if start is not None:
            segments.append({"stage": stage, "label": label, "start": iso(start), "end": iso(end),
                             "seconds": seconds_between(start, end), "overhead": overhead})

    span = submit_span(campaign, task)
    if span is not None:
        add("submit", "submit", *span)
    add("queue_wait", "queue wait", queue_wait_start(task), task.task_started_at or task.started_at)
    add("runner_setup", "runner setup", task.task_started_at, task.sandbox_create_at or task.agent_started_at,
        overhead=True)
    add("sandbox_start", "sandbox start", task.sandbox_create_at, task.sandbox_ready_at)
    if task.sandbox_ready_at is not None:
        add("handoff", "hand-off to agent", task.sandbox_ready_at, task.agent_started_at, overhead=True)
    if task.agent_exited_at is None and task.teardown_done_at is not None:
        # Stopped by the runner (timeout, signal): no exit time of its own; it ran until teardown ended.
        add("agent_work", "agent work (stopped)", task.agent_started_at, task.teardown_done_at)
    else:
        add("agent_work", "agent work", task.agent_started_at, task.agent_exited_at)
        add("teardown", "teardown", task.agent_exited_at, task.teardown_done_at, overhead=True)
    if task.task_started_at is None and task.started_at is not None and task.runner_record is None:
        # Started by the scheduler, no runner stage reported yet: one segment up to now (or its end).
        add("running", "running (no runner stage yet)" if task.active else "ran (no runner record)",
            task.started_at, None if task.active else task.ended_at)
    return segments


# --------------------------------------------------------------------------- Prometheus histograms

#: Histogram bucket bounds (seconds, upper bounds) per stage, for /metrics' ``tco_<stage>_seconds``
#: (Prometheus "Metric and label naming": base unit seconds). Sandbox starts take milliseconds
#: (bubblewrap, DESIGN.md), an agent minutes to hours, a queue wait anything from 0 to a day.
STAGE_BUCKETS: dict[str, tuple[float, ...]] = {
    "queue_wait": (0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 21600, 86400),
    "sandbox_start": (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
    "agent_work": (1, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 7200, 14400, 43200, 86400),
    "integration_overhead": (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
}


def _queue_label():
    """A task's cluster queue: where it ran, else its campaign's queue ("" for neither)."""
    from django.db.models import F, Value
    from django.db.models.functions import Coalesce, NullIf

    return Coalesce(NullIf(F("queue"), Value("")), F("campaign__queue"), Value(""))


def _stage_expressions() -> dict[str, tuple[Any, Any]]:
    """stage -> (the tasks that have it, its duration in seconds as a database expression): the
    definitions of :func:`task_stages`, computed by the database."""
    from django.db.models import Q, Value
    from django.db.models.functions import Coalesce, Greatest

    started = EpochSeconds(Coalesce("task_started_at", "started_at"))
    sandbox = EpochSeconds("sandbox_ready_at") - EpochSeconds("sandbox_create_at")
    agent = EpochSeconds("agent_exited_at") - EpochSeconds("agent_started_at")
    total = EpochSeconds("teardown_done_at") - EpochSeconds("task_started_at")
    return {
        # tco's own submission time can follow the start (queue_wait_start): never below 0.
        "queue_wait": (Q(submitted_at__isnull=False) & (Q(task_started_at__isnull=False) | Q(started_at__isnull=False)),
                       Greatest(started - EpochSeconds("submitted_at"), Value(0.0))),
        "sandbox_start": (Q(sandbox_create_at__isnull=False, sandbox_ready_at__isnull=False), sandbox),
        "agent_work": (Q(agent_started_at__isnull=False, agent_exited_at__isnull=False), agent),
        "integration_overhead": (Q(task_started_at__isnull=False, teardown_done_at__isnull=False,
                                   agent_started_at__isnull=False, agent_exited_at__isnull=False),
                                 total - Coalesce(sandbox, Value(0.0)) - agent),
    }


def _stage_rows(tasks, bounds_of: dict[str, tuple[float, ...]], *, per_campaign: bool) -> list[dict[str, Any]]:
    """Histogram rows of ``tasks`` for every stage, each stage one grouped query: ``[{"stage",
    "campaign" (id, with ``per_campaign``), "cluster", "queue", "count", "sum", "counts": [tasks <=
    each bound]}]``."""
    from django.db.models import Count, Q, Sum

    rows = []
    keys = ["campaign_id", "cluster__name", "q"] if per_campaign else ["cluster__name", "q"]
    for stage, (has_it, duration) in _stage_expressions().items():
        bounds = bounds_of[stage]
        counts = {f"le{i}": Count("id", filter=Q(d__lte=bound)) for i, bound in enumerate(bounds)}
        for row in (tasks.filter(has_it).annotate(d=duration, q=_queue_label())
                    .values(*keys).annotate(n=Count("id"), s=Sum("d"), **counts).order_by()):
            rows.append({"stage": stage, "campaign": row.get("campaign_id"), "cluster": row["cluster__name"],
                         "queue": row["q"], "count": row["n"], "sum": float(row["s"] or 0.0),
                         "counts": [row[f"le{i}"] for i in range(len(bounds))]})
    return rows


def stage_histograms(buckets: dict[str, tuple[float, ...]] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Every task's stage durations as cumulative histograms per cluster and queue, for /metrics.

    ``{stage: [{"cluster": name, "queue": cluster queue, "buckets": [(upper bound s, tasks <= it)],
    "count": tasks, "sum": seconds}]}`` for the stages of ``STAGE_BUCKETS`` (``buckets`` overrides
    them), computed by the database. A task counts once it has the stage's two timestamps
    (DESIGN.md "Stages"; the same definitions as :func:`task_stages`), so counts only grow while
    tasks are kept: Prometheus histograms, not windows.

    A finished campaign's tasks no longer change: its rows are cached per campaign for a day
    (keyed by its end and the buckets), so a scrape reads the tasks of unfinished campaigns and
    of jobs tco did not launch (50,000 finished tasks cost 1.5 s a scrape on SQLite before).
    Both sets come from one list of campaigns, so a campaign that finishes during a scrape is
    counted once, never dropped (a dip would read as a counter reset).
    """
    import hashlib
    import json

    from django.db.models import Q

    from dashboards.core.chunks import in_chunks
    from dashboards.core.states import UNFINISHED_CAMPAIGN

    buckets = buckets or STAGE_BUCKETS
    version = hashlib.sha256(json.dumps(buckets, sort_keys=True).encode()).hexdigest()[:12]
    campaigns = list(Campaign.objects.values_list("pk", "status", "finished_at"))
    live = [pk for pk, status, _ in campaigns if status in UNFINISHED_CAMPAIGN]
    keys = {pk: f"stage-histograms:{version}:{pk}:{iso(finished)}" for pk, status, finished in campaigns
            if status not in UNFINISHED_CAMPAIGN}
    cached = cache.get_many(list(keys.values())) if keys else {}
    rows = [row for pk, key in keys.items() if key in cached for row in cached[key]]
    missing = [pk for pk, key in keys.items() if key not in cached]
    fresh: dict[int, list[dict[str, Any]]] = {pk: [] for pk in missing}
    for chunk in in_chunks(missing):
        for row in _stage_rows(Task.objects.filter(campaign_id__in=chunk), buckets, per_campaign=True):
            fresh[row["campaign"]].append(row)
    if fresh:
        cache.set_many({keys[pk]: found for pk, found in fresh.items()}, 86400)
    rows += [row for found in fresh.values() for row in found]
    rows += _stage_rows(Task.objects.filter(Q(campaign__isnull=True) | Q(campaign_id__in=live)), buckets,
                        per_campaign=False)
    merged: dict[tuple[str, str, str], dict[str, Any]] = {}
    for row in rows:
        total = merged.setdefault((row["stage"], row["cluster"], row["queue"]), {
            "cluster": row["cluster"], "queue": row["queue"], "count": 0, "sum": 0.0,
            "counts": [0] * len(buckets[row["stage"]])})
        total["count"] += row["count"]
        total["sum"] += row["sum"]
        total["counts"] = [a + b for a, b in zip(total["counts"], row["counts"])]
    out: dict[str, list[dict[str, Any]]] = {stage: [] for stage in buckets}
    for (stage, _cluster, _queue), total in sorted(merged.items()):
        out[stage].append({"cluster": total["cluster"], "queue": total["queue"], "count": total["count"],
                           "sum": total["sum"], "buckets": list(zip(buckets[stage], total.pop("counts")))})
    return out


def oldest_pending(now: dt.datetime) -> list[dict[str, Any]]:
    """Per cluster and queue, the pending tasks (state ``pending``: waiting for the scheduler, not
    held): ``[{"cluster", "queue", "tasks": n, "oldest_s": seconds since the oldest one's
    submission}]``; for /metrics' ``tco_pending_oldest_seconds``."""
    from django.db.models import Count, Min

    rows = (Task.objects.filter(active=True, state="pending", submitted_at__isnull=False)
            .annotate(q=_queue_label()).values("cluster__name", "q")
            .annotate(n=Count("id"), first=Min("submitted_at")).order_by())
    return [{"cluster": r["cluster__name"], "queue": r["q"], "tasks": r["n"],
             "oldest_s": max((now - r["first"]).total_seconds(), 0.0)}
            for r in sorted(rows, key=lambda r: (r["cluster__name"], r["q"]))]
