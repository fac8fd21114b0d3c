"""Dropping old detail rows (``TCO_DETAIL_RETENTION_DAYS``, issue 26): bills keep their figures in the rollups.

A site that runs thousands of agents a day stores tens of millions of model
requests a year. With ``TCO_DETAIL_RETENTION_DAYS`` = N (0, the default:
keep everything), the tasks that ended more than N days ago are dropped with
their model requests, state changes and accounting records, and so are the
accounting records of jobs tco did not launch. The usage rollups
(``UsageRollup``) keep every hour, so a bill over any period, the usage API
and budgets give the same figures afterwards; a task's own page, its
requests and its campaign's stage histograms go with its rows.

The drop runs in bounded batches (``TCO_RETENTION_BATCH`` tasks, one short
transaction each), oldest first, from a periodic task on the ingest queue:
rows this old are never written by ingest, so it waits for nothing and
nothing waits for it long. The cut is always a whole UTC hour, recorded on
the cluster first (``Cluster.detail_dropped_before``): a bill then refuses a
part of an hour before it (its detail is gone), and an accounting record that
ended before it and is read again (a checkpoint lost, the file re-read from
its start) is not stored a second time (``core.bulk``).

A cluster whose time zone has had an offset that is not a whole number of
hours cuts its billing days inside UTC hours; its bills read the detail rows
(``billing.bills``), so its detail is kept and a warning logged.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import logging
import time
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from dashboards.core.chunks import in_chunks
from dashboards.models import AccountingRecord, Cluster, ModelRequest, Task, TaskEvent

log = logging.getLogger(__name__)


@dataclasses.dataclass
class RetentionResult:
    """What one :func:`drop_old_detail` run dropped (rows), or why it did nothing (``skipped``)."""

    cutoff: dt.datetime | None = None
    tasks: int = 0
    requests: int = 0
    events: int = 0
    records: int = 0
    batches: int = 0
    done: bool = True
    skipped: str = ""

    def as_dict(self) -> dict:
        out = dataclasses.asdict(self)
        out["cutoff"] = self.cutoff.isoformat() if self.cutoff else None
        return out


def whole_hour_zone(name: str, *, years: int = 3, now: dt.datetime | None = None) -> bool:
    """Whether the zone ``name`` had only whole-hour UTC offsets over the last ``years`` years and the
    next one (sampled every day: offsets change at most a few times a year)."""
    try:
        zone = ZoneInfo(name or "UTC")
    except (ZoneInfoNotFoundError, ValueError):
        zone = ZoneInfo("UTC")
    now = now or timezone.now()
    day = now - dt.timedelta(days=365 * years)
    while day < now + dt.timedelta(days=366):
        if day.astimezone(zone).utcoffset().total_seconds() % 3600:
            return False
        day += dt.timedelta(days=1)
    return True


def retention_cutoff(days: float, now: dt.datetime | None = None) -> dt.datetime:
    """The whole UTC hour before which detail rows go: ``now`` minus ``days``, rounded down."""
    moment = (now or timezone.now()) - dt.timedelta(days=days)
    return moment.astimezone(dt.timezone.utc).replace(minute=0, second=0, microsecond=0)


def _delete_ids(model, column: str, ids: list[int]) -> int:
    """``DELETE`` the rows of ``model`` whose ``column`` is in ``ids`` (no model instances, no signals)."""
    table = connection.ops.quote_name(model._meta.db_table)
    deleted = 0
    with connection.cursor() as cur:
        for chunk in in_chunks(ids):
            cur.execute(f"DELETE FROM {table} WHERE {connection.ops.quote_name(column)} IN "
                        f"({', '.join(['%s'] * len(chunk))})", chunk)
            deleted += cur.rowcount
    return deleted


def drop_old_detail(cluster: Cluster, *, days: float | None = None, now: dt.datetime | None = None,
                    batch: int | None = None, time_budget_s: float = 60.0) -> RetentionResult:
    """Drop the detail rows of ``cluster`` older than ``days`` (``TCO_DETAIL_RETENTION_DAYS``; 0 or None:
    nothing), ``batch`` tasks (``TCO_RETENTION_BATCH``) a transaction, until none is left or
    ``time_budget_s`` has passed (``done`` False: the next run goes on).

    Tasks go once they ended (``active`` False, ``ended_at``) before the cut, with their model
    requests, state changes and accounting records; accounting records of jobs tco did not launch
    go once they ended before it. The rollups are not touched: they hold these hours.
    """
    days = settings.TCO_DETAIL_RETENTION_DAYS if days is None else days
    batch = batch or settings.TCO_RETENTION_BATCH
    result = RetentionResult()
    if not days or days <= 0:
        result.skipped = "TCO_DETAIL_RETENTION_DAYS is off"
        return result
    if not whole_hour_zone(cluster.time_zone, now=now):
        result.skipped = (f"cluster {cluster.name}'s time zone {cluster.time_zone} has offsets that are not whole "
                          "hours: its bills read the detail rows, which are kept")
        log.warning("detail retention: %s", result.skipped)
        return result
    cutoff = result.cutoff = retention_cutoff(days, now)
    # The cut is recorded before anything goes: a bill or a re-read accounting file never meets an hour
    # whose detail is half gone without knowing it.
    Cluster.objects.filter(pk=cluster.pk).filter(
        Q(detail_dropped_before__isnull=True) | Q(detail_dropped_before__lt=cutoff)).update(
        detail_dropped_before=cutoff)
    deadline = time.monotonic() + time_budget_s
    while True:
        with transaction.atomic():
            ids = list(Task.objects.filter(cluster=cluster, active=False, ended_at__lt=cutoff)
                       .order_by("ended_at").values_list("id", flat=True)[:batch])
            if ids:
                result.requests += _delete_ids(ModelRequest, "task_id", ids)
                result.events += _delete_ids(TaskEvent, "task_id", ids)
                result.records += _delete_ids(AccountingRecord, "task_id", ids)
                result.tasks += _delete_ids(Task, "id", ids)
            records = list(AccountingRecord.objects.filter(cluster=cluster, task__isnull=True, ended_at__lt=cutoff)
                           .order_by("ended_at").values_list("id", flat=True)[:batch])
            if records:
                result.records += _delete_ids(AccountingRecord, "id", records)
        if ids or records:
            result.batches += 1
        if len(ids) < batch and len(records) < batch:
            break
        if time.monotonic() > deadline:
            result.done = False
            break
    if result.tasks or result.records:
        log.info("detail retention on cluster %s: dropped %d tasks, %d requests, %d records ended before %s",
                 cluster.name, result.tasks, result.requests, result.records, cutoff.isoformat())
    return result
