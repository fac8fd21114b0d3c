"""One ``qstat -xml -u '*'`` snapshot into the database: diffed against the active tasks, only changes written.

The snapshots applied follow each other in the scheduler's time: one is
applied only if its qstat began after the last applied one's answered
(``Cluster.poll_answered_at``). A task that has ended (its row inactive) is
never given a second row by a snapshot that still shows it: the same row is
taken up again when the scheduler shows a later attempt (a rerun), else the
snapshot is older than the end and the task is left ended (issue 23,
finding 11). Re-applying a snapshot gives the same database.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import logging

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from dashboards.core import bulk, realtime, rollups
from dashboards.core.chunks import in_chunks
from dashboards.ingest.accounting import RESCHEDULED, finalize_finishing, same_submission
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


def apply_qstat_poll(cluster: Cluster, tasks: list[QstatTask], *, observed_at: dt.datetime,
                     answered_at: dt.datetime | None = None) -> PollChanges:
    """Write the difference between a qstat snapshot and the active tasks in the database.

    ``observed_at`` is when qstat was started, ``answered_at`` when its answer
    was read (default: ``observed_at``, a snapshot of one instant): the
    scheduler's view is of some moment between the two. A task created after
    ``observed_at`` (a campaign submitted while qstat ran) is not "gone" just
    because this snapshot predates it. Tasks gone from qstat become
    ``finishing`` until their accounting record is read. Returns the counts;
    pushes one change event.

    A snapshot whose qstat began before the last applied one answered
    (``Cluster.poll_answered_at``) is not applied (``stale``): its view may be
    older than the one already written. Two pollers (two workers, or a worker
    and a command such as ``tco_replay_seed``'s loop) whose qstat calls overlap
    or finish out of order would otherwise write an older view over a newer
    one, e.g. show running a task that had ended (its row made inactive by its
    accounting record) and give it a second, active row that later ended
    "lost" (the seed replay's tasks 26.77 and 26.78: ordering by the start of
    qstat alone let a later-started but earlier-answered view through). The
    check is the transaction's first write, so pollers are ordered by the
    database's row lock (PostgreSQL) or write lock (SQLite).
    """
    answered_at = answered_at or observed_at
    changes = PollChanges()
    fields = ("id", "campaign_id", "job_number", "task_number", "first_seen_at", "submitted_at", *POLL_FIELDS)
    # One transaction whose rollup writes (tasks ended by their records) come last, after the campaigns'
    # and the cluster's rows (rollups' "Lock order"): an accounting batch takes them in that order too.
    with rollups.deferred():
        advanced = Cluster.objects.filter(pk=cluster.pk).filter(
            Q(poll_answered_at__lt=observed_at)
            | Q(poll_answered_at__isnull=True) & (Q(poll_observed_at__isnull=True) | Q(poll_observed_at__lt=observed_at))
        ).update(poll_observed_at=observed_at, poll_answered_at=max(answered_at, observed_at))
        if not advanced:
            log.info("poll of cluster %s observed at %s not applied: a poll that answered after it began was "
                     "applied first", cluster.name, observed_at.isoformat())
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
            # A task with an ended row is the same task, never a new row (issue 23, finding 11).
            resumed, kept_ended = _ended_rows_shown_again(cluster, current, new_keys, campaign_of, events)
            for row in resumed:
                existing[(row.job_number, row.task_number)] = row
                changes.changed += 1
                if row.campaign_id:
                    changes.campaigns.add(row.campaign_id)
            new_keys = [k for k in new_keys if k not in kept_ended and k not in existing]
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
            # ON CONFLICT DO NOTHING: the identity constraints (one active row per job and task, one row
            # per campaign task) drop a row that would double a task.
            inserted = bulk.insert_varying(Task(cluster=cluster, first_seen_at=observed_at), NEW_TASK_FIELDS, rows)
            changes.added = inserted if inserted >= 0 else len(rows)
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
            # One prepared UPDATE run for every row (bulk.update_by_pk): bulk_update's CASE per field and
            # row took 0.3 s of CPU for a wave of 96 tasks starting (bench_poll.py --series --step 96).
            changed_fields = (*POLL_FIELDS, "submitted_at")
            bulk.update_by_pk(Task, changed_fields,
                              [(row.id, *(getattr(row, f) for f in changed_fields)) for row in changed_rows])
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
        changes.changed += len(changed_rows)
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


def _shows_a_later_attempt(row: Task, shown: QstatTask) -> bool:
    """Whether ``shown`` (a task in a snapshot) is an attempt of the ended ``row``'s task that began
    after the row ended, rather than an older view of the attempt that ended: a row declared lost or
    deleted (nothing said the task ended: it is back), a start after the row's end, or a task
    restarted (``R``) after a "rescheduling" record (``failed`` 25) ended the row."""
    if row.state in ("lost", "deleted"):
        return True
    if shown.started_at is not None and row.ended_at is not None and shown.started_at > row.ended_at:
        return True
    return bool(shown.restarted and row.failed_code == RESCHEDULED)


def _same_attempt_or_job(row: Task, shown: QstatTask) -> bool:
    """Whether ``shown`` is ``row``'s job (the same submission time, both known) or attempt (the same
    start, within a second)."""
    if row.submitted_at is not None and shown.submitted_at is not None:
        return same_submission(row.submitted_at, shown.submitted_at)
    return (row.started_at is not None and shown.started_at is not None
            and abs((row.started_at - shown.started_at).total_seconds()) <= 1)


def _ended_rows_shown_again(cluster: Cluster, current: dict[tuple[int, int], QstatTask],
                            keys: list[tuple[int, int]], campaign_of: dict[int, int],
                            events: list[tuple]) -> tuple[list[Task], set[tuple[int, int]]]:
    """The tasks of ``keys`` (shown by the snapshot, no active row) that already have an ended row.

    A row is the same task when it belongs to the campaign that owns the job
    number now, or has the same submission time (both known: qstat gives none
    for a running task) or the same start (a job number reused by another job
    is a new task). Returns (rows taken up again,
    keys left ended): a row whose task the snapshot shows in a later attempt
    (:func:`_shows_a_later_attempt`) is made active with the shown state (an
    event for each is appended to ``events``); otherwise the snapshot is older
    than the task's end and the task stays ended, with no row added.
    """
    by_job: dict[int, list[int]] = {}
    for job, task in keys:
        by_job.setdefault(job, []).append(task)
    ended: dict[tuple[int, int], list[Task]] = {}
    for job, numbers in by_job.items():
        for chunk in in_chunks(sorted(numbers)):
            for row in Task.objects.filter(cluster=cluster, active=False, job_number=job, task_number__in=chunk):
                ended.setdefault((row.job_number, row.task_number), []).append(row)
    resumed: list[Task] = []
    kept: set[tuple[int, int]] = set()
    for key, rows in ended.items():
        shown = current[key]
        owner = campaign_of.get(key[0])
        same = [r for r in rows if owner is not None and r.campaign_id == owner
                or _same_attempt_or_job(r, shown)]
        if not same:
            continue  # another job that reused the number: a new task
        row = max(same, key=lambda r: r.id)
        if not _shows_a_later_attempt(row, shown):
            log.info("task %s.%s shown %s by a snapshot older than its end (%s): left ended", key[0], key[1],
                     shown.state, row.state)
            kept.add(key)
            continue
        events.append((row.id, row.state, shown.state, shown.state_code))
        for field, value in zip(POLL_FIELDS, (shown.state, shown.state_code, shown.restarted, shown.queue or "",
                                              shown.host or "", shown.slots, shown.priority, shown.started_at)):
            setattr(row, field, value)
        row.active, row.ended_at, row.gone_at, row.failed_code, row.exit_status = True, None, None, None, None
        Task.objects.filter(pk=row.pk, active=False).update(
            active=True, ended_at=None, gone_at=None, failed_code=None, exit_status=None,
            **{f: getattr(row, f) for f in POLL_FIELDS})
        resumed.append(row)
    return resumed, kept


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
    with rollups.deferred():  # the rollups written last, after the campaigns (rollups' "Lock order")
        with rollups.tasks_rolled(t.id for t in stale):  # lost tasks join the usage rollups
            Task.objects.bulk_update(stale, ["state", "active", "ended_at"], batch_size=1000)
        TaskEvent.objects.bulk_create(events)
        finish_campaigns(campaigns)
        if stale:
            realtime.queue_changed(cluster.name, campaigns)
    return len(stale)
