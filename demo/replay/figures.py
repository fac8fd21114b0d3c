"""The replay's figures from what tco recorded: stage medians, the launch, running counts, the
urgent agent's wait. Read from the database's rows; no waiting, no cluster.
"""
from __future__ import annotations

import datetime as dt
from typing import Any, Sequence

from dashboards.models import Campaign, Task
from dashboards.core.stages import task_stages
from demo.replay.options import median

__all__ = ["stage_medians", "urgent_wait", "launch_figures", "running_over_time"]


def stage_medians(tasks: Sequence[Task]) -> dict[str, float | None]:
    """Medians (seconds) of :func:`dashboards.core.stages.task_stages` over ``tasks``."""
    per_task = [task_stages(t) for t in tasks]
    return {key: median([s[key] for s in per_task])
            for key in ("queue_wait", "sandbox_start", "agent_work", "integration_overhead")}


def urgent_wait(campaign: Campaign, task: Task) -> dict[str, float | None]:
    """The urgent agent's queue wait (seconds): ``urgent_wait_s`` from the return of its DRMAA call
    (``Campaign.submitted_at``, microseconds; the job was in the qmaster by then, so this is the
    wait to within the call's return latency) to its runner's first timestamp, never negative;
    ``urgent_wait_bound_s`` from the scheduler's own submission time, which qstat and accounting
    give in whole seconds (up to a second before the real instant), so an upper bound. Measured
    on the dev cluster: 1.178 s from the DRMAA return where the whole-second time gave 2.132 s."""
    bound = task_stages(task)["queue_wait"]
    if campaign.submitted_at is None or task.task_started_at is None:
        return {"urgent_wait_s": bound, "urgent_wait_bound_s": bound}
    wait = max(0.0, (task.task_started_at - campaign.submitted_at).total_seconds())
    return {"urgent_wait_s": wait if bound is None else min(wait, bound), "urgent_wait_bound_s": bound}


def launch_figures(campaigns: Sequence[Campaign], called_at: dt.datetime) -> dict[str, Any]:
    """From the launch call (``called_at``) to the scheduler and the first agent: ``submit_s``
    (median of the campaigns' launch accepted -> DRMAA returned), ``all_in_scheduler_s`` (launch
    call -> the last campaign's DRMAA call returned: an array job's tasks enter together),
    ``first_running_s`` (-> the first ``agent_started_at``), ``submissions_per_min``."""
    submitted = [c.submitted_at for c in campaigns]
    tasks = sum(c.task_count for c in campaigns)
    all_in = (max(submitted) - called_at).total_seconds()
    first = Task.objects.filter(campaign__in=campaigns, agent_started_at__isnull=False) \
        .order_by("agent_started_at").values_list("agent_started_at", flat=True).first()
    return {"submit_s": median([c.submit_seconds for c in campaigns]), "all_in_scheduler_s": all_in,
            "first_running_s": (first - called_at).total_seconds() if first else None,
            "submissions_per_min": tasks / all_in * 60.0 if all_in > 0 else None, "tasks": tasks}


def running_over_time(tasks: Sequence[Task], *, step_s: float) -> dict[str, Any]:
    """Running count per project over time from the runner records (a task runs from
    ``task_started_at`` to ``teardown_done_at``), sampled every ``step_s`` seconds from the first
    start. Returns ``{"t": [s], "projects": {project: [count]}, "peak": {project: n}, "peak_total"}``."""
    spans = [(t.project, t.task_started_at.timestamp(), t.teardown_done_at.timestamp())
             for t in tasks if t.task_started_at and t.teardown_done_at]
    if not spans:
        return {"t": [], "projects": {}, "peak": {}, "peak_total": 0}
    origin, end = min(s[1] for s in spans), max(s[2] for s in spans)
    projects = sorted({s[0] for s in spans})
    times = [i * step_s for i in range(int((end - origin) / step_s) + 2)]
    counts = {p: [sum(1 for q, a, b in spans if q == p and a <= origin + x < b) for x in times] for p in projects}
    # The true peak (at any start instant, not only at the samples).
    peak_total = max(sum(1 for _, a, b in spans if a <= start < b) for _, start, _ in spans)
    return {"t": times, "projects": counts, "peak": {p: max(c) for p, c in counts.items()}, "peak_total": peak_total}
