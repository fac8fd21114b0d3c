"""The dev cluster's real accounting file rotated under the qmaster (as logchecker.sh does).

A job's records are written, not yet ingested, and the file is moved aside;
the qmaster starts a new file for the next job. One ingest then reads the
rest of the rotated file (found by its inode) and the new file: both jobs'
records are in the database once. The file is put back together in
``finally`` (rotated + new, under its name again) so the cluster is left as
it was. The file-level cases (truncated and regrown, half-written line,
crash mid-rotation) are in tests/db/test_accounting_cursor.py.
"""
from __future__ import annotations

import os
import shutil
import time

import pytest

from dashboards.ingest.accounting import ingest_accounting
from dashboards.models import AccountingRecord, IngestCheckpoint
from dashboards.core.clusters import cluster_get_default

from .services import submit_as_tco, wait_for
from .ledger import compare, file_identities, report

pytestmark = [pytest.mark.integration]


def submit_short(name: str) -> int:
    return submit_as_tco("-q", "agent.q", "-P", "research", "-l", "anthropic_api=1", "-N", name, "-b", "y",
                         "-o", "/dev/null", "-e", "/dev/null", "-t", "1-3", "/bin/true")


def test_records_written_just_before_a_rotation_are_read_from_the_rotated_file(fault_db, root_only):
    path = cluster_get_default().accounting_path
    cluster = cluster_get_default()
    while ingest_accounting(cluster).accepted:
        pass
    before = IngestCheckpoint.objects.get(cluster=cluster)
    assert before.offset == os.path.getsize(path) or before.offset > 0

    job_a = submit_short("fault-rot-a")
    wait_for("job A's records in the accounting file", lambda: len(file_identities([path], {job_a})) == 3, 120)
    rotated = f"{path}.fault-{int(time.time())}"
    os.rename(path, rotated)  # logchecker.sh's move; the qmaster opens the file by name for each write
    try:
        job_b = submit_short("fault-rot-b")
        wait_for("job B's records in a new accounting file",
                 lambda: os.path.exists(path) and len(file_identities([path], {job_b})) == 3, 120)
        assert os.stat(path).st_ino != os.stat(rotated).st_ino
        result = ingest_accounting(cluster)
        while ingest_accounting(cluster).accepted:
            pass
        assert result.reset == "rotated"
        stored = AccountingRecord.objects.filter(job_number__in=[job_a, job_b]).count()
        assert stored == 6, stored
        checkpoint = IngestCheckpoint.objects.get(cluster=cluster)
        assert checkpoint.inode == os.stat(path).st_ino
        outcome = compare(cluster, [rotated, path], upto={path: checkpoint.offset})
    finally:
        # Put the file back together under its name (no job runs: the cluster lock is held).
        if os.path.exists(path):
            with open(rotated, "ab") as whole, open(path, "rb") as tail:
                shutil.copyfileobj(tail, whole)
        os.replace(rotated, path)
    report(outcome, "accounting file rotated under the qmaster")
    assert (outcome["lost"], outcome["doubled"], outcome["extra"]) == (0, 0, 0), outcome
    jobs = compare(cluster, [path], jobs={job_a, job_b})
    assert (jobs["lost"], jobs["records"]) == (0, 6)
