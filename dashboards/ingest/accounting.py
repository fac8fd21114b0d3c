"""Accounting records into the database: read from the (inode, offset) checkpoint, upserted, tasks finished.

A malformed line is quarantined (``QuarantinedLine``) and counted, never
ingested shifted. A task becomes ``done``/``failed`` once it is gone from
qstat and its record is read. Re-running over the same file gives the same
database.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import os
import time
from typing import Iterable

from django.utils import timezone

from dashboards.core import bulk, realtime, rollups
from dashboards.core import clusters as core_clusters
from dashboards.core.chunks import in_chunks
from dashboards.core.failures import BEFORE_PROLOG_CODE, HOST_LOST_CODE
from dashboards.ingest.campaign_status import campaigns_by_job, finish_campaigns
from dashboards.models import (
    AccountingRecord,
    Cluster,
    IngestCheckpoint,
    QuarantinedLine,
    Task,
    TaskEvent,
)
from execution.spool.contract import TOKEN_FIELDS
from schedulers.base import AccountingCursor, AccountingMissing, SchedulerAdapter
from schedulers.base import AccountingRecord as ParsedRecord
from schedulers.gridengine.parsers.accounting import usage_group_values

log = logging.getLogger(__name__)


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
    #: Not an error: the accounting file is missing because no job has ended on the cell yet (see
    #: :func:`_before_first_record`); what the pass found, in words.
    waiting: str = ""


#: A task that left the queue this long ago (seconds) has its accounting record written: Grid Engine's
#: qmaster writes the record when the execution daemon reports the job's end, before qstat stops showing it.
FIRST_RECORD_GRACE_S = 60.0


def _other_accounting_files(path: str) -> str:
    """``", but accounting.jsonl is there"`` when the directory of ``path`` holds another accounting file
    (a wrong flavour: an OCS 9 cell writes ``common/accounting.jsonl``, SGE 8 ``common/accounting``)."""
    directory = os.path.dirname(path)
    try:
        names = sorted(n for n in os.listdir(directory)
                       if n.startswith("accounting") and n != os.path.basename(path))
    except OSError:
        return f" (nor is its directory {directory} readable)"
    return f", but {', '.join(names[:3])} is there" if names else ""


def _before_first_record(cluster: Cluster, checkpoint: IngestCheckpoint, path: str) -> str:
    """Why a missing accounting file is not (yet) an error, or ``""`` when it is one.

    A Grid Engine cell has no accounting file until its first job ends (sge_accounting(5): the qmaster
    appends a record per finished job; Debian's new cell has none). It is the cell's first minute when
    all of these hold: tco never read the file (no checkpoint), its directory exists and holds no other
    accounting file (a wrong flavour's name), and none of the cluster's tasks left the queue more than
    :data:`FIRST_RECORD_GRACE_S` seconds ago. Anything else (a path that worked before, a missing
    directory, tasks that ended without a record) is the loud error.
    """
    if checkpoint.inode or not os.path.isdir(os.path.dirname(path)) or _other_accounting_files(path):
        return ""
    since = timezone.now() - dt.timedelta(seconds=FIRST_RECORD_GRACE_S)
    if Task.objects.filter(cluster=cluster, gone_at__lt=since).exists():
        return ""
    return (f"no accounting records yet: {path} appears when the cell's first job ends "
            "(no task of this cluster has left the queue)")


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
    The one exception is a new cell's first minutes, before any job has ended
    (:func:`_before_first_record`): ``result.waiting`` says so and nothing is
    recorded as an error. The error is logged when it starts or changes, not
    on every pass.
    """
    path = path or cluster.accounting_path
    scheduler = scheduler or core_clusters.scheduler_for(cluster, accounting_path=path)
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
            waiting = _before_first_record(cluster, checkpoint, exc.path or path)
            if waiting:
                result.waiting = waiting
                log.debug("cluster %s: %s", cluster.name, waiting)
                _accounting_error_set(cluster, "")
                return result
            result.error = (f"accounting not read: {exc}{_other_accounting_files(exc.path or path)}. Check the "
                            f"cluster's accounting file (flavour {cluster.flavour}; manage.py tco_doctor names the fix)")
            # Logged when it starts or changes, not on every pass (the ingest worker tries again each
            # few seconds): the cluster row keeps it, and the queue page shows it, until a pass reads the file.
            log.log(logging.ERROR if (cluster.accounting_error or "") != result.error[:2000] else logging.DEBUG,
                    "cluster %s: %s", cluster.name, result.error)
            _accounting_error_set(cluster, result.error)
            return result
        if result.batches == 0:
            _accounting_error_set(cluster, "")
        result.batches += 1
        result.deferred_bytes = batch.deferred_bytes
        result.reset = result.reset or batch.reset
        with rollups.deferred():  # the checkpoint and quarantine written, then the rollups (their "Lock order")
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
    ``dashboards.core.bulk.store_accounting_records``: ``INSERT ... ON CONFLICT DO
    NOTHING`` on the identity constraint (SQLite), COPY into a staging table
    then one such INSERT (PostgreSQL); no model instance per record.
    """
    if not records:
        return 0, 0
    # Tasks made, records stored, tasks ended: three rollup writes, made at the end in the one lock
    # order (rollups.deferred), or a poll writing the same hours meanwhile deadlocks with this batch.
    with rollups.deferred():
        touched, task_of = _attach_records(cluster, records)
        tokens = {i: t for i, r in enumerate(records) if r.usage and (t := accounting_tokens(r.usage))}
        inserted = bulk.store_accounting_records(cluster, records, task_of, tokens=tokens)
        if tokens:
            check_accounting_tokens({task_of[i] for i in tokens if i in task_of})
        return inserted, finalize_finishing(cluster, touched)


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
    for chunk in in_chunks(sorted(set(task_ids))):
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

    A record of a job that an unfinished campaign owns (its job number and
    job name) belongs to that campaign's row of its task number, whatever
    its submission time (one row
    per campaign task: a rerun's record carries the time it was rescheduled,
    and a second, ended row made for it doubled the task; issue 23, finding
    11). Any other record belongs to the active task with its (job_number,
    task_number) and a matching submission time, or to an ended one with the
    same submission time (a record read late, after the task was declared
    lost). A campaign task tco never saw (no row: it ran between two polls
    before its campaign's rows existed) is made ended at once; records of
    other unseen jobs are stored without a task (bills read them directly).
    Several records with one submission time are retried starts of one task:
    the latest decides its state.
    """
    masters = [(i, r) for i, r in enumerate(records) if not r.pe_taskid]
    if not masters:
        return [], {}
    jobs = sorted({r.job_number for _, r in masters})
    tasks: dict[tuple[int, int], list[Task]] = {}
    for chunk in in_chunks(jobs):
        for task in Task.objects.filter(cluster=cluster, job_number__in=chunk).only(
            "id", "campaign_id", "job_number", "task_number", "active", "submitted_at", "restarted", "name"
        ):
            tasks.setdefault((task.job_number, task.task_number), []).append(task)
    campaign_of = campaigns_by_job(cluster, jobs)
    touched: list[int] = []
    task_of: dict[int, int] = {}
    unseen: dict[tuple, tuple[Task, ParsedRecord]] = {}
    links: list[tuple[int, tuple]] = []
    rescheduled: set[int] = set()  # tasks given a "rescheduling" record in this batch
    for i, r in masters:
        key = (r.job_number, r.task_number or 0)
        candidates = tasks.get(key)
        task = None
        owner = campaign_of.get(r.job_number)
        if candidates and owner is not None:
            # The campaign's job, by its name too (a job that reused the number has another name).
            task = max((t for t in candidates if t.campaign_id == owner and (not t.name or t.name == r.job_name[:255])),
                       key=lambda t: (t.active, t.id), default=None)
        if candidates and task is None:
            task = next((t for t in candidates if t.active and same_submission(t.submitted_at, r.submitted_at)),
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
        rollups.tasks_added(t.id for t in created)  # made ended: into the usage rollups
        finish_campaigns({t.campaign_id for t in created})
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


def same_submission(seen: dt.datetime | None, recorded: dt.datetime | None) -> bool:
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


def _of_last_attempt(rec: AccountingRecord, task: Task, host_lost: bool = False) -> bool:
    """Whether ``rec`` can be the end of the last attempt of ``task`` that qstat showed.

    A task rerun elsewhere (``-r y``, its host lost) has one record per
    attempt; the record of an earlier attempt (``failed`` 25 "rescheduling",
    all-zero times) must not end the task while the last attempt's record is
    still to come. A task last seen running since ``started_at`` is ended
    only by a record that ended after that start (1 s of clock slack), or by
    the record its execution host wrote when it came back from a crash:
    ``failed`` 19 ("before writing exit_status") from the host the task last
    ran on, with all-zero times (SGE 8.1.9, tests/fixtures/sge819/
    accounting_lost_host; such tasks stayed finishing, then were declared
    lost: issue 23, finding 12), or ``failed`` 7 ("before prolog") from that host with all-zero times
    when its host was seen lost while the task ran there (``host_lost``: the task was ``unknown``
    since its start, :func:`_seen_unknown`): the host crashed before the shepherd wrote its pid file.
    Such tasks stayed finishing, then were declared lost "with no accounting record". A failed 7
    from a host not seen lost can be an earlier start that failed there, and is not the end. One never
    seen running is ended by any record.
    """
    if task.started_at is None:
        return True
    if rec.failed == HOST_LOST_CODE and rec.hostname and rec.hostname == task.host:
        return True
    if (host_lost and rec.failed == BEFORE_PROLOG_CODE and not rec.end_us and not rec.start_us
            and rec.hostname and rec.hostname == task.host):
        return True
    return bool(rec.end_us) and rec.end_us >= _us(task.started_at) - 1_000_000


def _seen_unknown(tasks: list[Task]) -> set[int]:
    """Ids of ``tasks`` that a poll saw ``unknown`` (their host lost: ``schedulers.hosts``) since they
    started (a TaskEvent to ``unknown`` at or after ``started_at``); one query."""
    if not tasks:
        return set()
    started = {t.id: t.started_at for t in tasks if t.started_at is not None}
    seen: set[int] = set()
    for task_id, at in TaskEvent.objects.filter(task_id__in=list(started), to_state="unknown").values_list(
            "task_id", "at"):
        if at >= started[task_id]:
            seen.add(task_id)
    return seen


def finalize_finishing(cluster: Cluster, task_ids: list[int]) -> int:
    """Tasks gone from qstat whose accounting record is read become ``done`` or ``failed``.

    A task still in qstat keeps its scheduler state even if a record arrived
    (a start that failed and is retried writes a record and runs again), and
    only a record of its last attempt ends it (:func:`_of_last_attempt`);
    until that record comes it stays ``finishing``.
    """
    with rollups.deferred():  # every chunk's rollups at once, after the campaigns (rollups' "Lock order")
        return _finalize_finishing(cluster, task_ids)


def _finalize_finishing(cluster: Cluster, task_ids: list[int]) -> int:
    finalized = 0
    campaigns: set[int] = set()
    now = timezone.now()
    for chunk in in_chunks(sorted(set(task_ids))):
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
        before_prolog = {r.task_id for r in records if r.failed == BEFORE_PROLOG_CODE and not r.end_us}
        lost = _seen_unknown([t for t in tasks if t.id in before_prolog])
        for rec in records:
            task = by_id.get(rec.task_id)
            if task is not None and _of_last_attempt(rec, task, task.id in lost):
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
        with rollups.tasks_rolled(t.id for t in done):  # ended tasks join the usage rollups
            Task.objects.bulk_update(
                done,
                ["state", "active", "submitted_at", "started_at", "ended_at", "queue", "host", "wallclock_s", "cpu_s",
                 "maxvmem_bytes", "failed_code", "exit_status"],
                batch_size=1000,
            )
        TaskEvent.objects.bulk_create(events)
        finalized += len(done)
    if finalized:
        finish_campaigns(campaigns)
        realtime.queue_changed(cluster.name, campaigns)
    return finalized
