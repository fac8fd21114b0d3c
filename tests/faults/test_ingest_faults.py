"""A worker killed with SIGKILL in the middle of an accounting ingest; the database locked, then unavailable.

The ingest runs in its own process (tests/faults/ingest_child.py) on the
dev cluster's real accounting file and the test database. It is killed
mid-transaction, restarted while the database is locked for longer than its
busy timeout (it fails, as a worker task would, and nothing is half-stored),
then restarted while the database is locked for a few seconds (it waits and
finishes). Every record of the file is then compared with the database.
"""
from __future__ import annotations

import os
import signal
import sqlite3
import threading
import time

import pytest

from dashboards.models import IngestCheckpoint
from dashboards.core.clusters import cluster_get_default

from .services import run_child
from .ledger import caught_up, compare

pytestmark = [pytest.mark.integration]


def hold_exclusive_lock(db_name: str, seconds: float) -> threading.Thread:
    """Another writer holding SQLite's exclusive lock for ``seconds`` (returns once it holds it)."""
    held = threading.Event()

    def hold():
        con = sqlite3.connect(db_name, timeout=30, isolation_level=None)
        try:
            con.execute("BEGIN EXCLUSIVE")
            held.set()
            time.sleep(seconds)
            con.execute("COMMIT")
        finally:
            con.close()

    thread = threading.Thread(target=hold, daemon=True)
    thread.start()
    assert held.wait(30)
    return thread


def test_an_ingest_killed_mid_batch_then_locked_out_ends_as_if_nothing_happened(fault_db):
    path = cluster_get_default().accounting_path
    size = os.path.getsize(path)
    assert size > 8 * 1024, "the dev cluster's accounting file is too small to kill an ingest mid-way"
    cluster = cluster_get_default()
    assert cluster.accounting_path == path

    # 1. SIGKILL after the third batch's insert, inside its transaction.
    child = run_child(["--max-bytes", "2048", "--pause", "0.5"], fault_db)
    stored = 0
    while stored < 3:
        line = child.stdout.readline()
        assert line, f"the ingest ended before it could be killed: {child.stderr.read()}"
        stored += line.startswith("stored ")
    child.send_signal(signal.SIGKILL)
    child.wait(timeout=30)
    assert child.returncode == -signal.SIGKILL
    checkpoint = IngestCheckpoint.objects.get(cluster=cluster, source="accounting")
    assert 0 < checkpoint.offset < size, "killed mid-way: some batches stored, not all"
    partial = compare(cluster, [path], upto={path: checkpoint.offset})
    assert (partial["lost"], partial["doubled"]) == (0, 0), partial  # what the checkpoint says is stored, is

    # 2. Restarted while the database stays locked past its busy timeout: it fails, stores nothing.
    before = checkpoint.offset
    locker = hold_exclusive_lock(fault_db, 4.0)
    child = run_child(["--max-bytes", "2048", "--db-timeout", "1"], fault_db)
    out, err = child.communicate(timeout=120)
    locker.join()
    assert child.returncode == 3 and "db-error" in out and "locked" in out, (out, err)
    checkpoint.refresh_from_db()
    assert checkpoint.offset == before

    # 3. Restarted while the database is locked for a few seconds: it waits and catches up.
    locker = hold_exclusive_lock(fault_db, 3.0)
    child = run_child(["--max-bytes", "2048"], fault_db)
    out, err = child.communicate(timeout=300)
    locker.join()
    assert child.returncode == 0, (out, err)
    caught_up(cluster, path, size, "ingest SIGKILL + database locked")
