"""Clusters: the default cluster, its scheduler adapter and its polled status.

The adapter of a cluster is chosen by the cluster's flavour
(``Cluster.flavour``) through :mod:`schedulers.registry`; nothing on the web
side names an adapter class.
"""
from __future__ import annotations

import functools

from django.conf import settings
from django.utils import timezone

from schedulers import registry
from schedulers.base import SchedulerAdapter, SchedulerError
from schedulers.calendars import annotate_queues
from schedulers.gridengine import flavours

from . import realtime
from .models import Cluster, Team


def cluster_flavour(sge_root: str, sge_cell: str, configured: str = "") -> tuple[str, str]:
    """``(flavour, why)``: ``configured`` (``TCO_SCHEDULER_FLAVOUR``) when set, else
    detected from the installation (``flavours.detect_flavour``: the clients'
    version banner, then the files in ``common/``), else ``sge8``."""
    if configured:
        return configured, "configured (TCO_SCHEDULER_FLAVOUR)"
    return _detected_flavour(sge_root, sge_cell)


@functools.lru_cache(maxsize=16)
def _detected_flavour(sge_root: str, sge_cell: str) -> tuple[str, str]:
    """Detection per cell, once per process (an installation does not change under a running tco)."""
    try:
        found = flavours.detect_flavour(sge_root, sge_cell)
    except SchedulerError as exc:
        return "sge8", f"not detected ({exc}); sge8 assumed"
    return found.flavour, f"detected: {found.evidence}"


def cluster_get_default() -> Cluster:
    """The cluster configured in settings (created on first use).

    On creation its flavour is ``TCO_SCHEDULER_FLAVOUR`` or detected from the
    installation, and its accounting file ``TCO_ACCOUNTING_FILE`` or the
    flavour's default (``common/accounting`` or ``common/accounting.jsonl``).
    """
    cluster = Cluster.objects.filter(name=settings.TCO_CLUSTER_NAME).first()
    if cluster is not None:
        return cluster
    flavour, _why = cluster_flavour(settings.SGE_ROOT, settings.SGE_CELL, settings.TCO_SCHEDULER_FLAVOUR)
    accounting = settings.TCO_ACCOUNTING_FILE or flavours.defaults_for(flavour).accounting_path(
        settings.SGE_ROOT, settings.SGE_CELL)
    cluster, _ = Cluster.objects.get_or_create(
        name=settings.TCO_CLUSTER_NAME,
        defaults={
            "sge_root": settings.SGE_ROOT,
            "sge_cell": settings.SGE_CELL,
            "flavour": flavour,
            "accounting_path": accounting,
            "time_zone": settings.TCO_CLUSTER_TZ,
        },
    )
    return cluster


def scheduler_for(cluster: Cluster, *, timeout: float | None = None,
                  accounting_path: str | None = None) -> SchedulerAdapter:
    """The adapter of ``cluster``'s flavour, with tco's allow-lists (queues,
    the teams' projects, requestable resources) and the cluster's cell and
    accounting file (``accounting_path`` reads another file). ``timeout``
    (seconds per scheduler command) defaults to the adapter's.
    Raises ``schedulers.registry.UnknownFlavour``.
    """
    options = dict(
        queues=list(settings.TCO_QUEUES),
        projects=list(Team.objects.values_list("project", flat=True)),
        resources=list(settings.TCO_REQUESTABLE_RESOURCES),
        sge_root=cluster.sge_root,
        sge_cell=cluster.sge_cell,
        accounting_path=accounting_path or cluster.accounting_path or None,
        # -notify: a qdel first sends SIGTERM (execd_params NOTIFY_KILL=TERM,
        # scripts/dev-cluster), so the runner writes its record before SIGKILL.
        notify=settings.TCO_NOTIFY,
    )
    if timeout is not None:
        options["timeout"] = timeout
    return registry.create(cluster.flavour or "sge8", **options)


def cluster_status_refresh(*, cluster: Cluster, scheduler: SchedulerAdapter | None = None) -> dict:
    """Store the cluster's queue slots, hosts, consumables and quotas; push a change.

    ``status`` becomes ``{"queues": [...], "hosts": [...], "quotas": [...],
    "global_capacity": {resource: number}, "share_tree": [...],
    "queue_instances": [...], "reservations": [...], "reserving_jobs": [...]}``, queue entries with
    their calendar (``schedulers.calendars.annotate_queues``; ``queue_calendars_error`` when it could
    not be read) (shapes of ``SchedulerAdapter``, ``dashboards.reservations.poll_status`` and
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
    from .reservations import poll_status
    poll_status(scheduler, cluster, status)
    if status != cluster.status:
        Cluster.objects.filter(pk=cluster.pk).update(status=status, status_at=timezone.now())
        realtime.queue_changed(cluster.name)
    else:
        Cluster.objects.filter(pk=cluster.pk).update(status_at=timezone.now())
    return {"queues": len(status["queues"]), "hosts": len(status["hosts"])}
