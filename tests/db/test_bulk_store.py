"""dashboards.core.bulk.store_accounting_records on the database under test (SQLite or PostgreSQL's COPY path)."""
from __future__ import annotations

import datetime as dt
import zoneinfo

import pytest
from django.db import transaction

from dashboards.core.bulk import epoch_us, store_accounting_records
from dashboards.models import AccountingRecord
from dashboards.core.clusters import cluster_get_default
from schedulers.base import AccountingRecord as Parsed

pytestmark = pytest.mark.django_db

BERLIN = zoneinfo.ZoneInfo("Europe/Berlin")


def parsed(job: int, task: int | None, *, start: dt.datetime, **fields) -> Parsed:
    values = dict(
        job_number=job, task_number=task, pe_taskid=None, job_name="tco-inst1-c1-demo", owner="tco", group="tco",
        project="research", department="defaultdepartment", account="sge", queue="agent.q", hostname="vm", slots=1,
        submitted_at=start - dt.timedelta(seconds=3), started_at=start, ended_at=start + dt.timedelta(seconds=7),
        wallclock_s=7.0, cpu_s=0.5, maxvmem_bytes=2048.0, failed=0, exit_status=0, category="-q agent.q", usage={},
    )
    values.update(fields)
    return Parsed(**values)


def test_it_inserts_new_identities_once_with_their_values_intact():
    cluster = cluster_get_default()
    start = dt.datetime(2026, 3, 29, 3, 30, tzinfo=BERLIN)  # just after the spring change: 01:30 UTC
    awkward = "a\tname with\nnewline, back\\slash and \u00e9"
    records = [
        parsed(7, 1, start=start, job_name=awkward, usage={"tokens": {"in": 12, "out": 3}}),
        parsed(7, 2, start=start, exit_status=3),
        parsed(7, 2, start=start, exit_status=3),  # the same identity twice in one batch
        parsed(8, None, start=start, started_at=None, ended_at=None),  # a failed start: times 0
    ]
    with transaction.atomic():
        assert store_accounting_records(cluster, records) == 3
    with transaction.atomic():
        assert store_accounting_records(cluster, records) == 0  # a re-read batch adds nothing
    assert AccountingRecord.objects.count() == 3
    first = AccountingRecord.objects.get(job_number=7, task_number=1)
    assert first.job_name == awkward
    assert first.usage == {"tokens": {"in": 12, "out": 3}}
    assert first.started_at == dt.datetime(2026, 3, 29, 1, 30, tzinfo=dt.timezone.utc)
    assert first.start_us == 1774747800 * 1_000_000  # date -d '2026-03-29 01:30 UTC' +%s
    unstarted = AccountingRecord.objects.get(job_number=8)
    assert (unstarted.task_number, unstarted.start_us, unstarted.started_at) == (0, 0, None)
    assert AccountingRecord.objects.get(job_number=7, task_number=2).exit_status == 3


def test_it_commits_and_rolls_back_with_the_caller():
    cluster = cluster_get_default()
    start = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    with pytest.raises(RuntimeError):
        with transaction.atomic():
            store_accounting_records(cluster, [parsed(9, 1, start=start)])
            raise RuntimeError("the ingest batch fails after the insert")
    assert not AccountingRecord.objects.exists()  # rolled back with the checkpoint: nothing half-stored
    with transaction.atomic():
        assert store_accounting_records(cluster, [parsed(9, 1, start=start), parsed(9, 2, start=start)]) == 2
    assert AccountingRecord.objects.filter(job_number=9, task__isnull=True).count() == 2


def test_epoch_us_counts_microseconds_since_1970_utc():
    assert epoch_us(None) == 0
    assert epoch_us(dt.datetime(1970, 1, 2, 0, 0, 0, 5, tzinfo=dt.timezone.utc)) == 86_400_000_005
    assert epoch_us(dt.datetime(1970, 1, 1, 1, 0, tzinfo=BERLIN)) == 0  # 01:00 CET is midnight UTC



def test_the_portable_path_for_other_backends_stores_the_same_rows_once():
    """Backends other than SQLite and PostgreSQL take Django's bulk_create path: same rows, same count."""
    from dashboards.core import bulk

    cluster = cluster_get_default()
    start = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    records = [parsed(11, 1, start=start, usage={"tokens": {"in": 5}}), parsed(11, 2, start=start),
               parsed(11, 2, start=start)]
    with transaction.atomic():
        assert bulk._store_portable(cluster, records, None, {0: {"input_tokens": 5}}) == 2
    with transaction.atomic():
        assert bulk._store_portable(cluster, records, None) == 0
    first = AccountingRecord.objects.get(job_number=11, task_number=1)
    assert first.usage == {"tokens": {"in": 5}} and first.tokens == {"input_tokens": 5}
    assert first.started_at == start and first.start_us == 1767225600 * 1_000_000  # date -d 2026-01-01Z +%s


def test_failed_starts_of_one_job_on_two_hosts_are_two_records():
    """A job that cannot start (failed 28) is tried on another host: the accounting file gets one
    record per host, start and end 0 and equal in every other part (seen on the 3-host dev cluster,
    job 416). Both are stored; the same line read twice is still stored once."""
    cluster = cluster_get_default()
    start = dt.datetime(2026, 12, 1, 10, 0, tzinfo=dt.timezone.utc)
    tried = [parsed(416, None, start=start, started_at=None, ended_at=None, failed=28, hostname=host,
                    wallclock_s=0.0, cpu_s=0.0, maxvmem_bytes=0.0) for host in ("sge-exec2", "sge-exec1")]
    with transaction.atomic():
        assert store_accounting_records(cluster, tried) == 2
        assert store_accounting_records(cluster, tried) == 0
    stored = AccountingRecord.objects.filter(job_number=416)
    assert sorted(stored.values_list("hostname", "failed", "start_us", "end_us")) == [
        ("sge-exec1", 28, 0, 0), ("sge-exec2", 28, 0, 0)]
