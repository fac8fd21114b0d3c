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
from pathlib import Path
from typing import Iterable

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from dashboards import enqueue, realtime
from dashboards.models import (
    AccountingRecord, Campaign, Cluster, IngestCheckpoint, ModelRequest, QuarantinedLine, Task, TaskEvent,
)
from execution.spool import (TOKEN_FIELDS, JsonLinesStats, RecordError, RecordVersionError, RunnerRecord,
                             SpoolError, SpoolLayout, iter_json_lines, parse_stage_time)
from schedulers.base import AccountingRecord as ParsedRecord
from schedulers.base import QstatTask

log = logging.getLogger(__name__)

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
CHUNK = 900  # stays under SQLite's 999 bound parameters per IN (...)
POLL_FIELDS = ("state", "state_code", "restarted", "queue", "host", "slots", "priority", "started_at")


@dataclasses.dataclass
class PollChanges:
    """What one poll changed: counts, and the campaigns touched."""

    added: int = 0
    changed: int = 0
    gone: int = 0
    campaigns: set[int] = dataclasses.field(default_factory=set)

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
    """
    from schedulers.qstat_xml import diff_tasks

    changes = PollChanges()
    fields = ("id", "campaign_id", "job_number", "task_number", "first_seen_at", "submitted_at", *POLL_FIELDS)
    with transaction.atomic():
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
        events: list[TaskEvent] = []
        if new_keys:
            rows = []
            for key in new_keys:
                t = current[key]
                rows.append(
                    Task(
                        cluster=cluster,
                        campaign_id=campaign_of.get(t.job_number),
                        job_number=t.job_number,
                        task_number=t.task_number or 0,
                        is_array=t.task_number is not None,
                        name=t.name[:255],
                        owner=t.owner[:64],
                        project=(t.project or "")[:64],
                        queue=t.queue or "",
                        host=t.host or "",
                        slots=t.slots,
                        priority=t.priority,
                        state=t.state,
                        state_code=t.state_code,
                        restarted=t.restarted,
                        submitted_at=t.submitted_at,
                        started_at=t.started_at,
                        first_seen_at=observed_at,
                    )
                )
            Task.objects.bulk_create(rows, batch_size=2000, ignore_conflicts=True)
            changes.added = len(rows)
            changes.campaigns.update(pk for pk in campaign_of.values())

        changed_rows: list[Task] = []
        gone_rows: list[Task] = []
        for key, row in existing.items():
            t = current.get(key)
            if t is None:
                if row.state != "finishing" and (row.first_seen_at is None or row.first_seen_at < observed_at):
                    events.append(TaskEvent(task_id=row.id, at=observed_at, from_state=row.state, to_state="finishing"))
                    row.state = "finishing"
                    row.gone_at = observed_at
                    gone_rows.append(row)
                continue
            new = (t.state, t.state_code, t.restarted, t.queue or "", t.host or "", t.slots, t.priority, t.started_at)
            old = tuple(getattr(row, f) for f in POLL_FIELDS)
            if new != old or (row.submitted_at is None and t.submitted_at is not None):
                if row.state != t.state:
                    events.append(TaskEvent(task_id=row.id, at=observed_at, from_state=row.state, to_state=t.state,
                                            state_code=t.state_code))
                for field, value in zip(POLL_FIELDS, new):
                    setattr(row, field, value)
                if t.submitted_at is not None and row.submitted_at is None:
                    row.submitted_at = t.submitted_at
                changed_rows.append(row)
        if changed_rows:
            Task.objects.bulk_update(changed_rows, [*POLL_FIELDS, "submitted_at"], batch_size=1000)
        if gone_rows:
            Task.objects.bulk_update(gone_rows, ["state", "gone_at"], batch_size=1000)
        changes.changed = len(changed_rows)
        changes.gone = len(gone_rows)
        for row in (*changed_rows, *gone_rows):
            if row.campaign_id:
                changes.campaigns.add(row.campaign_id)
        if events:
            TaskEvent.objects.bulk_create(events, batch_size=2000)
        if gone_rows:
            _finalize_finishing(cluster, [r.id for r in gone_rows])
        Cluster.objects.filter(pk=cluster.pk).update(polled_at=timezone.now(), poll_error="")
        if changes.any:
            realtime.queue_changed(cluster.name, changes.campaigns)
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


def _us(value: dt.datetime | None) -> int:
    if value is None:
        return 0
    delta = value - EPOCH
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


_RECORD_COLUMNS = (
    "cluster_id", "task_id", "job_number", "task_number", "pe_taskid", "submission_us", "start_us", "end_us",
    "submitted_at", "started_at", "ended_at", "job_name", "owner", "group", "project", "department", "account",
    "queue", "hostname", "slots", "wallclock_s", "cpu_s", "maxvmem_bytes", "failed", "exit_status", "category",
    "usage",
)


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


def ingest_accounting(cluster: Cluster, *, path: str | None = None, max_bytes: int = 2 * 1024 * 1024,
                      time_budget_s: float = 20.0) -> IngestResult:
    """Read the accounting file from its checkpoint and store new records, batch after batch.

    Each batch (``max_bytes`` of the file, whole lines) is one transaction
    that also moves the checkpoint (inode, offset), so a crash at any point
    re-reads from the old checkpoint and the identity constraint drops what
    was already stored: the same database either way. Reads until the file is
    caught up or ``time_budget_s`` seconds have passed (the rest waits for
    the next call). A missing file (no job has finished yet) is not an error.
    Memory stays flat: one batch at a time.
    """
    import time

    from schedulers.accounting import read_accounting
    from schedulers.accounting_cursor import fingerprint, plan_read

    path = path or cluster.accounting_path
    result = IngestResult()
    checkpoint, _ = IngestCheckpoint.objects.get_or_create(cluster=cluster, source="accounting",
                                                           defaults={"path": path})
    deadline = time.monotonic() + time_budget_s
    while True:
        # Rotation (the rest of the rotated file first), truncation and regrowth (fingerprint of the
        # first bytes): schedulers/accounting_cursor.py.
        try:
            plan = plan_read(path, checkpoint.inode, checkpoint.offset, checkpoint.fingerprint)
            batch = read_accounting(plan.path, plan.cursor, max_bytes=max_bytes)
        except FileNotFoundError:
            return result
        if plan.cursor is not None and batch.reset:
            if time.monotonic() > deadline:
                return result
            continue  # the file was swapped between the plan and the read: plan again, store nothing
        result.batches += 1
        result.deferred_bytes = batch.deferred_bytes
        result.reset = result.reset or plan.reset
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
            checkpoint.fingerprint = fingerprint(plan.path, batch.cursor.offset, inode=batch.cursor.inode)
            checkpoint.accepted += accepted
            checkpoint.quarantined += len(batch.quarantined)
            checkpoint.resets += 1 if plan.reset else 0
            checkpoint.save()
        if not moved or not (batch.records or batch.quarantined or batch.skipped) or time.monotonic() > deadline:
            return result


def _store_records(cluster: Cluster, records: list[ParsedRecord]) -> tuple[int, int]:
    """Insert ``records`` (skipping identities already stored), link them to tasks, end finished tasks.

    Returns (records inserted, tasks ended). One ``INSERT ... ON CONFLICT DO
    NOTHING`` per batch (SQLite >= 3.24 and PostgreSQL alike) on the identity
    constraint: no model instance per record, which is what keeps the rate
    above 100,000 records/s.
    """
    from django.db import connection

    if not records:
        return 0, 0
    touched, task_of = _attach_records(cluster, records)
    sqlite = connection.vendor == "sqlite"
    dumps = json.dumps
    # Records of one campaign share few distinct times: convert each once.
    # (value -> (microseconds, database value)); SQLite stores Django's
    # naive-UTC text form, PostgreSQL takes the aware datetime.
    times: dict = {None: (0, None)}

    def conv(value):
        hit = times.get(value)
        if hit is None:
            utc = value.astimezone(dt.timezone.utc)
            hit = times[value] = (_us(utc), utc.isoformat(" ")[:-6] if sqlite else utc)
        return hit

    rows = []
    cluster_id = cluster.pk
    for i, r in enumerate(records):
        sub_us, sub = conv(r.submitted_at)
        start_us, start = conv(r.started_at)
        end_us, end = conv(r.ended_at)
        rows.append((
            cluster_id, task_of.get(i), r.job_number, r.task_number or 0, r.pe_taskid or "",
            sub_us, start_us, end_us, sub, start, end,
            r.job_name[:255], r.owner[:64], r.group[:64], (r.project or "")[:64], (r.department or "")[:64],
            r.account[:255], r.queue[:64], r.hostname[:255], r.slots, r.wallclock_s, r.cpu_s, r.maxvmem_bytes,
            r.failed, r.exit_status, r.category, dumps(r.usage) if r.usage else "{}",
        ))
    table = AccountingRecord._meta.db_table
    quote = connection.ops.quote_name
    sql = (f"INSERT INTO {quote(table)} ({', '.join(quote(c) for c in _RECORD_COLUMNS)}) "
           f"VALUES ({', '.join(['%s'] * len(_RECORD_COLUMNS))}) ON CONFLICT DO NOTHING")
    with connection.cursor() as cur:
        cur.executemany(sql, rows)
        # sqlite3 and psycopg both sum rowcount over executemany; skipped conflicts count 0.
        inserted = cur.rowcount
    return inserted, _finalize_finishing(cluster, touched)


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
            "id", "job_number", "task_number", "active", "submitted_at"
        ):
            tasks.setdefault((task.job_number, task.task_number), []).append(task)
    campaign_of = _campaigns_by_job(cluster, jobs)
    touched: list[int] = []
    task_of: dict[int, int] = {}
    unseen: dict[tuple, tuple[Task, ParsedRecord]] = {}
    links: list[tuple[int, tuple]] = []
    for i, r in masters:
        key = (r.job_number, r.task_number or 0)
        candidates = tasks.get(key)
        task = None
        if candidates:
            task = next((t for t in candidates if t.active and _same_submission(t.submitted_at, r.submitted_at)),
                        None)
            if task is None:
                task = next((t for t in candidates if t.submitted_at == r.submitted_at), None)
        if task is not None:
            task_of[i] = task.id
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


def _finalize_finishing(cluster: Cluster, task_ids: list[int]) -> int:
    """Tasks gone from qstat whose accounting record is read become ``done`` or ``failed``.

    A task still in qstat keeps its scheduler state even if a record arrived
    (a start that failed and is retried writes a record and runs again).
    """
    finalized = 0
    campaigns: set[int] = set()
    now = timezone.now()
    for chunk in _chunks(sorted(set(task_ids))):
        tasks = list(Task.objects.filter(pk__in=chunk, state="finishing"))
        if not tasks:
            continue
        latest: dict[int, AccountingRecord] = {}
        for rec in AccountingRecord.objects.filter(task_id__in=[t.id for t in tasks], pe_taskid="").order_by("end_us"):
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


def _finish_campaigns(campaign_ids: set[int]) -> None:
    now = timezone.now()
    for campaign_id in campaign_ids:
        if not Task.objects.filter(campaign_id=campaign_id, active=True).exists():
            # The conditional update succeeds once per campaign: only that caller sends the notice.
            if Campaign.objects.filter(pk=campaign_id, status="submitted").update(status="finished", finished_at=now):
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
    os.makedirs(os.path.dirname(dst), exist_ok=True)
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
