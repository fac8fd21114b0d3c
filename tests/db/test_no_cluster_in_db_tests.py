"""The database tier reaches no cluster: the machine's Grid Engine clients answer "unavailable" there
(tests/conftest.py ``_no_cluster_commands``), a test's own stand-in binary still runs."""
from __future__ import annotations

import os
import stat

import pytest

from schedulers.base import SchedulerUnavailable


@pytest.mark.django_db
def test_the_default_clusters_qstat_is_unavailable_in_a_db_test():
    from dashboards.core.clusters import cluster_get_default, scheduler_for
    from dashboards.launch.forecast import fresh_queue_row

    cluster = cluster_get_default()
    with pytest.raises(SchedulerUnavailable, match="reach no cluster"):
        scheduler_for(cluster).queue_summary()
    _, source = fresh_queue_row(cluster, "agent.q")
    assert source.startswith("the last cluster poll (qstat -g c failed now")


def test_a_stand_in_client_on_the_tests_own_path_runs(tmp_path, monkeypatch):
    from schedulers.gridengine import adapter

    qstat = tmp_path / "qstat"
    qstat.write_text("#!/bin/sh\necho stand-in \"$@\"\n")
    qstat.chmod(qstat.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert adapter.run_command(["qstat", "-g", "c"]) == b"stand-in -g c\n"
