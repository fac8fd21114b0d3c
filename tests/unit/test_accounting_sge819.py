"""Replay of a real SGE 8.1.9 accounting file from the dev cluster (tests/fixtures/sge819/accounting).

What each job did is in sge819/README.md; records are found by job name, so a
refreshed capture (new job ids and times) keeps these tests valid.
"""
from __future__ import annotations

import datetime as dt
from pathlib import Path

from schedulers.gridengine.parsers.accounting import read_accounting

ACCOUNTING = Path(__file__).resolve().parent.parent / "fixtures" / "sge819" / "accounting"
UTC = dt.timezone.utc


def records_by_name() -> dict[str, list]:
    batch = read_accounting(ACCOUNTING, None)
    assert batch.quarantined == [] and batch.deferred_bytes == 0
    assert batch.skipped == 4  # the "# Version: 8.1.9" header block
    assert batch.cursor.offset == ACCOUNTING.stat().st_size
    result: dict[str, list] = {}
    for record in batch.records:
        result.setdefault(record.job_name, []).append(record)
    return result


def test_every_line_of_the_real_file_is_a_record():
    data_lines = [line for line in ACCOUNTING.read_bytes().splitlines() if line and not line.startswith(b"#")]
    by_name = records_by_name()
    assert sum(len(records) for records in by_name.values()) == len(data_lines)
    assert {"fx_error", "fx_ok", "fx_fail", "fx_single", "fx_array_run"} <= set(by_name)


def test_a_job_that_never_started_has_no_start_or_end():
    (error,) = records_by_name()["fx_error"]
    assert (error.failed, error.exit_status) == (28, 0)
    assert error.submitted_at.tzinfo == UTC and error.submitted_at.year >= 2025
    assert (error.started_at, error.ended_at, error.wallclock_s, error.task_number) == (None, None, 0.0, None)
    assert (error.project, error.category) == ("research", "-q agent.q -P research")


def test_exit_codes_and_deleted_jobs():
    by_name = records_by_name()
    (ok,) = by_name["fx_ok"]
    (fail,) = by_name["fx_fail"]
    assert (ok.failed, ok.exit_status, fail.failed, fail.exit_status) == (0, 0, 0, 3)
    tasks = sorted(by_name["fx_array_run"], key=lambda r: r.task_number)
    assert [r.task_number for r in tasks] == [1, 2, 3]
    for deleted in tasks:
        assert (deleted.failed, deleted.exit_status) == (100, 137)  # qdel of a running task
        assert deleted.wallclock_s == (deleted.ended_at - deleted.started_at).total_seconds()
        assert (deleted.queue, deleted.hostname, deleted.slots) == ("agent.q", "vm", 1)
        assert deleted.maxvmem_bytes > 0 and deleted.cpu_s >= 0
        assert deleted.category == "-q agent.q -l anthropic_api=1 -P research"
        assert deleted.submitted_at <= deleted.started_at


def test_no_project_and_no_pe_are_none():
    (single,) = records_by_name()["fx_single"]
    assert (single.project, single.granted_pe, single.pe_taskid, single.department) == (
        None, None, None, "defaultdepartment")
