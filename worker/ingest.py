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
from pathlib import Path
from typing import Iterable

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from dashboards import realtime
from dashboards.models import AccountingRecord, Campaign, Cluster, IngestCheckpoint, QuarantinedLine, Task, TaskEvent
from worker.schedulers.base import AccountingRecord as ParsedRecord
from worker.schedulers.base import QstatTask

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


def apply_qstat_poll(cluster: Cluster, tasks: list[QstatTask], *, observed_at: dt.datetime) -> PollChanges:
    """Write the difference between a qstat snapshot and the active tasks in the database.

    ``observed_at`` is when qstat was started: a task created after it (a
    campaign submitted while qstat ran) is not "gone" just because this
    snapshot predates it. Tasks gone from qstat become ``finishing`` until their
    accounting record is read. Returns the counts; pushes one change event.
    """
    changes = PollChanges()
    with transaction.atomic():
        existing = {
            (row.job_number, row.task_number): row
            for row in Task.objects.filter(cluster=cluster, active=True).only(
                "id", "campaign_id", "job_number", "task_number", "first_seen_at", "submitted_at", *POLL_FIELDS
            )
        }
        current = {t.key: t for t in tasks}
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
    """A failed poll is recorded and shown; it never reads as an empty queue."""
    now = timezone.now()
    Cluster.objects.filter(pk=cluster.pk).update(poll_error=message[:2000], poll_error_at=now)
    realtime.queue_changed(cluster.name)


# --- accounting -------------------------------------------------------------------------


def _us(value: dt.datetime | None) -> int:
    if value is None:
        return 0
    delta = value - EPOCH
    return (delta.days * 86400 + delta.seconds) * 1_000_000 + delta.microseconds


def _record_row(cluster: Cluster, r: ParsedRecord) -> AccountingRecord:
    return AccountingRecord(
        cluster=cluster,
        job_number=r.job_number,
        task_number=r.task_number or 0,
        pe_taskid=r.pe_taskid or "",
        submission_us=_us(r.submitted_at),
        start_us=_us(r.started_at),
        end_us=_us(r.ended_at),
        submitted_at=r.submitted_at,
        started_at=r.started_at,
        ended_at=r.ended_at,
        job_name=r.job_name[:255],
        owner=r.owner[:64],
        group=r.group[:64],
        project=(r.project or "")[:64],
        department=(r.department or "")[:64],
        account=r.account[:255],
        queue=r.queue[:64],
        hostname=r.hostname[:255],
        slots=r.slots,
        wallclock_s=r.wallclock_s,
        cpu_s=r.cpu_s,
        maxvmem_bytes=r.maxvmem_bytes,
        failed=r.failed,
        exit_status=r.exit_status,
        category=r.category,
        usage=r.usage,
    )


@dataclasses.dataclass
class IngestResult:
    accepted: int = 0
    duplicates: int = 0
    quarantined: int = 0
    deferred_bytes: int = 0
    reset: str | None = None
    finalized: int = 0


