"""Celery tasks: thin wrappers that load what they need and call one service.

Retries cover only typed, transient errors (``SchedulerUnavailable``). The
periodic schedule is declared in ``tco_web/celery.py``.
"""
from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

from celery import shared_task
from django.conf import settings
from django.utils import timezone

from dashboards.core.redis_client import shared_redis_client
from schedulers.base import SchedulerError, SchedulerUnavailable

log = logging.getLogger(__name__)


def _redis():
    """One Redis client (and connection pool) per worker process, not one per task run."""
    return shared_redis_client()


@contextmanager
def single_flight(name: str, timeout: float):
    """Hold a Redis lock for ``name`` (key ``<TCO_REDIS_PREFIX>lock:<name>``: one install's lock never
    stops another's workers); yields False when another worker of this install holds it."""
    import redis

    lock = _redis().lock(f"{settings.TCO_REDIS_PREFIX}lock:{name}", timeout=timeout, blocking=False)
    acquired = lock.acquire(blocking=False)
    try:
        yield acquired
    finally:
        if acquired:
            try:
                lock.release()
            except redis.exceptions.LockError:
                pass  # expired while we worked: the next holder already has it


def on_default_cluster(kind: str, timeout: float, work: Callable[[Any], dict]) -> dict:
    """``work(cluster)`` on the default cluster while holding the single-flight lock
    ``<kind>:<cluster name>`` (at most ``timeout`` seconds); ``{"skipped": True}`` when another
    worker holds it."""
    from dashboards.core.clusters import cluster_get_default

    cluster = cluster_get_default()
    with single_flight(f"{kind}:{cluster.name}", timeout=timeout) as mine:
        return work(cluster) if mine else {"skipped": True}


def on_each_cluster(kind: str, timeout: float, work: Callable[[Any], dict], *, only: str | None = None) -> dict:
    """``work(cluster)`` on every cluster tco watches (or the one named ``only``), each under its own
    single-flight lock ``<kind>:<cluster name>``. One cluster's failure is logged and the others go
    on (docs/clusters.md). With one cluster, its result as :func:`on_default_cluster` gives it;
    with several, ``{cluster name: result}``."""
    from dashboards.core.clusters import clusters_watched

    clusters = [c for c in clusters_watched() if only is None or c.name == only]
    out = {}
    for cluster in clusters:
        with single_flight(f"{kind}:{cluster.name}", timeout=timeout) as mine:
            if not mine:
                out[cluster.name] = {"skipped": True}
                continue
            try:
                out[cluster.name] = work(cluster)
            except SchedulerError as exc:
                log.warning("%s on cluster %s failed: %s", kind, cluster.name, exc)
                out[cluster.name] = {"error": str(exc)}
    if only is None and len(clusters) == 1:
        return out[clusters[0].name]
    return out


def fan_out(task, kind: str, expires: float) -> dict | None:
    """With several clusters, queue ``task`` once per cluster (each its own worker slot, so one that
    stops answering holds up only its own polls) and return what was queued; None with one."""
    from dashboards.core.clusters import clusters_watched

    names = [c.name for c in clusters_watched()]
    if len(names) < 2:
        return None
    for name in names:
        task.apply_async(args=[name], expires=expires)
    return {"queued": names, "kind": kind}


#: A poll that changed the state of at least this many tasks (started, ended; not new submissions,
#: not priorities) is a burst
#: (96 agents starting at once): poll again after ``TCO_POLL_BURST_S`` instead of waiting for the next
#: beat, within three quarters of the poll interval (issue 15 item 4).
BURST_TASKS = 8


