"""Replay of a real SGE 8.1.9 accounting file from the dev cluster (tests/fixtures/sge819/accounting)."""
from __future__ import annotations

import datetime as dt
from pathlib import Path

from worker.schedulers.accounting import read_accounting

ACCOUNTING = Path(__file__).resolve().parent.parent / "fixtures" / "sge819" / "accounting"
UTC = dt.timezone.utc


def records() -> dict[tuple[int, int | None], object]:
    batch = read_accounting(ACCOUNTING, None)
    assert batch.quarantined == [] and batch.deferred_bytes == 0
    assert batch.skipped == 4  # the "# Version: 8.1.9" header block
    assert batch.cursor.offset == ACCOUNTING.stat().st_size
    return {(r.job_number, r.task_number): r for r in batch.records}


def test_every_line_of_the_real_file_is_a_record():
    assert sorted(records()) == [(122, None), (123, None), (124, 1), (124, 2), (124, 3), (125, 1), (125, 2),
                                 (131, None), (132, None), (133, None)]


def test_a_job_that_never_started_has_no_start_or_end():
    error = records()[(131, None)]
    assert (error.failed, error.exit_status) == (28, 0)
    assert error.submitted_at == dt.datetime(2026, 11, 29, 16, 25, 16, tzinfo=UTC)
    assert (error.started_at, error.ended_at, error.wallclock_s) == (None, None, 0.0)
    assert (error.project, error.category) == ("research", "-q agent.q -P research")


def test_exit_codes_and_deleted_jobs():
    by_key = records()
    assert (by_key[(132, None)].failed, by_key[(132, None)].exit_status) == (0, 0)
    assert (by_key[(133, None)].failed, by_key[(133, None)].exit_status) == (0, 3)
    deleted = by_key[(124, 2)]
    assert (deleted.failed, deleted.exit_status, deleted.wallclock_s) == (100, 137, 6.0)
    assert deleted.ended_at - deleted.started_at == dt.timedelta(seconds=6)
    assert (deleted.queue, deleted.hostname, deleted.slots, deleted.maxvmem_bytes) == ("agent.q", "vm", 1, 3612672.0)
    assert deleted.category == "-q agent.q -l anthropic_api=1 -P research"


def test_no_project_and_no_pe_are_none():
    single = records()[(122, None)]
    assert (single.project, single.granted_pe, single.pe_taskid, single.department) == (
        None, None, None, "defaultdepartment")
