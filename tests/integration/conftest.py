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
import shutil
import time

import pytest

from schedulers.base import SchedulerError


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


@pytest.fixture
def stand_in_model(tmp_path):
    """The demo's scripted stand-in model (key ``tests.support.stand_in.KEY``) on a free port of the
    master's address (where the execution hosts reach it); its URL."""
    from django.conf import settings as django_settings

    from demo.demo_model import spawn
    from schedulers.hosts import master_address
    from tests.support.paths import REPO
    from tests.support.stack import free_port
    from tests.support.stand_in import KEY

    port = free_port()
    key_file = tmp_path / "model.key"
    key_file.write_text(KEY + "\n")
    # On the master's address the execution hosts reach (127.0.0.1 on a single-host cluster).
    host = master_address(django_settings.SGE_ROOT, django_settings.SGE_CELL)
    proc = spawn(port=port, api_key_file=str(key_file), script="review", cwd=str(REPO), host=host)
    yield f"http://{host}:{port}"
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def runs_dir():
    """A sweep's run directory outside the host's /tmp (nothing in it can be listed in a sandbox policy:
    other tasks' scratch space) and outside the test's state directory (tco's own files): under the
    real state dir's test output."""
    from tests.support.stack import TEST_OUTPUT

    # The real state directory's test output, as it was when the tests started: ``bootstrap`` points
    # STATE_DIR at the test's own tmp_path (inside /tmp) before this fixture runs.
    path = TEST_OUTPUT / f"sweep-runs-{time.time_ns()}"
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
