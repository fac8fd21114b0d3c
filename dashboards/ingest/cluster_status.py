"""The cluster's status poll (queues, hosts, quotas, share tree, reservations) into ``Cluster.status``."""
from __future__ import annotations

from django.utils import timezone

from dashboards.core import realtime
from dashboards.core.clusters import scheduler_for
from dashboards.models import Cluster
from schedulers.base import SchedulerAdapter, SchedulerError
from schedulers.calendars import annotate_queues


def cluster_status_refresh(*, cluster: Cluster, scheduler: SchedulerAdapter | None = None) -> dict:
    """Store the cluster's queue slots, hosts, consumables and quotas; push a change.

    ``status`` becomes ``{"queues": [...], "hosts": [...], "quotas": [...],
    "global_capacity": {resource: number}, "share_tree": [...],
    "queue_instances": [...], "reservations": [...], "reserving_jobs": [...]}``, queue entries with
    their calendar (``schedulers.calendars.annotate_queues``; ``queue_calendars_error`` when it could
    not be read) (shapes of ``SchedulerAdapter``, ``dashboards.ingest.reservations.poll_status`` and
    ``schedulers.hosts.parse_queue_instances``; on a share-tree or
    queue-instance failure ``share_tree_error`` / ``queue_instances_error``
    instead). On ``SchedulerError`` the previous status stays and
    ``{"error": message}`` is returned; else ``{"queues": n, "hosts": n}``.
    """
    scheduler = scheduler or scheduler_for(cluster)
    try:
        status = {
            "queues": scheduler.queue_summary(),
            "hosts": scheduler.hosts(),
            "quotas": scheduler.quotas(),
            "global_capacity": scheduler.global_capacity(),
        }
    except SchedulerError as exc:
        return {"error": str(exc)}
    # Optional parts (an adapter may lack queue_instances, a cluster use only functional tickets):
    # on a failure the rest of the status is still stored, with the part's error. queue_instances:
    # states and reasons of the queue instances, for the hosts display (schedulers.hosts).
    for part in ("queue_instances", "share_tree", "queue_calendars"):
        read = getattr(scheduler, part, None)
        if read is not None:
            try:
                status[part] = read()
            except SchedulerError as exc:
                status[f"{part}_error"] = str(exc)[:500]
    # Calendars (schedulers.calendars): merged into the queue entries (calendar, calendar_year,
    # calendar_week, calendar_state, calendar_next_change, calendar_next_state, calendar_text).
    status["queues"] = annotate_queues(status["queues"], status.pop("queue_calendars", None), timezone.now(),
                                       cluster.time_zone)
    # Advance reservations and pending -R y jobs (issue 17): status["reservations"], ["reserving_jobs"].
    from dashboards.ingest.reservations import poll_status
    poll_status(scheduler, cluster, status)
    if status != cluster.status:
        Cluster.objects.filter(pk=cluster.pk).update(status=status, status_at=timezone.now())
        realtime.queue_changed(cluster.name)
    else:
        Cluster.objects.filter(pk=cluster.pk).update(status_at=timezone.now())
    return {"queues": len(status["queues"]), "hosts": len(status["hosts"])}
