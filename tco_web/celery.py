"""The Celery app: broker on Redis, periodic tasks declared here in one place.

Each periodic task expires at about 1.5 times its interval, so a poll that
is late (a busy worker) is dropped instead of piling up behind the next one.
"""
from __future__ import annotations

import os

from celery import Celery
from celery.signals import worker_process_init, worker_process_shutdown

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tco_web.settings")

app = Celery("tco")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["worker"])


@app.on_after_finalize.connect
def setup_periodic_tasks(sender: Celery, **kwargs) -> None:
    from django.conf import settings

    poll = settings.TCO_POLL_INTERVAL_S
    status = settings.TCO_STATUS_INTERVAL_S
    ingest = settings.TCO_INGEST_INTERVAL_S
    if not settings.TCO_POLL_LOOP:   # else manage.py tco_poll polls (worker/poll_loop.py)
        sender.add_periodic_task(poll, sender.signature("worker.tasks.poll_queue", expires=poll * 1.5),
                                 name="poll qstat")
    sender.add_periodic_task(status, sender.signature("worker.tasks.poll_cluster_status", expires=status * 1.5),
                             name="poll queues, hosts and quotas")
    sender.add_periodic_task(ingest, sender.signature("worker.tasks.ingest_accounting", expires=ingest * 1.5),
                             name="ingest accounting")
    sender.add_periodic_task(ingest, sender.signature("worker.tasks.ingest_runner_records", expires=ingest * 1.5),
                             name="ingest runner records")
    sender.add_periodic_task(5.0, sender.signature("worker.tasks.reconcile_gone_tasks", expires=7.5),
                             name="resolve tasks gone from qstat")
    sender.add_periodic_task(60.0, sender.signature("worker.tasks.reconcile_budgets", expires=90.0),
                             name="budget alerts")
    sender.add_periodic_task(60.0, sender.signature("worker.tasks.reconcile_claims", expires=90.0),
                             name="settle submissions and control requests left by a dead worker")
    alerts = settings.TCO_ALERT_INTERVAL_S
    sender.add_periodic_task(alerts, sender.signature("worker.tasks.alert_anomalies", expires=alerts * 1.5),
                             name="anomaly alerts")
    if settings.TCO_DETAIL_RETENTION_DAYS > 0:
        every = settings.TCO_RETENTION_INTERVAL_S
        sender.add_periodic_task(every, sender.signature("worker.tasks.reconcile_detail_retention",
                                                         expires=every * 1.5),
                                 name="drop detail rows past their retention (the rollups keep the bills)")
    depth = settings.TCO_DEPTH_SAMPLE_S
    sender.add_periodic_task(depth, sender.signature("worker.tasks.sample_queue_depth", expires=depth * 1.5),
                             name="sample queue depth")


@worker_process_init.connect
def open_drmaa_session(**kwargs) -> None:
    # DRMAA allows one session per process, and a session must not cross a
    # fork: open it in each child of the submitting worker only.
    if os.environ.get("TCO_DRMAA_WORKER") == "1":
        from schedulers.gridengine.drmaa import open_session

        name = os.environ.get("TCO_WORKER_CLUSTER")
        if name:
            # The submit worker of one cluster (queue submit.<name>, docs/clusters.md): its cell.
            from dashboards.core.clusters import scheduler_for
            from dashboards.models import Cluster

            cluster = Cluster.objects.get(name=name)
            adapter = scheduler_for(cluster)
            open_session(sge_root=adapter.sge_root, sge_cell=adapter.sge_cell, flavour=cluster.flavour,
                         ports=adapter.ports)
        else:
            open_session()


@worker_process_shutdown.connect
def close_drmaa_session(**kwargs) -> None:
    if os.environ.get("TCO_DRMAA_WORKER") == "1":
        from schedulers.gridengine.drmaa import close_session

        close_session()
