"""tco's Celery workers: the periodic poll, ingest and reconcile tasks and the
submit and control tasks (``worker.tasks``), plus the ``inspect`` command.

The top of the import layers (``.importlinter``): ``worker`` imports
``dashboards`` and ``schedulers``; nothing below imports ``worker``. The web
side enqueues tasks by name (``dashboards.core.enqueue``).
"""
