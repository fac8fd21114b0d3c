"""The one cached path to ``qstat -j`` for pages, and a waiting job's place in the queue.

Every page that shows why a job waits (the agent page, the triage page, the
API) reads ``qstat -j`` through :func:`job_detail_cached`: one scheduler call
per job per ``TCO_JOB_DETAIL_CACHE_S`` for all web processes, with a short
timeout. :func:`pending_positions` ranks waiting jobs from the last poll, in
one query, without asking the scheduler.
"""
from __future__ import annotations

import datetime as dt
import time
from typing import Any

from django.conf import settings
from django.core.cache import cache
from django.db.models import Max, Min
from django.utils import timezone

from dashboards.core import clusters as core_clusters
from dashboards.core.encoding import jsonable
from dashboards.core.stages import iso as _iso
from dashboards.models import Cluster, Task
from schedulers.base import SchedulerAdapter, SchedulerError, UnknownJob
from schedulers.pending import policy_position

#: Seconds one ``qstat -j`` may take inside a web request.
WEB_QSTAT_TIMEOUT_S = 3.0


def _job_detail_fetch(cluster: Cluster, job_number: int, scheduler: SchedulerAdapter | None = None) -> dict:
    """``qstat -j`` of one job through the cluster's adapter (``scheduler``, or the cluster's own).

    With a short timeout (:data:`WEB_QSTAT_TIMEOUT_S`): a web process runs its
    sync views on one thread, so a qmaster that does not answer must not hold
    the other pages for long.
    """
    scheduler = scheduler or core_clusters.scheduler_for(cluster)
    return scheduler.job_detail(job_number, timeout=WEB_QSTAT_TIMEOUT_S)


def job_detail_cached(cluster: Cluster, job_number: int, *,
                      scheduler: SchedulerAdapter | None = None) -> dict[str, Any]:
    """``qstat -j`` of a job, asked at most once per ``TCO_JOB_DETAIL_CACHE_S`` for all web processes.

    Returns ``{"detail": parse_job_detail dict (JSON-ready) | None, "error":
    str | None, "unknown_job": bool, "fetched_at": ISO}``; ``unknown_job`` is
    true when the scheduler no longer knows the job. A lock in the cache makes
    concurrent page views wait (at most 3 s) for one answer instead of each
    running qstat. ``scheduler`` replaces the cluster's adapter (tests, callers
    that hold one); it is asked only on a cache miss.
    """
    key = f"job-detail:{cluster.pk}:{job_number}"
    ttl = max(settings.TCO_JOB_DETAIL_CACHE_S, 0.5)
    found = cache.get(key)
    if found is not None:
        return found
    if not cache.add(f"{key}:lock", 1, timeout=15):
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            time.sleep(0.05)
            found = cache.get(key)
            if found is not None:
                return found
        return {"detail": None, "error": "the scheduler is being asked; reload in a moment",
                "unknown_job": False, "fetched_at": _iso(timezone.now())}
    try:
        unknown = False
        try:
            detail, error = jsonable(_job_detail_fetch(cluster, job_number, scheduler)), None
        except UnknownJob:
            detail, error, unknown = None, "the scheduler no longer knows this job", True
        except SchedulerError as exc:
            detail, error = None, f"{type(exc).__name__}: {exc}"
        found = {"detail": detail, "error": error, "unknown_job": unknown, "fetched_at": _iso(timezone.now())}
        cache.set(key, found, ttl)
        return found
    finally:
        cache.delete(f"{key}:lock")




def pending_positions(cluster: Cluster, jobs: dict[int, str | None]) -> dict[int, list[dict]]:
    """For each waiting job (``{job_number: project}``), its place in the cluster's priority order
    and its team's share-tree standing: ``{job_number: [{text, raw}]}``.

    Ranks jobs (not tasks) by their highest ``JAT_prio`` among waiting
    (pending) tasks, from the last poll, with one query for all the jobs; a
    job that is not waiting gets ``[]``. Shape: ``schedulers.pending.policy_position``.
    """
    from dashboards.core.holds import job_priorities

    waiting = {job: (p, submitted) for job, p, submitted in (
        Task.objects.filter(cluster=cluster, active=True, state="pending")
        .values_list("job_number").annotate(p=Max("priority"), s=Min("submitted_at")).order_by()
        .values_list("job_number", "p", "s"))}
    posix = job_priorities(cluster, waiting)
    far = dt.datetime.max.replace(tzinfo=dt.timezone.utc)
    # The scheduler's order: JAT_prio, then -p (which JAT_prio may not show yet), then the
    # earlier submission, then the lower job number; every job has its own place.
    order = sorted(waiting, key=lambda j: (-waiting[j][0], -posix.get(j, 0), waiting[j][1] or far, j))
    rank = {job: i + 1 for i, job in enumerate(order)}
    share_tree = (cluster.status or {}).get("share_tree")
    out: dict[int, list[dict]] = {}
    for job_number, project in jobs.items():
        if job_number not in waiting:
            out[job_number] = []
            continue
        out[job_number] = policy_position(rank=rank[job_number], of=len(order), priority=waiting[job_number][0],
                                          project=project, share_tree=share_tree)
    return out


def pending_position(cluster: Cluster, job_number: int, project: str | None) -> list[dict]:
    """``pending_positions`` for one job."""
    return pending_positions(cluster, {job_number: project})[job_number]
