"""One ``qstat -xml -u '*'`` snapshot into the database: diffed against the active tasks, only changes written.

An older snapshot is never applied after a newer one
(``Cluster.poll_observed_at``). Re-applying a snapshot gives the same database.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import logging

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from dashboards.core import bulk, realtime
from dashboards.core.bulk import in_chunks
from dashboards.ingest.accounting import finalize_finishing
from dashboards.ingest.campaign_status import campaign_status_follow, campaigns_by_job, finish_campaigns
from dashboards.models import (
    Cluster,
    Task,
    TaskEvent,
)
from schedulers.base import QstatTask, diff_tasks

log = logging.getLogger(__name__)
POLL_FIELDS = ("state", "state_code", "restarted", "queue", "host", "slots", "priority", "started_at")
_PRIORITY = POLL_FIELDS.index("priority")
#: The columns a new task's row takes from its qstat task (bulk.insert_varying), in the row's order.
NEW_TASK_FIELDS = ("campaign_id", "job_number", "task_number", "is_array", "name", "owner", "project", "queue", "host",
                   "slots", "priority", "state", "state_code", "restarted", "submitted_at", "started_at")
EVENT_FIELDS = ("task_id", "from_state", "to_state", "state_code")


@dataclasses.dataclass
class PollChanges:
    """What one poll changed: counts, and the campaigns touched."""

    added: int = 0
    changed: int = 0
    gone: int = 0
    campaigns: set[int] = dataclasses.field(default_factory=set)
    #: Of ``changed`` and ``gone``: tasks whose state changed (started, ended...), not only their priority.
    state_changes: int = 0
    #: The snapshot was older than one applied already (another poller's): nothing was written.
    stale: bool = False

    @property
    def any(self) -> bool:
        return bool(self.added or self.changed or self.gone)


# cluster pk -> {task key: QstatTask} of the last poll this process applied.
_SNAPSHOTS: dict[int, dict[tuple[int, int], QstatTask]] = {}


def apply_qstat_poll(cluster: Cluster, tasks: list[QstatTask], *, observed_at: dt.datetime) -> PollChanges:
    """Write the difference between a qstat snapshot and the active tasks in the database.

    ``observed_at`` is when qstat was started: a task created after it (a
    campaign submitted while qstat ran) is not "gone" just because this
    snapshot predates it. Tasks gone from qstat become ``finishing`` until their
    accounting record is read. Returns the counts; pushes one change event.

    A snapshot whose qstat began before the last applied one's (``Cluster.poll_observed_at``) is
    not applied (``stale``): two pollers (two workers, or a worker and a command such as
    ``tco_replay_seed``'s loop) finishing out of order would otherwise write the older view over
    the newer one, e.g. give tasks that ended (rows made inactive by their accounting records)
    new active rows that then end "lost". The check is the transaction's first write, so pollers
    are ordered by the database's row lock (PostgreSQL) or write lock (SQLite).
    """
    changes = PollChanges()
    fields = ("id", "campaign_id", "job_number", "task_number", "first_seen_at", "submitted_at", *POLL_FIELDS)
    with transaction.atomic():
        advanced = Cluster.objects.filter(pk=cluster.pk).filter(
            Q(poll_observed_at__isnull=True) | Q(poll_observed_at__lt=observed_at)).update(poll_observed_at=observed_at)
        if not advanced:
            log.info("poll of cluster %s observed at %s not applied: a newer poll was applied first",
                     cluster.name, observed_at.isoformat())
            changes.stale = True
            return changes
        active = Task.objects.filter(cluster=cluster, active=True)
        cached = _SNAPSHOTS.get(cluster.pk)
        # The last snapshot this process applied is exactly the active tasks
        # not yet finishing, unless something else added tasks since (a
        # campaign submitted): then the count differs and we read them all.
        if cached is not None and active.exclude(state="finishing").count() == len(cached):
            diff = diff_tasks(cached, tasks)
            current = {t.key: t for t in (*diff.added, *diff.changed)}
            touched = set(current) | {t.key for t in diff.gone}
            existing = {}
            by_job: dict[int, list[int]] = {}
            for job, task in touched:
                by_job.setdefault(job, []).append(task)
            for job, task_numbers in by_job.items():
                for chunk in in_chunks(sorted(task_numbers)):
                    for row in active.filter(job_number=job, task_number__in=chunk).only(*fields):
                        existing[(row.job_number, row.task_number)] = row
            snapshot = diff.current
        else:
            existing = {(row.job_number, row.task_number): row for row in active.only(*fields)}
            current = snapshot = {t.key: t for t in tasks}
        # Dropped on rollback: the next poll then reads the database again.
        _SNAPSHOTS.pop(cluster.pk, None)
        transaction.on_commit(lambda: _SNAPSHOTS.__setitem__(cluster.pk, snapshot))
        new_keys = [k for k in current if k not in existing]
        campaign_of = campaigns_by_job(cluster, (k[0] for k in new_keys)) if new_keys else {}
        events: list[tuple] = []  # (task_id, from_state, to_state, state_code) as EVENT_FIELDS
        if new_keys:
            # One prepared insert (dashboards.core.bulk): a queued array of 50,000 tasks appearing took
            # bulk_create 14 s, and the live pages waited for this poll (bench_poll.py).
            rows = []
            for key in new_keys:
                t = current[key]
                rows.append((campaign_of.get(t.job_number), t.job_number, t.task_number or 0,
                             t.task_number is not None, t.name[:255], t.owner[:64], (t.project or "")[:64],
                             t.queue or "", t.host or "", t.slots, t.priority, t.state, t.state_code, t.restarted,
                             t.submitted_at, t.started_at))
            bulk.insert_varying(Task(cluster=cluster, first_seen_at=observed_at), NEW_TASK_FIELDS, rows)
            changes.added = len(rows)
            changes.campaigns.update(pk for pk in campaign_of.values())

        changed_rows: list[Task] = []
        reprioritized: list[Task] = []
        gone_rows: list[Task] = []
        for key, row in existing.items():
            t = current.get(key)
            if t is None:
                if row.state != "finishing" and (row.first_seen_at is None or row.first_seen_at < observed_at):
                    events.append((row.id, row.state, "finishing", ""))
                    row.state = "finishing"
                    row.gone_at = observed_at
                    gone_rows.append(row)
                continue
            new = (t.state, t.state_code, t.restarted, t.queue or "", t.host or "", t.slots, t.priority, t.started_at)
            old = tuple(getattr(row, f) for f in POLL_FIELDS)
            # tco's own submission time (when DRMAA returned) is a little after the qmaster's:
            # the scheduler's, once a poll shows it, replaces it (a queue wait is never negative).
            earlier = t.submitted_at is not None and (row.submitted_at is None or t.submitted_at < row.submitted_at)
            if new != old or earlier:
                if row.state != t.state:
                    events.append((row.id, row.state, t.state, t.state_code))
                # The share tree moves pending tasks' priorities at every scheduling run: those rows
                # get one UPDATE per priority value below, not the bulk update's CASE per row.
                only_priority = not earlier and all(a == b for i, (a, b) in enumerate(zip(new, old)) if i != _PRIORITY)
                for field, value in zip(POLL_FIELDS, new):
                    setattr(row, field, value)
                if earlier:
                    row.submitted_at = t.submitted_at
                (reprioritized if only_priority else changed_rows).append(row)
        if changed_rows:
            Task.objects.bulk_update(changed_rows, [*POLL_FIELDS, "submitted_at"], batch_size=1000)
        by_priority: dict[float, list[int]] = {}
        for row in reprioritized:
            by_priority.setdefault(row.priority, []).append(row.id)
        for priority, ids in by_priority.items():
            for chunk in in_chunks(ids):
                Task.objects.filter(pk__in=chunk).update(priority=priority)
        changed_rows += reprioritized
        if gone_rows:
            # Every gone row gets the same two values: one UPDATE per chunk, not bulk_update's CASE per row.
            for chunk in in_chunks([r.id for r in gone_rows]):
                Task.objects.filter(pk__in=chunk).update(state="finishing", gone_at=observed_at)
        changes.changed = len(changed_rows)
        changes.gone = len(gone_rows)
        changes.state_changes = len(events)
        for row in (*changed_rows, *gone_rows):
            if row.campaign_id:
                changes.campaigns.add(row.campaign_id)
        if events:
            bulk.insert_varying(TaskEvent(at=observed_at), EVENT_FIELDS, events)
        if gone_rows:
            finalize_finishing(cluster, [r.id for r in gone_rows])
        if changes.campaigns:
            campaign_status_follow(changes.campaigns)
        Cluster.objects.filter(pk=cluster.pk).update(polled_at=timezone.now(), poll_error="")
        if changes.any:
            realtime.queue_changed(cluster.name, changes.campaigns, observed_at=observed_at.timestamp())
    return changes


def record_poll_failure(cluster: Cluster, message: str) -> None:
    """A failed poll is recorded and shown; it never reads as an empty queue.

    ``poll_error_at`` is the first failure since the last good poll ("scheduler unreachable since T",
    dashboards/health.py); later failures only update the message.
    """
    now = timezone.now()
    Cluster.objects.filter(pk=cluster.pk, poll_error="").update(poll_error_at=now)
    Cluster.objects.filter(pk=cluster.pk).update(poll_error=message[:2000])
    realtime.queue_changed(cluster.name)


def reconcile_gone_tasks(cluster: Cluster, *, now: dt.datetime | None = None) -> int:
    """Decide tasks gone from qstat whose accounting record never came.

    A task that never started is ``deleted`` (it costs nothing) after
    ``TCO_DELETED_GRACE_S``; one that did start is ``lost`` after
    ``TCO_LOST_GRACE_S``. Returns how many.
    """
    now = now or timezone.now()
    finalize_finishing(cluster, list(Task.objects.filter(cluster=cluster, state="finishing",
                                                           accounting__isnull=False).values_list("id", flat=True)))
    # A task that never started writes no record: "deleted" after a short
    # wait (a start and end between two polls would have written one within
    # the accounting flush time); one that started gets the long grace.
    cutoff = now - dt.timedelta(seconds=settings.TCO_LOST_GRACE_S)
    never_started = now - dt.timedelta(seconds=settings.TCO_DELETED_GRACE_S)
    stale = list(Task.objects.filter(cluster=cluster, state="finishing").filter(
        Q(gone_at__lt=cutoff)
        | Q(gone_at__lt=never_started, started_at__isnull=True, task_started_at__isnull=True)
    ))
    campaigns: set[int] = set()
    events = []
    for task in stale:
        started = task.started_at is not None or task.task_started_at is not None
        task.state = "lost" if started else "deleted"
        task.active = False
        task.ended_at = task.gone_at
        events.append(TaskEvent(task_id=task.id, at=now, from_state="finishing", to_state=task.state))
        if task.campaign_id:
            campaigns.add(task.campaign_id)
    with transaction.atomic():
        Task.objects.bulk_update(stale, ["state", "active", "ended_at"], batch_size=1000)
        TaskEvent.objects.bulk_create(events)
        finish_campaigns(campaigns)
        if stale:
            realtime.queue_changed(cluster.name, campaigns)
    return len(stale)
