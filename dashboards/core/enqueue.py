"""Enqueue worker tasks by name, so the web side never imports ``worker.tasks``.

Celery routes a task sent by name exactly as one sent through its function
(``CELERY_TASK_ROUTES`` in settings match on the name). The names are the
contract between ``dashboards`` and ``worker``; ``worker/tasks.py`` registers
them under these names, and a unit test checks every name here is registered.
"""
from __future__ import annotations

from typing import Any

from celery import current_app

SUBMIT_CAMPAIGN = "worker.tasks.submit_campaign"
CONTROL_JOB = "worker.tasks.control_job"
NOTIFY_CAMPAIGN_FINISHED = "worker.tasks.notify_campaign_finished"

TASK_NAMES = (SUBMIT_CAMPAIGN, CONTROL_JOB, NOTIFY_CAMPAIGN_FINISHED)


def send(name: str, *args: Any, queue: str | None = None) -> None:
    """Send task ``name`` (one of :data:`TASK_NAMES`) with positional ``args`` to the broker.

    ``queue`` overrides the route from settings. Raises whatever the broker
    client raises when the broker cannot be reached (kombu's
    ``OperationalError``); callers decide whether that is fatal.
    """
    options = {"queue": queue} if queue else {}
    current_app.send_task(name, args=list(args), **options)
