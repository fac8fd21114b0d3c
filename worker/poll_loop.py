"""The qstat poll in a loop of its own (``manage.py tco_poll``), not a Celery task queued by the beat.

Queued by the beat every ``TCO_POLL_INTERVAL_S`` (1 s), a poll starts late whenever the poll worker is
busy: on the loaded dev cluster (issue 22, seed replay with 50 watchers, load 10-29) 126 of about 450
polls were discarded as expired after waiting in the queue, 33 skipped because the previous one still ran,
and the polls' starts were p95 3.7 s apart (max 6.4 s in the run): a change waited that long before any
qstat saw it. Here one thread per cluster polls (``worker.tasks.poll_cluster``) and starts the next poll
``TCO_POLL_INTERVAL_S`` after the last one started, or at once when that poll took longer: no queue, no
expiry, no beat tick to wait for. While tasks change state (a poll saw a task start, end or change
state), the next poll starts ``TCO_POLL_ACTIVE_INTERVAL_S`` after the last one started: the poll's cadence is
the first part of a change's lag to the live pages (issue 22: p95 0.8 s at 1 s). Off by default (1 s): at
0.5 s the seed replay on 2 cores showed no gain (docs/live.md). The single-flight lock ``poll:<cluster name>`` is the Celery task's,
so a ``poll_queue`` run by hand never overlaps it.

With ``TCO_POLL_LOOP`` set (scripts/services sets it), the beat does not queue ``poll_queue``
(``tco_web/celery.py``); a site runs this as ``tco-poll.service``.
"""
from __future__ import annotations

import logging
import signal
import threading
import time
from typing import Callable

from django.conf import settings

log = logging.getLogger(__name__)

#: How often the list of clusters tco watches is read again (seconds): a cluster added gets its thread.
CLUSTERS_EVERY_S = 30.0


def poll_forever(cluster_name: str, stop: threading.Event, *, interval_s: float | None = None,
                 active_s: float | None = None, between: Callable[[], None] = lambda: None) -> int:
    """Poll the cluster named ``cluster_name`` until ``stop`` is set: each poll starts ``interval_s``
    (default ``TCO_POLL_INTERVAL_S``) seconds after the previous one started, ``active_s`` (default
    ``TCO_POLL_ACTIVE_INTERVAL_S``, at most ``interval_s``) after one that saw a task change state, or at
    once if that one took longer. ``between()`` runs before each poll and after a failure (the process's loop passes Django's
    ``close_old_connections``). A poll that raises is logged and the loop goes on a second later (the
    database or Redis away). Returns the number of polls run."""
    from dashboards.core.clusters import clusters_watched
    from worker.tasks import poll_cluster, single_flight

    interval = settings.TCO_POLL_INTERVAL_S if interval_s is None else interval_s
    active = min(interval, settings.TCO_POLL_ACTIVE_INTERVAL_S if active_s is None else active_s)
    polls = 0
    while not stop.is_set():
        began = time.monotonic()
        wait = interval
        try:
            between()
            cluster = next((c for c in clusters_watched() if c.name == cluster_name), None)
            if cluster is None:
                log.info("cluster %s is no longer watched: its poll loop ends", cluster_name)
                return polls
            with single_flight(f"poll:{cluster.name}", timeout=30) as mine:
                if mine:
                    result = poll_cluster(cluster)
                    polls += 1
                    if result.get("error"):
                        log.warning("poll of cluster %s failed: %s", cluster.name, result["error"])
                    elif result.get("state_changes"):
                        wait = active
        except Exception:  # noqa: BLE001 - the next poll reads everything again
            log.warning("poll of cluster %s failed; polling again in a second", cluster_name, exc_info=True)
            between()
            stop.wait(1.0)
            continue
        stop.wait(max(0.0, began + wait - time.monotonic()))
    return polls


def run(stop: threading.Event) -> None:
    """One :func:`poll_forever` thread per cluster tco watches, until ``stop`` is set; the list of
    clusters is read again every :data:`CLUSTERS_EVERY_S` seconds."""
    from django.db import close_old_connections

    from dashboards.core.clusters import clusters_watched

    threads: dict[str, threading.Thread] = {}
    log.info("poll loop started: every %.2f s per cluster", settings.TCO_POLL_INTERVAL_S)
    while not stop.is_set():
        try:
            names = [c.name for c in clusters_watched()]
        except Exception:  # noqa: BLE001 - the database away: try again
            log.warning("could not read the clusters tco watches", exc_info=True)
            names = []
        finally:
            close_old_connections()
        for name in names:
            if name not in threads or not threads[name].is_alive():
                threads[name] = threading.Thread(target=poll_forever, args=(name, stop),
                                                 kwargs={"between": close_old_connections}, name=f"tco-poll-{name}",
                                                 daemon=True)
                threads[name].start()
        stop.wait(CLUSTERS_EVERY_S)
    for thread in threads.values():
        thread.join(timeout=35)
    log.info("poll loop stopped")


def serve() -> None:
    """:func:`run` until SIGTERM or SIGINT (the management command)."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    run(stop)