def poll_burst(cluster, list_tasks: Callable[[], list], *, budget_s: float, every_s: float) -> dict:
    """Poll ``list_tasks()`` (QstatTask rows) and apply the difference; while a poll is a burst
    (``BURST_TASKS``), poll again ``every_s`` seconds later, for at most ``budget_s`` seconds in all.
    Returns the counts summed, ``state_changes`` (tasks that started, ended or changed state) and
    ``polls``; ``{"error"}`` when a poll fails (recorded on the cluster)."""
    import time

    from dashboards.ingest.poll import apply_qstat_poll, record_poll_failure

    deadline = time.monotonic() + budget_s
    out = {"added": 0, "changed": 0, "gone": 0, "state_changes": 0, "polls": 0}
    while True:
        observed_at = timezone.now()
        try:
            tasks = list_tasks()
        except SchedulerError as exc:
            # A failed poll is never an empty queue: keep the last state, show the error.
            record_poll_failure(cluster, f"{type(exc).__name__}: {exc}")
            return {"error": str(exc)}
        # The view is of a moment between the two: snapshots are applied in the scheduler's order.
        changes = apply_qstat_poll(cluster, tasks, observed_at=observed_at, answered_at=timezone.now())
        out["polls"] += 1
        for key in ("added", "changed", "gone", "state_changes"):
            out[key] += getattr(changes, key)
        if changes.state_changes < BURST_TASKS or time.monotonic() + every_s >= deadline:
            return out
        time.sleep(every_s)


@shared_task(time_limit=30, soft_time_limit=25)
def poll_queue(cluster_name: str | None = None) -> dict:
    """Poll ``qstat -xml -u '*'`` and ``qstat -f`` once (whatever the number of hosts) and apply the
    difference; again every ``TCO_POLL_BURST_S`` while a burst goes on (:func:`poll_burst`). With
    several clusters, the periodic call queues one poll per cluster (:func:`fan_out`)."""
    if cluster_name is None and (queued := fan_out(poll_queue, "poll", settings.TCO_POLL_INTERVAL_S * 1.5)):
        return queued
    return on_each_cluster("poll", 30, poll_cluster, only=cluster_name)


def poll_cluster(cluster) -> dict:
    """One poll of ``cluster`` (:func:`poll_burst` of ``qstat -xml`` and ``qstat -f``), as :func:`poll_queue`
    and the poll loop (``worker.poll_loop``) run it under the single-flight lock ``poll:<cluster name>``."""
    from dashboards.core.clusters import scheduler_for
    from schedulers.hosts import tasks_with_host_states

    # Tasks on an unreachable host are "unknown", never running, done or failed on a guess.
    return poll_burst(cluster, lambda: tasks_with_host_states(scheduler_for(cluster)),
                      budget_s=settings.TCO_POLL_INTERVAL_S * 0.75, every_s=settings.TCO_POLL_BURST_S)


@shared_task(time_limit=30, soft_time_limit=25)
def poll_cluster_status(cluster_name: str | None = None) -> dict:
    """Poll queue slots, hosts and consumables, and resource quotas (one cluster a task, as the poll)."""
    from dashboards.ingest.cluster_status import cluster_status_refresh

    if cluster_name is None and (queued := fan_out(poll_cluster_status, "status",
                                                   settings.TCO_STATUS_INTERVAL_S * 1.5)):
        return queued
    return on_each_cluster("status", 30, lambda cluster: cluster_status_refresh(cluster=cluster), only=cluster_name)


@shared_task(time_limit=300, soft_time_limit=290)
def ingest_accounting() -> dict:
    from dashboards.ingest.accounting import ingest_accounting as ingest

    def accounting(cluster) -> dict:
        result = ingest(cluster)
        return {"accepted": result.accepted, "quarantined": result.quarantined, "finalized": result.finalized,
                **({"error": result.error} if result.error else {})}

    return on_each_cluster("accounting", 300, accounting)


@shared_task(time_limit=120, soft_time_limit=110)
def ingest_runner_records() -> dict:
    """Store the runners' records; the counts of dashboards.ingest.runner_records.RunnerIngestResult (quarantined, ...)."""
    from dashboards.ingest.runner_records import ingest_runner_records as ingest

    # The spool is one for every cluster and a record names its campaign: one pass finds them all.
    return on_default_cluster("runner-records", 120, lambda cluster: ingest(cluster).as_dict())


@shared_task(time_limit=60)
def reconcile_gone_tasks() -> dict:
    from dashboards.ingest.orphans import recover_killed_runners
    from dashboards.ingest.poll import reconcile_gone_tasks as reconcile

    def decide(cluster) -> dict:
        decided = reconcile(cluster)
        recover_killed_runners(cluster)  # runners killed outright: their metered usage, from the spool
        return {"decided": decided}

    return on_each_cluster("gone", 60, decide)


