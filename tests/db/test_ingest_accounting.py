"""Accounting ingest: exactly once, whatever the crash point; bad lines quarantined, half lines deferred."""
from __future__ import annotations

import datetime as dt
import os

import pytest

from dashboards.models import AccountingRecord, IngestCheckpoint, QuarantinedLine, Task
from dashboards.core.clusters import cluster_get_default
from dashboards.ingest.poll import apply_qstat_poll
from dashboards.ingest.accounting import ingest_accounting
from schedulers.base import QstatTask
from tests.support.accounting import HEADER, colon_line, write

pytestmark = pytest.mark.django_db



@pytest.fixture
def acct(tmp_path):
    path = tmp_path / "accounting"
    write(path, HEADER, "wb")
    return path


def test_it_ingests_each_record_once_even_when_the_checkpoint_is_lost(acct):
    cluster = cluster_get_default()
    write(acct, colon_line(100, 1) + colon_line(100, 2, exit_status=3) + colon_line(101, 0))
    first = ingest_accounting(cluster, path=str(acct))
    assert first.accepted == 3 and first.duplicates == 0
    again = ingest_accounting(cluster, path=str(acct))
    assert again.accepted == 0
    # A crash after the insert but before the checkpoint moved: re-read from the start.
    IngestCheckpoint.objects.update(offset=0)
    replay = ingest_accounting(cluster, path=str(acct))
    assert replay.accepted == 0 and replay.duplicates == 3
    assert AccountingRecord.objects.count() == 3
    rec = AccountingRecord.objects.get(job_number=100, task_number=2)
    assert rec.exit_status == 3 and rec.project == "research" and rec.wallclock_s == 7.0
    assert rec.started_at == dt.datetime.fromtimestamp(1764417600, dt.timezone.utc)
    assert rec.category == "-q agent.q -l anthropic_api=1"
    assert rec.maxvmem_bytes == 104857600.0


def test_a_shifted_line_is_quarantined_and_counted_never_ingested(acct):
    cluster = cluster_get_default()
    good = colon_line(200, 1)
    shifted = colon_line(201, 1).replace(b"tco-inst1-c1-demo", b"tco-inst1-c1-demo:extra", 1)
    write(acct, good + shifted + colon_line(202, 1))
    result = ingest_accounting(cluster, path=str(acct))
    assert result.accepted == 2 and result.quarantined == 1
    assert set(AccountingRecord.objects.values_list("job_number", flat=True)) == {200, 202}
    q = QuarantinedLine.objects.get()
    assert q.raw == shifted.rstrip(b"\n") and q.offset == len(HEADER) + len(good)
    assert IngestCheckpoint.objects.get().quarantined == 1


def test_a_category_with_colons_keeps_the_fields_after_it(acct):
    cluster = cluster_get_default()
    write(acct, colon_line(210, 1, category="-l h_rt=00:10:00 -q agent.q", exit_status=5))
    ingest_accounting(cluster, path=str(acct))
    rec = AccountingRecord.objects.get()
    assert rec.category == "-l h_rt=00:10:00 -q agent.q" and rec.exit_status == 5
    assert rec.maxvmem_bytes == 104857600.0


def test_a_half_written_last_line_waits_for_its_newline(acct):
    cluster = cluster_get_default()
    line = colon_line(300, 1)
    write(acct, line[:50])
    assert ingest_accounting(cluster, path=str(acct)).accepted == 0
    write(acct, line[50:])
    assert ingest_accounting(cluster, path=str(acct)).accepted == 1
    assert AccountingRecord.objects.get().job_number == 300


def test_rotation_is_detected_by_inode_and_the_new_file_read_from_its_start(acct, tmp_path):
    cluster = cluster_get_default()
    write(acct, colon_line(400, 1))
    ingest_accounting(cluster, path=str(acct))
    os.rename(acct, tmp_path / "accounting.0")
    write(acct, HEADER + colon_line(401, 1), "wb")
    result = ingest_accounting(cluster, path=str(acct))
    assert result.reset == "rotated" and result.accepted == 1
    assert IngestCheckpoint.objects.get().resets == 1


def test_a_record_ends_a_task_gone_from_qstat(acct):
    cluster = cluster_get_default()
    t0 = dt.datetime.fromtimestamp(1764417600, dt.timezone.utc)
    qt = QstatTask(job_number=500, task_number=1, name="x", owner="tco", project="research", state="running",
                   state_code="r", restarted=False, queue="agent.q", host="vm", slots=1,
                   submitted_at=t0 - dt.timedelta(seconds=3), started_at=t0, priority=0.5)
    apply_qstat_poll(cluster, [qt], observed_at=t0)
    write(acct, colon_line(500, 1, exit_status=2))
    ingest_accounting(cluster, path=str(acct))
    assert Task.objects.get().state == "running"  # still in qstat: a record alone does not end it
    apply_qstat_poll(cluster, [], observed_at=t0 + dt.timedelta(seconds=10))
    task = Task.objects.get()
    assert task.state == "failed" and task.exit_status == 2 and not task.active
    assert task.wallclock_s == 7.0 and task.ended_at == t0 + dt.timedelta(seconds=7)
