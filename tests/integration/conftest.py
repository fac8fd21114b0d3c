"""Integration tests run against the real dev cluster (scripts/dev-cluster).

They are skipped only when ``TCO_SKIP_INTEGRATION=1``. A missing or broken
cluster is a failure with a message that says what to fix, never a silent
skip. Run them as the submitting account ``tco`` (root may not submit), with
the DRMAA environment set before Python starts::

    runuser -u tco -- env LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2 \\
        DRMAA_LIBRARY_PATH=/usr/lib/gridengine-drmaa/lib/libdrmaa.so.1.0 \\
        SGE_ROOT=/var/lib/gridengine SGE_CELL=default PYTHONDONTWRITEBYTECODE=1 \\
        /work/main/.venv/bin/python -m pytest -p no:cacheprovider tests/integration
"""
from __future__ import annotations

import os

import pytest

from schedulers.base import SchedulerError


def pytest_configure(config):
    config.addinivalue_line("markers", "integration: needs the real dev cluster (TCO_SKIP_INTEGRATION=1 skips)")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("TCO_SKIP_INTEGRATION") != "1":
        return
    skip = pytest.mark.skip(reason="TCO_SKIP_INTEGRATION=1")
    for item in items:
        if "integration" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def sge_cluster() -> dict:
    """Check the dev cluster can be used from this process; fail with the fix if not.

    Returns ``{"sge_root", "sge_cell", "accounting_path"}``.
    """
    from schedulers.gridengine import drmaa as drmaa_session
    from schedulers.gridengine.commands import run_command

    if os.getuid() == 0:
        pytest.fail("integration tests submit jobs and must run as the tco account, not root "
                    "(runuser -u tco -- ...; see tests/integration/conftest.py)")
    sge_root = os.environ.get("SGE_ROOT", "/var/lib/gridengine")
    sge_cell = os.environ.get("SGE_CELL", "default")
    try:
        run_command(["qstat", "-xml", "-u", "*"], env_extra={"SGE_ROOT": sge_root, "SGE_CELL": sge_cell})
    except SchedulerError as exc:
        pytest.fail(f"the dev cluster does not answer ({exc}); start it with scripts/dev-cluster "
                    f"or set TCO_SKIP_INTEGRATION=1 to skip integration tests")
    try:
        drmaa_session.load_drmaa()
    except SchedulerError as exc:
        pytest.fail(str(exc))
    return {"sge_root": sge_root, "sge_cell": sge_cell,
            "accounting_path": os.path.join(sge_root, sge_cell, "common", "accounting")}
