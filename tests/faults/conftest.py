"""Fault tests: real services stopped, processes killed, files rotated; every record then compared.

Run them with ``scripts/faults`` (under the shared cluster lock). Tests that
stop the qmaster or Redis run as root (they use the services' own control
commands and restart them in ``finally``); jobs are always submitted as the
submit account ``tco`` (``runuser``). Each test ends with the line
"records in the database vs records in accounting: lost 0, doubled 0"
(tests/faults/ledger.py), also appended to ``$TCO_FAULT_LOG``.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.conf import settings

REPO = Path(__file__).resolve().parents[2]


def sge_env() -> dict:
    """The environment for Grid Engine commands (UTC, the dev cell)."""
    return {"SGE_ROOT": settings.SGE_ROOT, "SGE_CELL": settings.SGE_CELL, "TZ": "UTC",
            "PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"}


def qstat_answers() -> bool:
    return subprocess.run(["qstat", "-u", "*", "-xml"], env=sge_env(), capture_output=True,
                          timeout=30).returncode == 0


def wait_for(what: str, predicate, timeout: float, step: float = 0.5):
    """Call ``predicate`` until it returns a true value (returned) or ``timeout`` seconds pass (fails)."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(step)


def submit_as_tco(*args: str) -> int:
    """``qsub -terse`` as the submit account; returns the job number (``1234`` of ``1234.1-6:1``)."""
    user = os.environ.get("TCO_USER", "tco")
    argv = ["qsub", "-terse", *args]
    if os.getuid() == 0:
        argv = ["runuser", "-u", user, "--", "env", *(f"{k}={v}" for k, v in sge_env().items()), *argv]
    out = subprocess.run(argv, env=sge_env(), capture_output=True, text=True, timeout=60, cwd="/tmp")
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip().split(".")[0])


def child_env(db_name: str) -> dict:
    """Environment for a tco process (the ingest child, workers) on the test database ``db_name``."""
    return {**os.environ, "DATABASE_URL": f"sqlite:///{db_name}", "DJANGO_SETTINGS_MODULE": "tco_web.settings",
            "PYTHONDONTWRITEBYTECODE": "1", "PYTHONPATH": str(REPO)}


@pytest.fixture
def root_only():
    if os.getuid() != 0:
        pytest.fail("this fault test stops a service of the dev cluster and must run as root "
                    "(scripts/faults runs it so, under the cluster lock)")


@pytest.fixture
def fault_db(transactional_db, bootstrap):
    """The test database's file name (other processes open it) after bootstrap."""
    from django.db import connection

    return connection.settings_dict["NAME"]


def run_child(args: list[str], db_name: str, **kw) -> subprocess.Popen:
    """Start ``python -m tests.faults.ingest_child ARGS`` on the test database."""
    return subprocess.Popen([sys.executable, "-m", "tests.faults.ingest_child", *args], cwd=REPO,
                            env=child_env(db_name), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kw)
