"""A new cell's missing accounting file: quiet until a job has ended, then the loud error, logged once.

Found on a fresh machine (2026-12-03): for the first minutes of `make demo`, before the cell's first job
ended, the ingest worker logged "accounting file ... does not exist" as an ERROR on every pass (180 lines
in two minutes, 4 a second in the seed replay's own loop) and the queue page showed it as a fault. Grid
Engine writes the file with its first record (sge_accounting(5)); a wrong path must stay loud.
"""
from __future__ import annotations

import datetime as dt
import logging
import shutil
from pathlib import Path

import pytest
from django.utils import timezone

FIXTURE = Path(__file__).resolve().parent.parent / "fixtures" / "sge819" / "accounting"
RECORDS = sum(1 for line in FIXTURE.read_text().splitlines() if line and not line.startswith("#"))


@pytest.fixture
def new_cell(db, tmp_path):
    """An sge8 cluster whose cell directory exists and holds no accounting file yet."""
    from dashboards.models import Cluster

    common = tmp_path / "default" / "common"
    common.mkdir(parents=True)
    return Cluster.objects.create(name="fresh", flavour="sge8", sge_root=str(tmp_path), sge_cell="default",
                                  accounting_path=str(common / "accounting"))


def _ingest(cluster):
    from dashboards.ingest.accounting import ingest_accounting
    from dashboards.models import Cluster

    return ingest_accounting(Cluster.objects.get(pk=cluster.pk))


def _task_gone(cluster, seconds_ago: float):
    from dashboards.models import Task

    Task.objects.create(cluster=cluster, job_number=1, task_number=0, state="finishing", active=False,
                        gone_at=timezone.now() - dt.timedelta(seconds=seconds_ago))


def test_before_the_first_job_ends_a_missing_file_is_no_error(new_cell, caplog):
    caplog.set_level(logging.DEBUG, logger="dashboards.ingest.accounting")
    for _ in range(3):
        result = _ingest(new_cell)
        assert result.error == "" and result.accepted == 0
        assert new_cell.accounting_path in result.waiting and "first job" in result.waiting
    new_cell.refresh_from_db()
    assert new_cell.accounting_error == "" and new_cell.accounting_error_at is None
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_a_task_that_left_the_queue_just_now_is_still_within_the_grace(new_cell):
    _task_gone(new_cell, 5)
    assert _ingest(new_cell).error == ""


def test_once_a_task_left_the_queue_a_minute_ago_the_missing_file_is_the_loud_error_logged_once(new_cell, caplog):
    from dashboards.ingest.accounting import FIRST_RECORD_GRACE_S

    _task_gone(new_cell, FIRST_RECORD_GRACE_S + 5)
    caplog.set_level(logging.DEBUG, logger="dashboards.ingest.accounting")
    errors = [_ingest(new_cell).error for _ in range(4)]
    assert all(new_cell.accounting_path in e and e.startswith("accounting not read") for e in errors)
    assert len(set(errors)) == 1
    logged = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(logged) == 1, [r.getMessage() for r in logged]  # the error's start, not each pass
    new_cell.refresh_from_db()
    assert new_cell.accounting_path in new_cell.accounting_error


def test_a_file_that_was_read_and_then_vanished_is_the_loud_error(new_cell):
    path = Path(new_cell.accounting_path)
    shutil.copy(FIXTURE, path)
    first = _ingest(new_cell)
    assert (first.error, first.waiting, first.accepted) == ("", "", RECORDS)
    path.unlink()
    result = _ingest(new_cell)
    assert str(path) in result.error and result.waiting == ""


def test_another_accounting_file_beside_the_path_is_the_loud_error_naming_it(new_cell):
    Path(new_cell.accounting_path + ".jsonl").write_text("")  # an OCS 9 cell's file name
    result = _ingest(new_cell)
    assert "but accounting.jsonl is there" in result.error and result.waiting == ""


def test_a_missing_cell_directory_is_the_loud_error(new_cell, tmp_path):
    shutil.rmtree(tmp_path / "default")
    result = _ingest(new_cell)
    assert new_cell.accounting_path in result.error and result.waiting == ""