def ingest_accounting(cluster: Cluster, *, max_bytes: int = 16 * 1024 * 1024, path: str | None = None) -> IngestResult:
    """Read the accounting file from its checkpoint and store new records.

    The checkpoint (inode, offset) moves in the same transaction as the
    records, so a crash at any point re-reads from the old checkpoint and the
    identity constraint drops what was already stored. A missing file (no job
    has finished yet) is not an error.
    """
    from worker.schedulers.accounting import AccountingCursor, read_accounting

    path = path or cluster.accounting_path
    result = IngestResult()
    checkpoint, _ = IngestCheckpoint.objects.get_or_create(cluster=cluster, source="accounting",
                                                           defaults={"path": path})
    cursor = AccountingCursor(inode=checkpoint.inode, offset=checkpoint.offset) if checkpoint.inode else None
    try:
        batch = read_accounting(path, cursor, max_bytes=max_bytes)
    except FileNotFoundError:
        return result
    result.deferred_bytes = batch.deferred_bytes
    result.reset = batch.reset
    rows = [_record_row(cluster, r) for r in batch.records]
    with transaction.atomic():
        rows = _drop_known(cluster, rows)
        result.duplicates = len(batch.records) - len(rows)
        touched = _attach_records(cluster, rows)
        AccountingRecord.objects.bulk_create(rows, batch_size=2000, ignore_conflicts=True)
        result.accepted = len(rows)
        if batch.quarantined:
            QuarantinedLine.objects.bulk_create(
                [
                    QuarantinedLine(cluster=cluster, path=path, inode=batch.cursor.inode, offset=q.offset,
                                    raw=bytes(q.raw[:65536]), reason=q.reason[:255])
                    for q in batch.quarantined
                ],
                ignore_conflicts=True,
            )
            result.quarantined = len(batch.quarantined)
            for q in batch.quarantined:
                log.warning("accounting line at byte %s quarantined: %s", q.offset, q.reason)
        result.finalized = _finalize_finishing(cluster, touched)
        IngestCheckpoint.objects.filter(pk=checkpoint.pk).update(
            path=path,
            inode=batch.cursor.inode,
            offset=batch.cursor.offset,
            accepted=checkpoint.accepted + result.accepted,
            quarantined=checkpoint.quarantined + result.quarantined,
            resets=checkpoint.resets + (1 if batch.reset else 0),
            updated_at=timezone.now(),
        )
    return result


def _drop_known(cluster: Cluster, rows: list[AccountingRecord]) -> list[AccountingRecord]:
    """Rows whose identity is not stored yet (and not repeated within the batch)."""
    if not rows:
        return rows
    known = set()
    for chunk in _chunks(sorted({r.job_number for r in rows})):
        known.update(
            AccountingRecord.objects.filter(cluster=cluster, job_number__in=chunk).values_list(
                "job_number", "task_number", "pe_taskid", "submission_us", "start_us", "end_us"
            )
        )
    fresh = []
    for r in rows:
        ident = (r.job_number, r.task_number, r.pe_taskid, r.submission_us, r.start_us, r.end_us)
        if ident not in known:
            known.add(ident)
            fresh.append(r)
    return fresh


def _attach_records(cluster: Cluster, rows: list[AccountingRecord]) -> list[int]:
    """Set each new record's task (before the records are stored); return the active tasks touched.

    A record belongs to the active task with its (job_number, task_number), or
    to an ended one with the same submission time (a record read late, after
    the task was declared lost). A record of a task tco never saw in qstat (it
    ran between two polls, or before tco watched) makes an ended task at once;
    several records with one submission time are retried starts of one task.
    """
    masters = [r for r in rows if not r.pe_taskid]
    if not masters:
        return []
    keys = {(r.job_number, r.task_number) for r in masters}
    tasks: dict[tuple[int, int], list[Task]] = {}
    for chunk in _chunks(sorted({k[0] for k in keys})):
        for task in Task.objects.filter(cluster=cluster, job_number__in=chunk):
            tasks.setdefault((task.job_number, task.task_number), []).append(task)
    campaign_of = _campaigns_by_job(cluster, (k[0] for k in keys))
    touched: list[int] = []
    unseen: dict[tuple, tuple[Task, AccountingRecord]] = {}
    links: list[tuple[AccountingRecord, Task]] = []
    for r in masters:
        candidates = tasks.get((r.job_number, r.task_number), [])
        task = next((t for t in candidates if t.active and _same_submission(t.submitted_at, r.submitted_at)), None)
        if task is None:
            task = next((t for t in candidates if t.submitted_at == r.submitted_at), None)
        if task is not None:
            r.task_id = task.id
            if task.active:
                touched.append(task.id)
            continue
        ident = (r.job_number, r.task_number, r.submission_us)
        if ident not in unseen or r.end_us >= unseen[ident][1].end_us:
            task = unseen[ident][0] if ident in unseen else Task(
                cluster=cluster,
                campaign_id=campaign_of.get(r.job_number),
                job_number=r.job_number,
                task_number=r.task_number,
                is_array=r.task_number != 0,
                name=r.job_name,
                owner=r.owner,
                project=r.project,
                slots=r.slots,
                first_seen_at=timezone.now(),
            )
            _apply_record(task, r)
            unseen[ident] = (task, r)
        links.append((r, unseen[ident][0]))
    if unseen:
        created = [t for t, _ in unseen.values()]
        Task.objects.bulk_create(created, batch_size=1000)
        if any(t.id is None for t in created):  # backends that return no ids from bulk inserts
            for t in created:
                t.id = Task.objects.filter(cluster=cluster, job_number=t.job_number, task_number=t.task_number,
                                           submitted_at=t.submitted_at, active=False).values_list("id", flat=True).last()
        _finish_campaigns({t.campaign_id for t in created if t.campaign_id})
    for r, task in links:
        r.task_id = task.id
    return touched


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
    from worker import tasks as worker_tasks

    try:
        worker_tasks.notify_campaign_finished.apply_async(args=[campaign_id], queue="ingest")
    except Exception:  # noqa: BLE001 - the broker being down must not undo an ingest; the page shows it anyway
        log.warning("could not queue the finished notice of campaign %s", campaign_id, exc_info=True)


