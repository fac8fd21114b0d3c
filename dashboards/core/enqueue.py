"""Enqueue worker tasks by name, so the web side never imports ``worker.tasks``.

Celery routes a task sent by name exactly as one sent through its function
(``CELERY_TASK_ROUTES`` in settings match on the name). The names are the
contract between ``dashboards`` and ``worker``; ``worker/tasks.py`` registers
them under these names, and a unit test checks every name here is registered.
"""
from __future__ import annotations

import logging
from typing import Any

from celery import current_app

log = logging.getLogger(__name__)

SUBMIT_CAMPAIGN = "worker.tasks.submit_campaign"
CONTROL_JOB = "worker.tasks.control_job"
NOTIFY_CAMPAIGN_FINISHED = "worker.tasks.notify_campaign_finished"

TASK_NAMES = (SUBMIT_CAMPAIGN, CONTROL_JOB, NOTIFY_CAMPAIGN_FINISHED)


def send(name: str, *args: Any, queue: str | None = None) -> None:
    """Send task ``name`` (one of :data:`TASK_NAMES`) with positional ``args`` to the broker.

    ``queue`` overrides the route from settings; a submission or a control
request goes to the submit worker of its cluster. Raises whatever the broker
    client raises when the broker cannot be reached (kombu's
    ``OperationalError``); callers decide whether that is fatal.
    """
    if queue is None and name in (SUBMIT_CAMPAIGN, CONTROL_JOB) and args:
        queue = _submit_queue_of(name, args[0])
    options = {"queue": queue} if queue else {}
    current_app.send_task(name, args=list(args), **options)


def warm() -> bool:
    """Make the first :func:`send` of this process as quick as the next ones: load the broker's
    transport and open the producer pool's connection now (kombu imports its Redis transport and
    Celery builds its producer pool on the first send: 0.3-0.35 s, paid inside the first launch a
    web process served, against 0.02-0.03 s for a warm launch of 205 tasks; cProfile of
    ``dashboards.launch.service.launch``). The connection stays in Celery's pool for the next send.
    Returns whether the broker answered; never raises (the broker may be down at start:
    :func:`send` raises then, where a caller decides)."""
    try:
        with current_app.producer_or_acquire() as producer:
            producer.connection.ensure_connection(max_retries=1)
        return True
    except Exception as exc:  # noqa: BLE001 - a warm-up only; the send itself reports
        log.warning("broker not reached while warming the producer: %s", exc)
        return False


def _submit_queue_of(name: str, pk: int) -> str | None:
    """The submit worker's queue of the campaign's (or the control request's) cluster: each cluster's
    DRMAA session lives in a worker of its own (``core.clusters.submit_queue``); None: the route."""
    from dashboards.core.clusters import submit_queue
    from dashboards.models import Campaign, Cluster, ControlRequest

    owner = Campaign if name == SUBMIT_CAMPAIGN else ControlRequest
    cluster_id = owner.objects.filter(pk=pk).values_list("cluster_id", flat=True).first()
    cluster = Cluster.objects.filter(pk=cluster_id).first() if cluster_id else None
    return submit_queue(cluster) if cluster is not None else None
