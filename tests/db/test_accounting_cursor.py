"""The accounting file rotated, truncated and regrown, and ending in a half-written line (files, no cluster).

Each test ends with every record of the file(s) compared with the database
(tests/faults/ledger.py, which splits the lines itself): lost 0, doubled 0.
"""
from __future__ import annotations

import os

import pytest

from dashboards.ingest.accounting import ingest_accounting
from dashboards.models import AccountingRecord, IngestCheckpoint, QuarantinedLine
from dashboards.core.clusters import cluster_get_default
from schedulers.accounting_cursor import FINGERPRINT_BYTES, fingerprint, plan_read
from tests.faults.ledger import compare, report
from tests.support.accounting import colon_line, HEADER, write

pytestmark = pytest.mark.django_db


@pytest.fixture
def acct(tmp_path):
    path = tmp_path / "accounting"
    write(path, HEADER, "wb")
    return path


def assert_exact(cluster, paths, name, jobs=None):
    result = compare(cluster, paths, jobs)
    report(result, name)
    assert (result["lost"], result["doubled"], result["extra"]) == (0, 0, 0), result
    return result


def test_lines_written_just_before_a_rotation_are_read_from_the_rotated_file(acct):
    cluster = cluster_get_default()
    write(acct, colon_line(200, 1) + colon_line(200, 2))
    assert ingest_accounting(cluster, path=str(acct)).accepted == 2
    # Written after the last pass, then the file is moved aside (logchecker.sh) and a new one begins.
    write(acct, colon_line(200, 3) + colon_line(200, 4))
    rotated = acct.with_name("accounting.20261201")
    os.rename(acct, rotated)
    write(acct, HEADER + colon_line(201, 1), "wb")
    result = ingest_accounting(cluster, path=str(acct))
    assert result.accepted == 3 and result.reset == "rotated"
    assert sorted(AccountingRecord.objects.values_list("job_number", "task_number")) == [
        (200, 1), (200, 2), (200, 3), (200, 4), (201, 1)]
    checkpoint = IngestCheckpoint.objects.get()
    assert (checkpoint.inode, checkpoint.offset) == (os.stat(acct).st_ino, os.path.getsize(acct))
    assert ingest_accounting(cluster, path=str(acct)).accepted == 0
    assert_exact(cluster, [rotated, acct], "rotated")


def test_a_rotated_file_is_read_to_its_end_across_batches_and_a_crash(acct):
    cluster = cluster_get_default()
    write(acct, colon_line(210, 1))
    ingest_accounting(cluster, path=str(acct))
    write(acct, b"".join(colon_line(210, n) for n in range(2, 40)))
    rotated = acct.with_name("accounting.0")
    os.rename(acct, rotated)
    write(acct, HEADER + colon_line(211, 1), "wb")
    # One line per batch, one batch per call: the checkpoint walks through the rotated file first.
    line = len(colon_line(210, 2))
    before = IngestCheckpoint.objects.values("inode", "offset", "fingerprint").get()
    first = ingest_accounting(cluster, path=str(acct), max_bytes=line, time_budget_s=0)
    assert first.accepted == 1 and IngestCheckpoint.objects.get().inode == os.stat(rotated).st_ino
    # A crash after the insert, before the checkpoint moved: the same batch again, nothing doubled.
    IngestCheckpoint.objects.update(**before)
    while ingest_accounting(cluster, path=str(acct), max_bytes=line * 7).accepted:
        pass
    assert AccountingRecord.objects.count() == 40
    assert_exact(cluster, [rotated, acct], "rotated, in batches, crash")


def test_a_file_truncated_and_regrown_past_the_old_offset_is_read_again_from_the_start(acct):
    cluster = cluster_get_default()
    write(acct, colon_line(300, 1) + colon_line(300, 2))
    ingest_accounting(cluster, path=str(acct))
    old_offset = IngestCheckpoint.objects.get().offset
    inode = os.stat(acct).st_ino
    # Truncated in place (same inode), then new jobs write more than there was: size alone sees nothing.
    with open(acct, "r+b") as fh:
        fh.truncate(0)
    write(acct, HEADER + b"".join(colon_line(310, n, start=1764500000) for n in range(1, 6)))
    assert os.stat(acct).st_ino == inode and os.path.getsize(acct) > old_offset
    result = ingest_accounting(cluster, path=str(acct))
    assert result.reset == "truncated" and result.accepted == 5
    assert sorted(AccountingRecord.objects.filter(job_number=310).values_list("task_number", flat=True)) == [
        1, 2, 3, 4, 5]
    assert_exact(cluster, [acct], "truncated and regrown", {310})
    # The records read before the truncation are still in the database (the bills keep them).
    assert AccountingRecord.objects.filter(job_number=300).count() == 2


def test_a_file_truncated_and_regrown_with_the_same_first_line_is_not_mistaken(acct):
    """Same first bytes (the header), different records after: the fingerprint covers up to 4 KiB."""
    cluster = cluster_get_default()
    write(acct, b"".join(colon_line(320, n) for n in range(1, 4)))
    ingest_accounting(cluster, path=str(acct))
    assert IngestCheckpoint.objects.get().offset < FINGERPRINT_BYTES
    with open(acct, "r+b") as fh:
        fh.truncate(0)
    write(acct, HEADER + b"".join(colon_line(321, n) for n in range(1, 10)))
    assert ingest_accounting(cluster, path=str(acct)).accepted == 9
    assert_exact(cluster, [acct], "regrown, same header", {321})


def test_a_half_written_last_line_waits_and_is_never_quarantined(acct):
    cluster = cluster_get_default()
    whole = colon_line(400, 2)
    write(acct, colon_line(400, 1) + whole[:37])
    result = ingest_accounting(cluster, path=str(acct))
    assert result.accepted == 1 and result.quarantined == 0 and result.deferred_bytes == 37
    # Still incomplete at the next passes (the qmaster is writing it): still nothing quarantined.
    write(acct, whole[37:-1])
    assert ingest_accounting(cluster, path=str(acct)).quarantined == 0
    assert QuarantinedLine.objects.count() == 0
    assert compare(cluster, [acct])["records"] == 1
    write(acct, whole[-1:])
    assert ingest_accounting(cluster, path=str(acct)).accepted == 1
    assert QuarantinedLine.objects.count() == 0
    assert_exact(cluster, [acct], "half-written line")


def test_fingerprint_and_plan(acct):
    write(acct, colon_line(500, 1))
    size = os.path.getsize(acct)
    inode = os.stat(acct).st_ino
    fp = fingerprint(acct, size)
    assert fp.startswith(f"{size}:") and fingerprint(acct, 0) == "" and fingerprint(acct, size + 1) == ""
    assert fingerprint(acct, size, inode=inode + 1) == ""
    plan = plan_read(acct, inode, size, fp)
    assert plan.cursor is not None and plan.cursor.offset == size and plan.reset is None
    assert plan_read(acct, inode, size + 10, fp).reset == "truncated"
    assert plan_read(acct, inode, size, "12:" + "0" * 64).reset == "truncated"
    os.rename(acct, acct.with_name("accounting.1"))
    with pytest.raises(FileNotFoundError):
        plan_read(acct, inode, size, fp)  # the rotated copy has nothing left and no new file yet
    write(acct, HEADER, "wb")
    assert plan_read(acct, inode, size, fp).reset == "rotated"