def reconcile_gone_tasks(cluster: Cluster, *, now: dt.datetime | None = None) -> int:
    """Decide tasks gone from qstat whose accounting record never came.

    After ``TCO_LOST_GRACE_S`` a task that never started is ``deleted`` (it
    costs nothing) and one that did start is ``lost``. Returns how many.
    """
    now = now or timezone.now()
    _finalize_finishing(cluster, list(Task.objects.filter(cluster=cluster, state="finishing",
                                                           accounting__isnull=False).values_list("id", flat=True)))
    cutoff = now - dt.timedelta(seconds=settings.TCO_LOST_GRACE_S)
    stale = list(Task.objects.filter(cluster=cluster, state="finishing", gone_at__lt=cutoff))
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

STAGES = ("task_started_at", "sandbox_create_at", "sandbox_ready_at", "agent_started_at", "agent_exited_at",
          "teardown_done_at")


def _parse_time(value) -> dt.datetime | None:
    if not value:
        return None
    parsed = dt.datetime.fromisoformat(value)
    if parsed.tzinfo is None:
        raise ValueError(f"stage time {value!r} has no zone")
    return parsed.astimezone(dt.timezone.utc)


def ingest_runner_records(cluster: Cluster, *, spool: Path | None = None) -> int:
    """Store the stage timestamps of every runner record in the spool, then move it aside.

    A record joins its task by (campaign id, task number, job number). A record
    that cannot be read goes to ``<spool>/quarantine``; one whose task is not
    known yet stays for the next round. Returns the number ingested.
    """
    spool = Path(spool or settings.TCO_SPOOL_DIR)
    records_dir = spool / "records"
    if not records_dir.is_dir():
        return 0
    ingested = 0
    campaigns: set[int] = set()
    for path in sorted(records_dir.glob("*/*.json")):
        try:
            data = json.loads(path.read_bytes())
            campaign_id = int(data["campaign_id"])
            task_number = int(data["task_number"])
            job_number = int(data["job_number"]) if data.get("job_number") is not None else None
            stages = {name: _parse_time((data.get("stages") or {}).get(name)) for name in STAGES}
        except (ValueError, KeyError, TypeError, OSError) as exc:
            log.warning("runner record %s quarantined: %s", path, exc)
            _move(path, spool / "quarantine" / path.parent.name / path.name)
            continue
        tasks = Task.objects.filter(cluster=cluster, campaign_id=campaign_id, task_number=task_number)
        if job_number is not None:
            tasks = tasks.filter(job_number=job_number)
        updated = tasks.update(runner_record=data, **stages)
        if not updated:
            continue
        ingested += 1
        campaigns.add(campaign_id)
        _move(path, spool / "ingested" / path.parent.name / path.name)
    if campaigns:
        realtime.queue_changed(cluster.name, campaigns)
    return ingested


def _move(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    os.replace(src, dst)