@shared_task(time_limit=300, soft_time_limit=290)
def reconcile_detail_retention() -> dict:
    """Drop detail rows older than ``TCO_DETAIL_RETENTION_DAYS`` in bounded batches (off by default)."""
    from dashboards.ingest.retention import drop_old_detail

    return on_each_cluster("retention", 300, lambda cluster: drop_old_detail(cluster, time_budget_s=120.0).as_dict())


@shared_task(time_limit=30, soft_time_limit=25)
def sample_queue_depth() -> dict:
    """Store one queue-depth sample (active tasks per cluster, project, state) for the history chart."""
    from dashboards.live.history import depth_sample_take

    sample = depth_sample_take()
    return {"clusters": len(sample["c"])}


@shared_task(
    autoretry_for=(SchedulerUnavailable,),
    retry_backoff=2,
    retry_backoff_max=60,
    max_retries=10,
    time_limit=600,
)
def submit_campaign(campaign_id: int) -> dict:
    """Submit a launched campaign through DRMAA (runs in the submit worker, as the submit account)."""
    from dashboards.launch.submit import campaign_submit

    campaign = campaign_submit(campaign_id=campaign_id)
    return {"campaign": campaign.pk, "status": campaign.status, "job_number": campaign.job_number}


@shared_task(bind=True, max_retries=8, time_limit=120, soft_time_limit=110)
def control_job(self, request_id: int) -> dict:
    """Run a queued control request (cancel, pause, resume, triage) as the submit account.

    The action is the ``ControlRequest`` ``request_id`` (dashboards.control); the result is
    written back there and in its audit entry. Retries only while the scheduler is unreachable.
    """
    from dashboards.control.actions import control_execute, control_give_up

    try:
        request = control_execute(request_id=request_id)
    except SchedulerUnavailable as exc:
        if self.request.retries >= self.max_retries:
            control_give_up(request_id=request_id, message=str(exc))
            return {"request": request_id, "ok": False}
        raise self.retry(exc=exc, countdown=min(60, 2 ** self.request.retries)) from exc
    return {"request": request.pk, "ok": request.ok, "state": request.state}


@shared_task(time_limit=120, soft_time_limit=110)
def reconcile_claims() -> dict:
    """Settle submissions and control requests whose worker died between claim and commit (periodic):
    adopt the campaign's job found by its name, or release the claim and queue it again."""
    from dashboards.control.actions import reconcile_control_requests
    from dashboards.launch.submit import reconcile_submissions

    with single_flight("claims", timeout=120) as mine:
        if not mine:
            return {}
        try:
            submissions = reconcile_submissions()
        except SchedulerUnavailable as exc:
            submissions = {"error": str(exc)}
        return {"submissions": submissions, "control": reconcile_control_requests()}


@shared_task(time_limit=60, soft_time_limit=50)
def notify_campaign_finished(campaign_id: int) -> bool:
    """E-mail the launcher that a campaign finished and check its team's budgets (queued on ``ingest``)."""
    from dashboards.launch.notices import campaign_finished_notify

    return campaign_finished_notify(campaign_id=campaign_id)


@shared_task(time_limit=120, soft_time_limit=110)
def alert_anomalies() -> int:
    """Record, show, mail and post anomalies found since the last check (periodic): slow tasks, failure
    bursts, budgets burning early (dashboards.alerts.anomalies). Returns how many alerts it recorded."""
    from dashboards.alerts.anomalies import anomaly_check

    with single_flight("anomalies", timeout=120) as mine:
        return len(anomaly_check()) if mine else 0


@shared_task(time_limit=120, soft_time_limit=110)
def reconcile_budgets() -> int:
    """Record and e-mail budget thresholds crossed since the last check (periodic)."""
    from dashboards.billing.budgets import budget_check_alerts

    with single_flight("budgets", timeout=120) as mine:
        return len(budget_check_alerts()) if mine else 0
