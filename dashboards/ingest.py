"""Turning what the scheduler and the runners say into database rows.

Three sources, each idempotent:

* ``apply_qstat_poll``: one ``qstat -xml -u '*'`` snapshot, diffed against the
  active tasks in the database; only changes are written and pushed.
* ``ingest_accounting``: the accounting file read from its (inode, offset)
  checkpoint; records upserted on DESIGN.md's identity; a task becomes
  ``done``/``failed`` once it is gone from qstat and its record is read.
* ``ingest_runner_records``: the runner's JSON records in the spool (stages).

Re-running any of them over the same input gives the same database.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import os
import uuid
from decimal import Decimal
import time
from pathlib import Path
from typing import Iterable

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from dashboards import bulk, clusters, enqueue, realtime
from dashboards.models import (
    CAMPAIGN_LIVE, CAMPAIGN_TRANSITIONS, AccountingRecord, Campaign, CampaignStatus, Cluster, IngestCheckpoint,
    ModelRequest, QuarantinedLine, Task, TaskEvent, transition,
)
from execution.spool.contract import TOKEN_FIELDS, RecordError, RecordVersionError, SpoolError
from execution.spool.files import JsonLinesStats, iter_json_lines, make_private_dirs
from execution.spool.layout import SpoolLayout
from execution.spool.record import RunnerRecord, parse_stage_time
from schedulers.base import AccountingCursor, AccountingMissing, QstatTask, SchedulerAdapter, diff_tasks
from schedulers.base import AccountingRecord as ParsedRecord
from schedulers.gridengine.parsers.accounting import usage_group_values

log = logging.getLogger(__name__)

CHUNK = 900  # stays under SQLite's 999 bound parameters per IN (...)
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


def _chunks(items: list, size: int = CHUNK) -> Iterable[list]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def _campaigns_by_job(cluster: Cluster, job_numbers: Iterable[int]) -> dict[int, int]:
    """Campaign ids of unfinished campaigns, by their array job number."""
    found: dict[int, int] = {}
    for chunk in _chunks(sorted(set(job_numbers))):
        for pk, job in Campaign.objects.filter(cluster=cluster, job_number__in=chunk).exclude(
            status="finished"
        ).values_list("pk", "job_number"):
            found[job] = pk
    return found


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
                for chunk in _chunks(sorted(task_numbers)):
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
        campaign_of = _campaigns_by_job(cluster, (k[0] for k in new_keys)) if new_keys else {}
        events: list[tuple] = []  # (task_id, from_state, to_state, state_code) as EVENT_FIELDS
        if new_keys:
            # One prepared insert (dashboards.bulk): a queued array of 50,000 tasks appearing took
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
            for chunk in _chunks(ids):
                Task.objects.filter(pk__in=chunk).update(priority=priority)
        changed_rows += reprioritized
        if gone_rows:
            # Every gone row gets the same two values: one UPDATE per chunk, not bulk_update's CASE per row.
            for chunk in _chunks([r.id for r in gone_rows]):
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
            _finalize_finishing(cluster, [r.id for r in gone_rows])
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


# --- accounting -------------------------------------------------------------------------


_us = bulk.epoch_us

#: The ``usage_patterns`` group and line prefix of tco's token totals in an OCS/GCS 9 accounting
#: record: ``reporting_params usage_patterns=tco:tco_*`` puts the ``tco_<bucket>=<n>`` lines that
#: execution/usage_epilog.py copies into the job's usage file into ``usage.tco`` (sge_conf(5) of OCS 9).
USAGE_GROUP = "tco"
USAGE_PREFIX = "tco_"


@dataclasses.dataclass
class IngestResult:
    """What one ingest call did. ``accepted`` counts new records, ``duplicates`` records already stored."""

    accepted: int = 0
    duplicates: int = 0
    quarantined: int = 0
    deferred_bytes: int = 0
    reset: str | None = None
    finalized: int = 0
    batches: int = 0
    error: str = ""


def _accounting_error_set(cluster: Cluster, message: str) -> None:
    """Record (or, with ``""``, clear) the accounting failure on the cluster; push a change when it changes."""
    if (cluster.accounting_error or "") == message:
        return
    now = timezone.now()
    Cluster.objects.filter(pk=cluster.pk).update(accounting_error=message[:2000],
                                                 accounting_error_at=now if message else None)
    cluster.accounting_error, cluster.accounting_error_at = message[:2000], now if message else None
    realtime.queue_changed(cluster.name)


def ingest_accounting(cluster: Cluster, *, path: str | None = None, max_bytes: int = 2 * 1024 * 1024,
                      time_budget_s: float = 20.0, scheduler: SchedulerAdapter | None = None) -> IngestResult:
    """Read the accounting records after the checkpoint and store them, batch after batch.

    The records come from the cluster's adapter (``scheduler``, else
    ``clusters.scheduler_for(cluster)``; ``path`` reads that accounting file
    instead of the cluster's), ``SchedulerAdapter.accounting_since``.

    Each batch (``max_bytes`` of the file, whole lines) is one transaction
    that also moves the checkpoint (inode, offset), so a crash at any point
    re-reads from the old checkpoint and the identity constraint drops what
    was already stored: the same database either way. Reads until the file is
    caught up or ``time_budget_s`` seconds have passed (the rest waits for
    the next call). Memory stays flat: one batch at a time.

    A missing or unreadable accounting file is a loud error, never "nothing
    to read": it is logged, returned in ``result.error`` and recorded on the
    cluster (``Cluster.accounting_error``, shown on the queue page after the
    next push); the first pass that reads the file clears it. (A Grid Engine
    cell has the file from its first finished job on; a wrong path or flavour,
    e.g. ``common/accounting`` on an OCS 9 cell that writes
    ``common/accounting.jsonl``, would otherwise ingest nothing, silently.)
    """
    path = path or cluster.accounting_path
    scheduler = scheduler or clusters.scheduler_for(cluster, accounting_path=path)
    result = IngestResult()
    checkpoint, _ = IngestCheckpoint.objects.get_or_create(cluster=cluster, source="accounting",
                                                           defaults={"path": path})
    deadline = time.monotonic() + time_budget_s
    while True:
        # Rotation (the rest of the rotated file first), truncation and regrowth (fingerprint of the
        # first bytes): the adapter's accounting_since, schedulers/accounting_cursor.py.
        cursor = (AccountingCursor(inode=checkpoint.inode, offset=checkpoint.offset,
                                   fingerprint=checkpoint.fingerprint) if checkpoint.inode else None)
        try:
            batch = scheduler.accounting_since(cursor, max_bytes)
        except AccountingMissing as exc:
            result.error = (f"accounting not read: {exc}. Check the cluster's accounting file "
                            f"(flavour {cluster.flavour}; manage.py tco_doctor names the fix)")
            log.error("cluster %s: %s", cluster.name, result.error)
            _accounting_error_set(cluster, result.error)
            return result
        if result.batches == 0:
            _accounting_error_set(cluster, "")
        result.batches += 1
        result.deferred_bytes = batch.deferred_bytes
        result.reset = result.reset or batch.reset
        with transaction.atomic():
            accepted, finalized = _store_records(cluster, batch.records)
            result.accepted += accepted
            result.duplicates += len(batch.records) - accepted
            result.finalized += finalized
            if batch.quarantined:
                QuarantinedLine.objects.bulk_create(
                    [
                        QuarantinedLine(cluster=cluster, path=path, inode=batch.cursor.inode, offset=q.offset,
                                        raw=bytes(q.raw[:65536]), reason=q.reason[:255])
                        for q in batch.quarantined
                    ],
                    ignore_conflicts=True,
                )
                result.quarantined += len(batch.quarantined)
                for q in batch.quarantined:
                    log.warning("accounting line at byte %s quarantined: %s", q.offset, q.reason)
            moved = (batch.cursor.inode, batch.cursor.offset) != (checkpoint.inode, checkpoint.offset)
            checkpoint.path = path
            checkpoint.inode = batch.cursor.inode
            checkpoint.offset = batch.cursor.offset
            checkpoint.fingerprint = batch.cursor.fingerprint
            checkpoint.accepted += accepted
            checkpoint.quarantined += len(batch.quarantined)
            checkpoint.resets += 1 if batch.reset else 0
            checkpoint.save()
        if not moved or not (batch.records or batch.quarantined or batch.skipped) or time.monotonic() > deadline:
            return result


def _store_records(cluster: Cluster, records: list[ParsedRecord]) -> tuple[int, int]:
    """Insert ``records`` (skipping identities already stored), link them to tasks, end finished tasks.

    Returns (records inserted, tasks ended). The insert is
    ``dashboards.bulk.store_accounting_records``: ``INSERT ... ON CONFLICT DO
    NOTHING`` on the identity constraint (SQLite), COPY into a staging table
    then one such INSERT (PostgreSQL); no model instance per record.
    """
    if not records:
        return 0, 0
    touched, task_of = _attach_records(cluster, records)
    tokens = {i: t for i, r in enumerate(records) if r.usage and (t := accounting_tokens(r.usage))}
    inserted = bulk.store_accounting_records(cluster, records, task_of, tokens=tokens)
    if tokens:
        check_accounting_tokens({task_of[i] for i in tokens if i in task_of})
    return inserted, _finalize_finishing(cluster, touched)


def accounting_tokens(usage: dict) -> dict[str, int]:
    """Token totals per bucket of an accounting record's flexible-accounting ``usage``.

    ``usage`` is a parsed record's ``usage`` (``{"tco": {"tco_input_tokens":
    1200.0, ...}}``, OCS 9 JSON). Returns ``{"input_tokens": 1200, ...}``
    (tokens) for the buckets of the spool contract (``TOKEN_FIELDS``:
    ``TOKEN_BUCKETS`` and ``reasoning_tokens``) that the group holds as a
    whole, non-negative number; the runner's other lines (``tco_requests``,
    ``tco_cost_usd`` ...) are not tokens and are left in ``usage``. ``{}``
    without the group (SGE 8, a cell without ``usage_patterns``).
    """
    values = usage_group_values(usage, USAGE_GROUP, USAGE_PREFIX)
    return {bucket: int(values[bucket]) for bucket in TOKEN_FIELDS
            if bucket in values and values[bucket] >= 0 and float(values[bucket]).is_integer()}


def _bucket_label(bucket: str) -> str:
    return bucket.removesuffix("_tokens").replace("_", " ") + " tokens"


def token_check(accounting: dict[str, int], metering: dict | None) -> dict | None:
    """Compare an accounting record's token totals with tco's own metering of the task.

    ``accounting`` is :func:`accounting_tokens` of the record; ``metering``
    the runner record's ``usage`` (the metering proxy's totals, the same
    numbers the runner wrote to ``<task>.usage``), or None when the runner
    record has none. Returns None when there is nothing to compare, else
    ``{"status": "confirmed" | "differs", "buckets": {bucket: {"accounting":
    n, "metering": n}}, "message": str}``: every bucket the record carries is
    compared (a bucket metering lacks counts 0); ``message`` reads e.g.
    ``"accounting says 1,200 input tokens, metering 1,150"``.
    """
    if not accounting or not isinstance(metering, dict):
        return None
    buckets, differ = {}, []
    for bucket, count in accounting.items():
        metered = metering.get(bucket) or 0
        metered = int(metered) if isinstance(metered, (int, float)) and not isinstance(metered, bool) else 0
        buckets[bucket] = {"accounting": count, "metering": metered}
        if count != metered:
            differ.append(f"accounting says {count:,} {_bucket_label(bucket)}, metering {metered:,}")
    if differ:
        return {"status": "differs", "buckets": buckets, "message": "; ".join(differ)}
    said = ", ".join(f"{c:,} {_bucket_label(b)}" for b, c in accounting.items())
    return {"status": "confirmed", "buckets": buckets, "message": f"accounting confirms metering: {said}"}


def check_accounting_tokens(task_ids: Iterable[int]) -> int:
    """Store on each task the check of its accounting record's tokens against its runner record.

    For every task in ``task_ids`` whose latest master accounting record
    (highest end time) carries tokens and whose runner record is read, sets
    ``Task.accounting_check`` to :func:`token_check`'s result (the agent page
    shows it: a difference is flagged, equal totals are shown as confirmed).
    Called after accounting records are stored and after a runner record is,
    whichever comes last. Returns the number of tasks whose check changed.
    """
    changed = 0
    for chunk in _chunks(sorted(set(task_ids))):
        latest: dict[int, dict] = {}
        for task_id, tokens in (AccountingRecord.objects.filter(task_id__in=chunk, pe_taskid="")
                                .order_by("end_us", "id").values_list("task_id", "tokens")):
            if tokens:
                latest[task_id] = tokens
        if not latest:
            continue
        for task in Task.objects.filter(pk__in=list(latest)).only("id", "runner_record", "accounting_check"):
            check = token_check(latest[task.pk], (task.runner_record or {}).get("usage"))
            if check is not None and check != task.accounting_check:
                Task.objects.filter(pk=task.pk).update(accounting_check=check)
                changed += 1
                if check["status"] == "differs":
                    log.warning("task %s: %s", task.pk, check["message"])
    return changed


def _attach_records(cluster: Cluster, records: list[ParsedRecord]) -> tuple[list[int], dict[int, int]]:
    """Find each master record's task: returns (active task ids touched, {record index: task id}).

    A record belongs to the active task with its (job_number, task_number)
    and a matching submission time, or to an ended one with the same
    submission time (a record read late, after the task was declared lost).
    A campaign task tco never saw in qstat (it ran between two polls) is made
    ended at once; records of other unseen jobs are stored without a task
    (bills read them directly). Several records with one submission time are
    retried starts of one task: the latest decides its state.
    """
    masters = [(i, r) for i, r in enumerate(records) if not r.pe_taskid]
    if not masters:
        return [], {}
    jobs = sorted({r.job_number for _, r in masters})
    tasks: dict[tuple[int, int], list[Task]] = {}
    for chunk in _chunks(jobs):
        for task in Task.objects.filter(cluster=cluster, job_number__in=chunk).only(
            "id", "job_number", "task_number", "active", "submitted_at", "restarted"
        ):
            tasks.setdefault((task.job_number, task.task_number), []).append(task)
    campaign_of = _campaigns_by_job(cluster, jobs)
    touched: list[int] = []
    task_of: dict[int, int] = {}
    unseen: dict[tuple, tuple[Task, ParsedRecord]] = {}
    links: list[tuple[int, tuple]] = []
    rescheduled: set[int] = set()  # tasks given a "rescheduling" record in this batch
    for i, r in masters:
        key = (r.job_number, r.task_number or 0)
        candidates = tasks.get(key)
        task = None
        if candidates:
            task = next((t for t in candidates if t.active and _same_submission(t.submitted_at, r.submitted_at)),
                        None)
            if task is None:
                task = next((t for t in candidates if t.submitted_at == r.submitted_at), None)
            if task is None:
                task = next((t for t in candidates if t.active and _rerun_of(t, r, rescheduled)), None)
        if task is not None:
            task_of[i] = task.id
            if r.failed == RESCHEDULED:
                rescheduled.add(task.id)
            if task.active:
                touched.append(task.id)
            continue
        campaign_id = campaign_of.get(r.job_number)
        if campaign_id is None:
            continue
        ident = (*key, _us(r.submitted_at))
        if ident not in unseen or _us(r.ended_at) >= _us(unseen[ident][1].ended_at):
            task = unseen[ident][0] if ident in unseen else Task(
                cluster=cluster, campaign_id=campaign_id, job_number=r.job_number, task_number=key[1],
                is_array=key[1] != 0, name=r.job_name[:255], owner=r.owner[:64], project=(r.project or "")[:64],
                slots=r.slots, first_seen_at=timezone.now(),
            )
            _apply_record(task, r)
            unseen[ident] = (task, r)
        links.append((i, ident))
    if unseen:
        created = [t for t, _ in unseen.values()]
        Task.objects.bulk_create(created, batch_size=1000)
        if any(t.id is None for t in created):  # backends that return no ids from bulk inserts
            for t in created:
                t.id = Task.objects.filter(cluster=cluster, job_number=t.job_number, task_number=t.task_number,
                                           submitted_at=t.submitted_at, active=False).values_list("id", flat=True).last()
        _finish_campaigns({t.campaign_id for t in created})
    for i, ident in links:
        task_of[i] = unseen[ident][0].id
    return touched, task_of


RESCHEDULED = 25  # accounting(5) "failed": rescheduling (the qmaster reruns the task, e.g. its host was lost)


def _rerun_of(task: Task, rec: ParsedRecord, rescheduled: set[int]) -> bool:
    """Whether ``rec`` can be a later attempt of the active ``task`` rerun by the scheduler.

    A rerun (``-r y``, its host lost) keeps the job and task number, but its
    record's submission time (``qsub_time``) is when the qmaster rescheduled
    it, after the task's own. So a record submitted later belongs to the task
    when the task is known to be rerun: qstat showed it restarted (``R``), or
    a "rescheduling" record (``failed`` 25) is already linked to it.
    """
    if rec.submitted_at is None or task.submitted_at is None or rec.submitted_at < task.submitted_at:
        return False
    return (task.restarted or task.id in rescheduled
            or AccountingRecord.objects.filter(task_id=task.id, failed=RESCHEDULED).exists())


def _same_submission(seen: dt.datetime | None, recorded: dt.datetime | None) -> bool:
    """Whether a task and a record can be one job despite a wrapped job number.

    tco notes a campaign task's submission time when DRMAA returns, a little
    after the qmaster's; 5 s covers that without matching a job from another wrap.
    """
    return seen is None or recorded is None or abs((seen - recorded).total_seconds()) <= 5


def _apply_record(task: Task, rec: AccountingRecord) -> None:
    """Make ``task`` ended, as its (latest) accounting record says: done or failed."""
    task.state = "done" if rec.failed == 0 and rec.exit_status == 0 else "failed"
    task.active = False
    task.submitted_at = rec.submitted_at or task.submitted_at
    task.started_at = rec.started_at or task.started_at
    # A failed start writes all-zero times: fall back to when qstat lost it.
    task.ended_at = rec.ended_at or task.gone_at
    task.queue = rec.queue
    task.host = rec.hostname
    task.wallclock_s = rec.wallclock_s
    task.cpu_s = rec.cpu_s
    task.maxvmem_bytes = rec.maxvmem_bytes
    task.failed_code = rec.failed
    task.exit_status = rec.exit_status


def _of_last_attempt(rec: AccountingRecord, task: Task) -> bool:
    """Whether ``rec`` can be the end of the last attempt of ``task`` that qstat showed.

    A task rerun elsewhere (``-r y``, its host lost) has one record per
    attempt; the record of an earlier attempt (``failed`` 25 "rescheduling",
    all-zero times) must not end the task while the last attempt's record is
    still to come. A task last seen running since ``started_at`` is ended
    only by a record that ended after that start (1 s of clock slack); one
    never seen running, by any record.
    """
    if task.started_at is None:
        return True
    return bool(rec.end_us) and rec.end_us >= _us(task.started_at) - 1_000_000


def _finalize_finishing(cluster: Cluster, task_ids: list[int]) -> int:
    """Tasks gone from qstat whose accounting record is read become ``done`` or ``failed``.

    A task still in qstat keeps its scheduler state even if a record arrived
    (a start that failed and is retried writes a record and runs again), and
    only a record of its last attempt ends it (:func:`_of_last_attempt`);
    until that record comes it stays ``finishing``.
    """
    finalized = 0
    campaigns: set[int] = set()
    now = timezone.now()
    for chunk in _chunks(sorted(set(task_ids))):
        # Only tasks with an accounting record can end here; a deleted queued array has none, and
        # loading its 50,000 rows to learn that took seconds of the poll. The records are read once.
        records = list(AccountingRecord.objects.filter(task_id__in=chunk, pe_taskid="").order_by("end_us"))
        if not records:
            continue
        tasks = list(Task.objects.filter(pk__in=sorted({r.task_id for r in records}), state="finishing"))
        if not tasks:
            continue
        latest: dict[int, AccountingRecord] = {}
        by_id = {t.id: t for t in tasks}
        for rec in records:
            task = by_id.get(rec.task_id)
            if task is not None and _of_last_attempt(rec, task):
                latest[rec.task_id] = rec
        events = []
        done = []
        for task in tasks:
            rec = latest.get(task.id)
            if rec is None:
                continue
            previous = task.state
            _apply_record(task, rec)
            events.append(TaskEvent(task_id=task.id, at=now, from_state=previous, to_state=task.state))
            done.append(task)
            if task.campaign_id:
                campaigns.add(task.campaign_id)
        Task.objects.bulk_update(
            done,
            ["state", "active", "submitted_at", "started_at", "ended_at", "queue", "host", "wallclock_s", "cpu_s",
             "maxvmem_bytes", "failed_code", "exit_status"],
            batch_size=1000,
        )
        TaskEvent.objects.bulk_create(events)
        finalized += len(done)
    if finalized:
        _finish_campaigns(campaigns)
        realtime.queue_changed(cluster.name, campaigns)
    return finalized


#: Active task states in which a campaign counts as running (its job holds slots or is leaving them).
_RUNNING_STATES = frozenset({"starting", "running", "suspended", "deleting", "unknown", "finishing"})


def campaign_status_of(states: dict[str, int], *, waits_for_predecessor: bool = False) -> str | None:
    """A submitted campaign's status from its active tasks' states (``{state: n}``):
    ``running`` when one runs (or is finishing), else, when tasks are held and none is pending,
    ``waiting`` if they wait for the campaign's ``-hold_jid_ad`` predecessor
    (``waits_for_predecessor``: ``control.waits_for_predecessor``) or ``paused``, else
    ``submitted``; None when no task is active (finishing is ingest's)."""
    if not any(states.values()):
        return None
    if any(states.get(s) for s in _RUNNING_STATES):
        return CampaignStatus.RUNNING
    if states.get("held") and not states.get("pending"):
        return CampaignStatus.WAITING if waits_for_predecessor else CampaignStatus.PAUSED
    return CampaignStatus.SUBMITTED


def campaign_status_follow(campaign_ids: Iterable[int]) -> int:
    """Move submitted, running and paused campaigns to the status their active tasks imply
    (:func:`campaign_status_of`), through ``CAMPAIGN_TRANSITIONS``; returns how many moved."""
    ids = sorted(set(campaign_ids))
    moved = 0
    for chunk in _chunks(ids):
        current = dict(Campaign.objects.filter(pk__in=chunk, status__in=CAMPAIGN_LIVE).values_list("pk", "status"))
        states: dict[int, dict[str, int]] = {}
        for pk, state in Task.objects.filter(campaign_id__in=list(current), active=True).values_list(
                "campaign_id", "state"):
            by = states.setdefault(pk, {})
            by[state] = by.get(state, 0) + 1
        waiting = _waiting_for_predecessor([pk for pk in current if states.get(pk, {}).get("held")])
        for pk, status in current.items():
            target = campaign_status_of(states.get(pk, {}), waits_for_predecessor=pk in waiting)
            if target is not None and target != status:
                moved += transition(Campaign.objects.filter(pk=pk), field="status", transitions=CAMPAIGN_TRANSITIONS,
                                    source=status, target=target)
    return moved


def _waiting_for_predecessor(campaign_ids: list[int]) -> set[int]:
    """Those of ``campaign_ids`` (campaigns with held tasks) whose held tasks wait for their
    ``-hold_jid_ad`` predecessor, not for a release (``control.waits_for_predecessor``)."""
    from .control import tco_holds

    by_cluster: dict[int, list[Campaign]] = {}
    for campaign in (Campaign.objects.filter(pk__in=campaign_ids, predecessor_job__isnull=False,
                                             job_number__isnull=False).select_related("launched_by")):
        by_cluster.setdefault(campaign.cluster_id, []).append(campaign)
    out: set[int] = set()
    for cluster_id, campaigns in by_cluster.items():
        held = tco_holds(Cluster(pk=cluster_id), campaigns)
        out |= {c.pk for c in campaigns if c.job_number not in held}
    return out


def _finish_campaigns(campaign_ids: set[int]) -> None:
    campaign_status_follow(campaign_ids)
    now = timezone.now()
    for campaign_id in campaign_ids:
        if not Task.objects.filter(campaign_id=campaign_id, active=True).exists():
            # The conditional update succeeds once per campaign: only that caller sends the notice.
            if transition(Campaign.objects.filter(pk=campaign_id), field="status", transitions=CAMPAIGN_TRANSITIONS,
                          source=CAMPAIGN_LIVE, target=CampaignStatus.FINISHED, finished_at=now):
                transaction.on_commit(lambda pk=campaign_id: _notify_finished(pk))


def _notify_finished(campaign_id: int) -> None:
    """Queue the "campaign finished" notice (e-mail, budget check) on the ingest workers."""
    try:
        enqueue.send(enqueue.NOTIFY_CAMPAIGN_FINISHED, campaign_id, queue="ingest")
    except Exception:  # noqa: BLE001 - the broker being down must not undo an ingest; the page shows it anyway
        log.warning("could not queue the finished notice of campaign %s", campaign_id, exc_info=True)


def reconcile_gone_tasks(cluster: Cluster, *, now: dt.datetime | None = None) -> int:
    """Decide tasks gone from qstat whose accounting record never came.

    A task that never started is ``deleted`` (it costs nothing) after
    ``TCO_DELETED_GRACE_S``; one that did start is ``lost`` after
    ``TCO_LOST_GRACE_S``. Returns how many.
    """
    now = now or timezone.now()
    _finalize_finishing(cluster, list(Task.objects.filter(cluster=cluster, state="finishing",
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
        _finish_campaigns(campaigns)
        if stale:
            realtime.queue_changed(cluster.name, campaigns)
    return len(stale)


# --- runner records --------------------------------------------------------------------

#: Request rows kept per task (the totals count every request); ``TCO_REQUESTS_KEPT_PER_TASK`` overrides.
REQUESTS_KEPT_PER_TASK = 10_000
#: A request record (one line of ``<task>.requests.jsonl``) longer than this is skipped unread.
REQUEST_LINE_CAP_BYTES = 1 << 20
#: A claim older than this (seconds) belonged to an ingester that died: another one takes it over.
CLAIM_STALE_S = 600.0


@dataclasses.dataclass
class RunnerIngestResult:
    """What one :func:`ingest_runner_records` round did, in records (``requests_skipped``: request rows).

    ``ingested``: stored on their task and moved to ``ingested/``;
    ``waiting``: their task is not known yet, left for the next round;
    ``quarantined``: refused and moved to ``quarantine/`` (malformed, or of an
    unknown version), never stored; ``unknown_version``: how many of those
    were refused for their version alone; ``raced``: taken by another
    ingester first (not an error); ``requests_skipped``: request records not
    kept as rows (over ``TCO_REQUESTS_KEPT_PER_TASK``, or a line over
    :data:`REQUEST_LINE_CAP_BYTES`).
    """

    ingested: int = 0
    waiting: int = 0
    quarantined: int = 0
    unknown_version: int = 0
    raced: int = 0
    requests_skipped: int = 0

    def as_dict(self) -> dict[str, int]:
        """The counts as a mapping (the worker task's result)."""
        return dataclasses.asdict(self)


def ingest_runner_records(cluster: Cluster, *, spool: Path | str | None = None,
                          requests_kept: int | None = None) -> RunnerIngestResult:
    """Store the stages and model requests of every runner record in the spool, then move it aside.

    Records are read through the spool contract (execution/spool.py,
    ``RunnerRecord``). A record joins its task by (campaign id, task number,
    job number). One that is malformed or of a version not in
    ``RECORD_VERSIONS_READ`` goes to ``<spool>/quarantine`` and is counted; one
    whose task is not known yet stays for the next round.

    Safe with several ingesters at once (workers, commands): each record is
    first claimed by an atomic rename (the loser of a race skips it), and the
    task's row is locked while its fields and requests are replaced, so a
    record stored twice (a claim taken over from a dead ingester) gives the
    same rows as once. ``<task>.requests.jsonl`` is streamed in bounded
    chunks: at most ``requests_kept`` (default ``TCO_REQUESTS_KEPT_PER_TASK``)
    rows are kept per task, the totals count every request.
    """
    layout = SpoolLayout(spool or settings.TCO_SPOOL_DIR)
    kept = requests_kept if requests_kept is not None else getattr(settings, "TCO_REQUESTS_KEPT_PER_TASK",
                                                                   REQUESTS_KEPT_PER_TASK)
    result = RunnerIngestResult()
    token = f"{os.uname().nodename}-{os.getpid()}-{uuid.uuid4().hex[:12]}"
    campaigns: set[int] = set()
    for path in layout.record_files() + layout.stale_claims(CLAIM_STALE_S):
        claim = layout.claim_name(path, token)
        try:
            os.rename(path, claim)
        except FileNotFoundError:
            result.raced += 1  # another ingester has it
            continue
        folder, name = os.path.basename(os.path.dirname(path)), layout.unclaimed_name(path)
        try:
            campaign_id = _ingest_claimed(cluster, claim, layout, kept, result)
        except RecordVersionError as exc:
            log.warning("runner record %s/%s quarantined: %s", folder, name, exc)
            result.quarantined += 1
            result.unknown_version += 1
            _move(claim, layout.quarantine_path(folder, name))
            continue
        except (RecordError, SpoolError, ValueError, KeyError, TypeError, OSError, ArithmeticError) as exc:
            log.warning("runner record %s/%s quarantined: %s", folder, name, exc)
            result.quarantined += 1
            _move(claim, layout.quarantine_path(folder, name))
            continue
        except BaseException:
            _release(claim, os.path.join(os.path.dirname(path), name))  # e.g. the database is down: retry later
            raise
        if campaign_id is None:
            result.waiting += 1
            _release(claim, os.path.join(os.path.dirname(path), name))
            continue
        result.ingested += 1
        campaigns.add(campaign_id)
        _move(claim, layout.ingested_path(folder, name))
    if result.quarantined:
        log.warning("runner records: %d quarantined (%d of an unknown version)", result.quarantined,
                    result.unknown_version)
    if campaigns:
        realtime.queue_changed(cluster.name, campaigns)
    return result


def _ingest_claimed(cluster: Cluster, claim: str, layout: SpoolLayout, kept: int,
                    result: RunnerIngestResult) -> int | None:
    """Store one claimed record on its task. Returns its campaign id, or None when the task is not
    known yet. Raises RecordError/RecordVersionError/ValueError/OSError for a record to quarantine."""
    record = RunnerRecord.read(claim)
    campaign_id = int(record.campaign_id)
    stages = record.stage_times()
    try:
        requests = _request_rows(record, layout, kept)
    except (ValueError, KeyError, TypeError, OSError, ArithmeticError) as exc:
        raise RecordError(f"its requests cannot be read: {exc}") from exc
    totals = requests.totals()
    totals["verdict"] = _declared_verdict(record, layout)
    data = record.to_json()
    data["ingest"] = {"requests": requests.seen, "requests_kept": len(requests.rows),
                      "requests_skipped": requests.skipped}
    tasks = Task.objects.filter(cluster=cluster, campaign_id=campaign_id, task_number=record.task_number)
    if record.job_number is not None:
        tasks = tasks.filter(job_number=record.job_number)
    with transaction.atomic():
        # The row lock orders two ingesters of one task (PostgreSQL; SQLite takes its write lock
        # at BEGIN IMMEDIATE): the second one's delete sees the first one's rows.
        task_id = tasks.select_for_update().order_by("-id").values_list("id", flat=True).first()
        if task_id is None:
            return None
        Task.objects.filter(pk=task_id).update(runner_record=data, **stages, **totals)
        ModelRequest.objects.filter(task_id=task_id).delete()
        for row in requests.rows:
            row.task_id = task_id
        ModelRequest.objects.bulk_create(requests.rows, batch_size=1000)
        check_accounting_tokens([task_id])
    if requests.skipped:
        log.warning("runner record of task %s.%s: %d request records not kept as rows", campaign_id,
                    record.task_number, requests.skipped)
    result.requests_skipped += requests.skipped
    return campaign_id


@dataclasses.dataclass
class _Requests:
    """The request rows kept of one task and the sums over all of its requests."""

    rows: list[ModelRequest] = dataclasses.field(default_factory=list)
    seen: int = 0
    skipped: int = 0
    unreadable: int = 0
    tokens: dict[str, int] = dataclasses.field(default_factory=lambda: dict.fromkeys(TOKEN_FIELDS, 0))
    cost_usd: Decimal = Decimal(0)
    unpriced: bool = False
    flags: set[str] = dataclasses.field(default_factory=set)

    def add(self, row: ModelRequest, keep: bool) -> None:
        self.seen += 1
        for name in TOKEN_FIELDS:
            self.tokens[name] += getattr(row, name)
        if row.cost_usd is None:
            self.unpriced = self.unpriced or any(getattr(row, b) for b in TOKEN_FIELDS)
        else:
            self.cost_usd += row.cost_usd
        self.flags.update(row.flags)
        if keep:
            self.rows.append(row)
        else:
            self.skipped += 1

    def totals(self) -> dict:
        """A task's token buckets and cost: the sum over its requests.

        The cost is None (never 0) when any request with tokens has no price,
        or there was no request; the flags of every request are kept, once
        each, with ``requests_not_kept`` when rows were left out and
        ``requests_unreadable`` when a request record was too long to read
        (its tokens are then missing from the sums).
        """
        flags = set(self.flags)
        if self.skipped > self.unreadable:
            flags.add("requests_not_kept")
        if self.unreadable:
            flags.add("requests_unreadable")
        cost = None if self.unpriced or not self.seen else self.cost_usd
        return {**self.tokens, "cost_usd": cost, "usage_flags": sorted(flags)}


def _request_rows(record: RunnerRecord, layout: SpoolLayout, kept: int) -> _Requests:
    """The metering proxy's request records of one runner record: the first ``kept`` as unsaved rows,
    the sums over all.

    Records come inline (``requests``: a list) or in a JSON-lines file inside
    the spool (``requests_path``), streamed (execution/spool.py
    ``iter_json_lines``), in the shape of execution/metering/proxy.py:
    ``at, method, path, status, refused, model_requested, model_returned,
    usage {provider, buckets..., complete, flags}, cost_usd (text or None),
    latency_ms, complete, flags``. A path outside the spool is refused
    (ValueError).
    """
    out = _Requests()
    stats = JsonLinesStats()
    items: Iterable = record.requests or []
    if record.requests is None and record.requests_path:
        source = Path(record.requests_path).resolve()
        if Path(layout.root).resolve() not in source.parents:
            raise ValueError(f"requests_path {source} is outside the spool")
        items = iter_json_lines(source, max_line_bytes=REQUEST_LINE_CAP_BYTES, stats=stats)
    for seq, item in enumerate(items, start=1):
        out.add(_request_row(seq, item), keep=len(out.rows) < kept)
    out.unreadable = stats.too_long
    out.skipped += stats.too_long
    return out


def _request_row(seq: int, item: dict) -> ModelRequest:
    """One request record as an unsaved row. Raises KeyError/ValueError/TypeError/ArithmeticError."""
    usage = item.get("usage") or {}
    cost = item.get("cost_usd")
    flags = sorted({*(item.get("flags") or []), *(usage.get("flags") or [])})
    if item.get("refused"):
        flags.append(f"refused:{item['refused']}")
    return ModelRequest(
        seq=seq,
        at=parse_stage_time(item["at"]),
        provider=(usage.get("provider") or "")[:32],
        method=str(item.get("method") or "")[:8],
        path=str(item.get("path") or "")[:255],
        status=int(item.get("status") or 0),
        requested_model=(item.get("model_requested") or "")[:128],
        model=(item.get("model_returned") or usage.get("model") or "")[:128],
        cost_usd=Decimal(str(cost)) if cost is not None else None,
        complete=bool(item.get("complete", usage.get("complete", True))),
        latency_ms=item.get("latency_ms"),
        flags=flags,
        **{b: int(usage.get(b) or 0) for b in TOKEN_FIELDS},
    )


def _declared_verdict(record: RunnerRecord, layout: SpoolLayout) -> str:
    """The agent's verdict, when it declared a ``verdict.json`` output (``{"verdict": "..."}``).

    Read only inside the spool and only its first 64 KiB; anything else is "".
    """
    for output in record.outputs:
        if not isinstance(output, dict) or output.get("name") != "verdict.json":
            continue
        try:
            path = Path(output["path"]).resolve()
            if Path(layout.root).resolve() not in path.parents:
                return ""
            with open(path, "rb") as fh:
                verdict = json.loads(fh.read(65536)).get("verdict")
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return ""
        return verdict[:64] if isinstance(verdict, str) else ""
    return ""


def _move(src: str, dst: str) -> None:
    """Move a claimed record (ours alone) to ``dst``, replacing an older one there."""
    make_private_dirs(os.path.dirname(dst))  # 0700: the submit account's alone
    os.replace(src, dst)


def _release(claim: str, original: str) -> None:
    """Give a claimed record back for the next round. If the runner wrote a newer record of the task
    meanwhile, that one stays and the claimed (older) one is dropped, as the runner's own replace would."""
    try:
        os.link(claim, original)
    except FileExistsError:
        pass
    except FileNotFoundError:
        return
    os.unlink(claim)
