"""PostgreSQL restarted in the middle of an accounting ingest, and down when an ingest starts.

The ingest runs in its own process (tests/faults/ingest_child.py) on the dev cluster's real
accounting file and the PostgreSQL test database. The server is restarted (``pg_ctlcluster ...
restart``: its sessions are ended) while the ingest holds a batch's transaction open: the ingest
fails as a worker task would, and what its checkpoint says is stored, is. An ingest started while
the server is stopped fails at once and stores nothing. Started again with the server up, it catches
up. Every record of the file is then compared with the database. As root (it restarts the server);
scripts/faults runs it with ``DATABASE_URL_FILE`` naming PostgreSQL.
"""
from __future__ import annotations

import os
import subprocess
import sys
from urllib.parse import quote

import pytest
from django.db import connection, connections

from dashboards.core.clusters import cluster_get_default
from dashboards.models import IngestCheckpoint

from .ledger import caught_up, compare
from .services import REPO, wait_for

pytestmark = [pytest.mark.integration]


def cluster_of_postgres() -> tuple[str, str]:
    """(version, name) of the one PostgreSQL cluster ``pg_lsclusters`` lists online."""
    for line in subprocess.run(["pg_lsclusters", "-h"], capture_output=True, text=True, check=True).stdout.splitlines():
        fields = line.split()
        if len(fields) >= 4 and fields[3].startswith("online"):
            return fields[0], fields[1]
    pytest.fail("no PostgreSQL cluster is online (scripts/postgres starts it)")


def answers() -> bool:
    try:
        connections.close_all()
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
        return True
    except Exception:  # noqa: BLE001 - any failure means "not yet"
        return False


def child(args: list[str]) -> subprocess.Popen:
    """The ingest child on this test's PostgreSQL database."""
    s = connection.settings_dict
    url = (f"postgres://{quote(s['USER'])}:{quote(s['PASSWORD'] or '')}@{s['HOST'] or 'localhost'}:{s['PORT'] or 5432}"
           f"/{s['NAME']}")
    env = {**os.environ, "DATABASE_URL": url, "DJANGO_SETTINGS_MODULE": "tco_web.settings",
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(REPO)}
    env.pop("DATABASE_URL_FILE", None)
    return subprocess.Popen([sys.executable, "-m", "tests.faults.ingest_child", *args], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_postgresql_restarted_mid_ingest_loses_nothing_and_doubles_nothing(fault_db, root_only):
    if connection.vendor != "postgresql":
        pytest.fail("run on PostgreSQL: scripts/faults sets DATABASE_URL_FILE for this test")
    version, name = cluster_of_postgres()
    cluster = cluster_get_default()
    path = cluster.accounting_path
    size = os.path.getsize(path)
    assert size > 8 * 1024, "the dev cluster's accounting file is too small to restart a server mid-ingest"

    # 1. Restarted while a batch's transaction is open (the child sleeps in it after its 2nd batch).
    ingest = child(["--max-bytes", "2048", "--pause", "1.5"])
    stored = 0
    while stored < 2:
        line = ingest.stdout.readline()
        assert line, f"the ingest ended before the restart: {ingest.stderr.read()}"
        stored += line.startswith("stored ")
    subprocess.run(["pg_ctlcluster", version, name, "restart"], check=True, capture_output=True, timeout=120)
    out, err = ingest.communicate(timeout=120)
    assert ingest.returncode == 3 and "db-error" in out, (ingest.returncode, out, err[-2000:])
    wait_for("PostgreSQL to answer again", answers, 60)
    checkpoint = IngestCheckpoint.objects.get(cluster=cluster, source="accounting")
    assert 0 < checkpoint.offset < size, "restarted mid-way: some batches stored, not all"
    partial = compare(cluster, [path], upto={path: checkpoint.offset})
    assert (partial["lost"], partial["doubled"], partial["extra"]) == (0, 0, 0), partial

    # 2. Started while the server is stopped: it fails at once and stores nothing.
    before = checkpoint.offset
    subprocess.run(["pg_ctlcluster", version, name, "stop"], check=True, capture_output=True, timeout=120)
    try:
        ingest = child(["--max-bytes", "2048"])
        out, err = ingest.communicate(timeout=120)
        assert ingest.returncode == 3 and "db-error" in out, (ingest.returncode, out, err[-2000:])
    finally:
        subprocess.run(["pg_ctlcluster", version, name, "start"], check=True, capture_output=True, timeout=120)
    wait_for("PostgreSQL to answer again", answers, 60)
    checkpoint.refresh_from_db()
    assert checkpoint.offset == before

    # 3. Up again: the next ingest catches up.
    ingest = child(["--max-bytes", "65536"])
    out, err = ingest.communicate(timeout=600)
    assert ingest.returncode == 0, (out, err[-2000:])
    caught_up(cluster, path, size, "PostgreSQL restarted mid-ingest, then down when an ingest started")
