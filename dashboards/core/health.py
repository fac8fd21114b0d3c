"""What the pages say when part of the system is down or behind: the scheduler, Redis, an execd.

Three facts, each read from the database or one cheap probe, never raising:

* :func:`scheduler_unreachable`: the last polls of a cluster failed; since
  when (``Cluster.poll_error_at``: the first failure after the last good
  poll, dashboards/ingest.py ``record_poll_failure``) and the last good poll.
  The pages keep showing the last known state: a failed poll changes no task.
* :func:`live_updates_paused`: Redis (the channel layer, the cache and
  Celery's broker) does not answer. Pages are then rendered from the
  database alone and say that live updates are paused; WebSockets reconnect
  by themselves (static/js/live.js) once Redis is back.
* :func:`host_trouble`: the hosts of the clusters' last status poll that are down (unreachable, in
  error, disabled) and those that are only busy: a queue instance in load alarm (``a``: a
  ``load_thresholds`` value exceeded) runs its tasks and takes no new work until the load falls, which
  is not a host down (on the one-VM dev cluster every host shares two cores, and a demo's burst of
  sandboxes starting lifts np_load_avg past classic.q's threshold of 6 for minutes).
* :func:`runner_finished_tasks`: tasks whose runner finished (its runner
  record is ingested) more than ``TCO_RUNNER_FINISHED_GRACE_S`` seconds ago
  while the scheduler still lists them as active, typically because the
  execd of their host has not re-registered since a qmaster restart. They are
  shown as "finished per its runner; the scheduler still lists it: execd on
  host H silent since T" (T: when the first such task's runner finished, the
  moment from which the execd should have reported it), and admins are told
  on every page (:func:`execd_silences`). Their state is not changed: the
  accounting record decides done or failed when it comes.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import re
import time
from typing import Any

from django.conf import settings
from django.db.models import Q
from django.utils import timezone

from dashboards.core.redis_client import redis_client
from dashboards.models import Cluster, Task

log = logging.getLogger(__name__)

#: Host states that are not trouble: up, and closed by its queues' calendar (planned).
HOST_FINE = ("up", "closed")
#: qstat -explain's reason of a load alarm: ``alarm hl:np_load_avg=6.21 load-threshold=6``.
_ALARM_RE = re.compile(r"alarm \w+:(\w+)=([0-9.]+) load-threshold=([0-9.]+)")

#: Seconds after its runner finished before a task still listed by the scheduler is called out.
RUNNER_FINISHED_GRACE_S = 90.0
#: Seconds a Redis probe result is reused within one process.
REDIS_PROBE_TTL_S = 2.0
#: States in which the scheduler lists a task as holding or about to hold a slot.
_LISTED_STATES = ("running", "transferring", "suspended", "deleting", "restarted", "unknown")

_redis_probe: dict[str, Any] = {"at": -1e9, "ok": True, "error": ""}


@dataclasses.dataclass(frozen=True)
class SchedulerOutage:
    """A cluster whose polls fail: ``since`` (first failure), ``last_ok`` (last good poll) and the error."""

    cluster: str
    since: dt.datetime | None
    last_ok: dt.datetime | None
    error: str


def scheduler_unreachable(clusters: list[Cluster] | None = None) -> list[SchedulerOutage]:
    """Clusters whose latest poll failed (a failure newer than the last good poll)."""
    out = []
    # Every page's banner asks: the fields it reads, not each cluster's stored status (the last poll's
    # queues, hosts and jobs, parsed from JSON on each read).
    fields = ("name", "polled_at", "poll_error", "poll_error_at")
    for cluster in clusters if clusters is not None else Cluster.objects.order_by("name").only(*fields):
        if not cluster.poll_error:
            continue
        if cluster.polled_at and cluster.poll_error_at and cluster.poll_error_at < cluster.polled_at:
            continue
        out.append(SchedulerOutage(cluster.name, cluster.poll_error_at, cluster.polled_at, cluster.poll_error[:300]))
    return out


@dataclasses.dataclass(frozen=True)
class HostTrouble:
    """The hosts of the clusters' last status polls: ``down`` ("sge-exec3 unreachable", one per host not
    up and not just busy), ``busy`` (:func:`busy_text` of each host whose only trouble is an alarm) and
    ``hosts`` (how many hosts in all)."""

    down: list[str]
    busy: list[str]
    hosts: int


def host_trouble(clusters: list[Cluster] | None = None) -> HostTrouble:
    """Down and busy hosts over ``clusters`` (default every cluster) from their last status poll
    (``schedulers.hosts.host_states``): a host in alarm (``a`` or ``A`` on a queue instance) is busy, not
    down; unreachable, error and disabled are down; up and closed (its calendar) are fine."""
    from schedulers.hosts import host_states

    down: list[str] = []
    busy: list[str] = []
    total = 0
    for cluster in clusters if clusters is not None else Cluster.objects.order_by("name"):
        status = cluster.status or {}
        for host in host_states(status.get("hosts") or [], status.get("queue_instances") or []):
            total += 1
            if host["state"] == "alarm":
                busy.append(busy_text(host))
            elif host["state"] not in HOST_FINE:
                down.append(f"{host['name']} {host['state']}")
    return HostTrouble(down, busy, total)


def busy_text(host: dict[str, Any]) -> str:
    """``sge-exec3 busy: classic.q in load alarm (np_load_avg 6.21 over 6), no new work there`` from a
    ``host_states`` host in alarm (its ``why`` holds qstat -explain's ``alarm hl:NAME=VALUE
    load-threshold=LIMIT``; without it, the queues in alarm alone); a suspend alarm (``A``) says its
    tasks there are suspended."""
    letters = [set(q.get("states") or "") & {"a", "A"} for q in host.get("queues") or []]
    queues = ", ".join(q["queue"] for q, alarm in zip(host.get("queues") or [], letters) if alarm) or "a queue"
    if any("A" in alarm for alarm in letters):
        return f"{host['name']} busy: {queues} in suspend alarm, its tasks there suspended"
    found = next((m for m in (_ALARM_RE.search(w) for w in host.get("why") or []) if m), None)
    load = f" ({found[1]} {float(found[2]):.2f} over {float(found[3]):g})" if found else ""
    return f"{host['name']} busy: {queues} in load alarm{load}, no new work there"


def live_updates_paused() -> tuple[bool, str]:
    """(True, why) when Redis does not answer a PING (through the cache's connection settings when the
    cache is dashboards.core.resilient_cache, else ``REDIS_URL``); probed at most every 2 s per process."""
    from django.core.cache import cache

    # When this thread's cache calls failed (dashboards.core.resilient_cache), probe now: an earlier
    # "ok" must not hide the outage (and a good PING ends the cache's outage).
    now = time.monotonic()
    fresh = getattr(cache, "down_since", None) is None
    if fresh and now - _redis_probe["at"] < REDIS_PROBE_TTL_S:
        return (not _redis_probe["ok"], _redis_probe["error"])
    import redis

    try:
        if hasattr(cache, "ping"):  # dashboards.core.resilient_cache: the cache's own address and credentials
            cache.ping()
        else:
            client = redis_client(timeout_s=1)
            try:
                client.ping()
            finally:
                client.close()
        ok, error = True, ""
    except (redis.RedisError, OSError) as exc:
        ok, error = False, f"{type(exc).__name__}: {exc}"[:200]
    _redis_probe.update(at=now, ok=ok, error=error)
    return (not ok, error)


def _runner_finished_at(task: Task) -> dt.datetime | None:
    return task.teardown_done_at or task.agent_exited_at or task.updated_at


def runner_finished_tasks(*, now: dt.datetime | None = None, grace_s: float | None = None,
                          tasks=None, limit: int = 500) -> list[Task]:
    """Active tasks the scheduler still lists as running (or so) whose runner record was ingested
    more than ``grace_s`` seconds ago (default ``TCO_RUNNER_FINISHED_GRACE_S``), oldest first.

    ``tasks``: a queryset to narrow (a user's visible tasks); default all.
    """
    now = now or timezone.now()
    grace = grace_s if grace_s is not None else getattr(settings, "TCO_RUNNER_FINISHED_GRACE_S",
                                                         RUNNER_FINISHED_GRACE_S)
    cutoff = now - dt.timedelta(seconds=grace)
    qs = (tasks if tasks is not None else Task.objects.all()).filter(active=True, state__in=_LISTED_STATES)
    qs = qs.exclude(runner_record={}).exclude(runner_record__isnull=True)
    qs = qs.filter(Q(teardown_done_at__lt=cutoff)
                   | Q(teardown_done_at__isnull=True, agent_exited_at__lt=cutoff)
                   | Q(teardown_done_at__isnull=True, agent_exited_at__isnull=True, updated_at__lt=cutoff))
    found = list(qs.select_related("cluster")[:limit])
    found.sort(key=lambda t: (_runner_finished_at(t) or now, t.pk))
    return found


def task_note(task: Task, *, now: dt.datetime | None = None) -> str:
    """The line the pages show for a task whose runner finished while the scheduler still lists it, else ""."""
    if not task.active or task.state not in _LISTED_STATES or not task.runner_record:
        return ""
    finished = _runner_finished_at(task)
    now = now or timezone.now()
    grace = getattr(settings, "TCO_RUNNER_FINISHED_GRACE_S", RUNNER_FINISHED_GRACE_S)
    if finished is None or (now - finished).total_seconds() < grace:
        return ""
    host = task.host or "?"
    return (f"finished per its runner; the scheduler still lists it: execd on host {host} silent since "
            f"{finished.astimezone(dt.timezone.utc):%Y-%m-%d %H:%M:%S} UTC")


@dataclasses.dataclass
class ExecdSilence:
    """One host whose execd has not reported tasks its runners finished: since when, how many, whether
    the last status poll has the host unreachable (``no_load``: ``schedulers.hosts.host_states``, the
    rule of the hosts tile and the queue page's hosts card, so the banner never names a host
    unreachable that the tile counts up)."""

    cluster: str
    host: str
    since: dt.datetime
    tasks: int = 0
    no_load: bool = False
    task_ids: list[int] = dataclasses.field(default_factory=list)


def _unreachable_hosts(cluster: Cluster, memo: dict[int, frozenset[str]]) -> frozenset[str]:
    """The hosts ``schedulers.hosts.host_states`` calls unreachable in ``cluster``'s last status poll
    (read once per cluster into ``memo``)."""
    from schedulers.hosts import host_states

    if cluster.pk not in memo:
        status = cluster.status or {}
        memo[cluster.pk] = frozenset(h["name"] for h in host_states(status.get("hosts") or [],
                                                                    status.get("queue_instances") or [])
                                     if h["state"] == "unreachable")
    return memo[cluster.pk]


def execd_silences(*, now: dt.datetime | None = None, tasks=None) -> list[ExecdSilence]:
    """The hosts of :func:`runner_finished_tasks`, one entry per (cluster, host), longest silence first."""
    found: dict[tuple[str, str], ExecdSilence] = {}
    states: dict[int, frozenset[str]] = {}
    for task in runner_finished_tasks(now=now, tasks=tasks):
        key = (task.cluster.name, task.host or "?")
        finished = _runner_finished_at(task) or timezone.now()
        entry = found.get(key)
        if entry is None:
            entry = found[key] = ExecdSilence(key[0], key[1], finished,
                                              no_load=task.host in _unreachable_hosts(task.cluster, states))
        entry.since = min(entry.since, finished)
        entry.tasks += 1
        if len(entry.task_ids) < 5:
            entry.task_ids.append(task.pk)
    return sorted(found.values(), key=lambda e: e.since)


def notices(user) -> dict[str, Any]:
    """What the health banner shows ``user``: ``{"outages", "live_paused", "live_error", "silences"}``.

    Silences are for admins (staff) only: they name hosts and every team's tasks.
    Never raises: a failure to work a notice out is logged and leaves it out.
    """
    out: dict[str, Any] = {"outages": [], "live_paused": False, "live_error": "", "silences": []}
    if user is None or not getattr(user, "is_authenticated", False):
        return out
    try:
        out["outages"] = scheduler_unreachable()
    except Exception:  # noqa: BLE001 - a banner must never break the page it is on
        log.warning("scheduler health could not be read", exc_info=True)
    try:
        out["live_paused"], out["live_error"] = live_updates_paused()
    except Exception:  # noqa: BLE001
        log.warning("redis health could not be read", exc_info=True)
    if getattr(user, "is_staff", False):
        try:
            out["silences"] = execd_silences()
        except Exception:  # noqa: BLE001
            log.warning("execd silences could not be read", exc_info=True)
    return out
