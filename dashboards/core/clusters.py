"""Clusters: the default cluster, its scheduler adapter and its polled status.

The adapter of a cluster is chosen by the cluster's flavour
(``Cluster.flavour``) through :mod:`schedulers.registry`; nothing on the web
side names an adapter class.
"""
from __future__ import annotations

import functools

from django.conf import settings

from dashboards.models import Cluster, Team
from schedulers import registry
from schedulers.base import SchedulerAdapter, SchedulerError
from schedulers.gridengine import flavours


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
