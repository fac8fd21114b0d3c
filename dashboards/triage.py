"""Triage reads for admins: the waiting jobs, error-state first, with the scheduler's reasons.

Reads only; the triage *actions* are ``dashboards.control.triage_action``.
"""
from __future__ import annotations

import datetime as dt
from typing import Any

from django.db.models import Count, Max, Min, Q
from django.utils import timezone


from . import clusters, scheduler_cache
from .control import _ranges, ranges_text
from .models import Cluster, Task

TRIAGE_STATES = ("error", "pending", "held")


def triage_overview(*, cluster: Cluster | None = None, scheduler=None, max_jobs: int = 50,
                    now: dt.datetime | None = None) -> dict[str, Any]:
    """Waiting jobs for admins: error-state jobs first, then by the longest wait.

    Each job: ``{"job_number", "name", "owner", "project", "campaign_id",
    "tasks": n waiting, "errors": n, "held": n, "ranges": {state: "1-3,5"},
    "submitted_at", "wait_s", "reasons": [{"text", "raw"}], "reason_error": str}``.
    Reasons come from ``qstat -j`` (``explain_pending``) with quotas, hosts and
    consumable capacities from the last cluster status. Returns ``{"jobs",
    "total_jobs", "total_tasks", "quotas", "generated_at"}``.
    """
    from schedulers.pending import explain_pending

    cluster = cluster or clusters.cluster_get_default()
    now = now or timezone.now()
    waiting = Task.objects.filter(cluster=cluster, active=True, state__in=TRIAGE_STATES)
    jobs = list(
        waiting.values("job_number")
        .annotate(n=Count("id"), errors=Count("id", filter=Q(state="error")), held=Count("id", filter=Q(state="held")),
                  submitted=Min("submitted_at"), name=Max("name"), owner=Max("owner"), project=Max("project"),
                  campaign_id=Max("campaign_id"))
        .order_by()
    )
    far_future = dt.datetime.max.replace(tzinfo=dt.timezone.utc)
    jobs.sort(key=lambda j: (0 if j["errors"] else 1, j["submitted"] or far_future, j["job_number"]))
    total_tasks = sum(j["n"] for j in jobs)
    shown = jobs[:max_jobs]
    numbers_by_job: dict[int, dict[str, list[int]]] = {}
    for job_number, task_number, state in waiting.filter(job_number__in=[j["job_number"] for j in shown]).values_list(
            "job_number", "task_number", "state"):
        numbers_by_job.setdefault(job_number, {}).setdefault(state, []).append(task_number)
    status = cluster.status or {}
    positions = scheduler_cache.pending_positions(cluster, {j["job_number"]: j["project"] for j in shown})
    out = []
    for job in shown:
        reasons: list[dict] = []
        reason_error = ""
        found = scheduler_cache.job_detail_cached(cluster, job["job_number"], scheduler=scheduler)
        try:
            if found["unknown_job"]:
                reason_error = "the scheduler no longer knows this job (it may have just started or ended)"
            elif found["detail"] is None:
                reason_error = f"reasons unavailable: {found['error']}"
            else:
                reasons = explain_pending(found["detail"], quota=status.get("quotas"), hosts=status.get("hosts"),
                                          capacities=status.get("global_capacity"))
                reasons += positions[job["job_number"]]
        except (ValueError, TypeError) as exc:
            reason_error = f"reasons unavailable: {exc}"
        submitted = job["submitted"]
        out.append({
            "job_number": job["job_number"], "name": job["name"], "owner": job["owner"], "project": job["project"],
            "campaign_id": job["campaign_id"], "tasks": job["n"], "errors": job["errors"], "held": job["held"],
            "ranges": {state: "not an array" if nums == [0] else f"tasks {ranges_text(_ranges(nums))}"
                       for state, nums in sorted(numbers_by_job.get(job["job_number"], {}).items())},
            "submitted_at": submitted,
            "wait_s": (now - submitted).total_seconds() if submitted else None,
            "reasons": reasons, "reason_error": reason_error,
        })
    return {"jobs": out, "total_jobs": len(jobs), "total_tasks": total_tasks, "quotas": status.get("quotas", []),
            "generated_at": now}
