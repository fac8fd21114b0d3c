"""The accounting file read ahead of the ingest (GridEngine.accounting_since): the same batches as
reading each one when asked, whatever the caller asks next."""
from __future__ import annotations

from schedulers.gridengine.adapter import GridEngine
from schedulers.gridengine.parsers.accounting import read_accounting
from tests.support.accounting import HEADER, colon_line


def test_batches_read_ahead_equal_batches_read_when_asked(tmp_path):
    path = tmp_path / "accounting"
    path.write_bytes(HEADER + b"".join(colon_line(100 + n // 10, n % 10 + 1) for n in range(300)))
    adapter = GridEngine(accounting_path=str(path))
    got, cursor = [], None
    while True:
        batch = adapter.accounting_since(cursor, 4096)
        if not batch.records:
            break
        got.append([(r.job_number, r.task_number) for r in batch.records])
        cursor = batch.cursor
    expected, raw = [], None
    while True:
        batch = read_accounting(str(path), raw, max_bytes=4096)
        if not batch.records:
            break
        expected.append([(r.job_number, r.task_number) for r in batch.records])
        raw = batch.cursor
    assert got == expected and len(got) > 5 and sum(map(len, got)) == 300


def test_a_call_for_another_cursor_reads_afresh_and_lines_written_since_are_read(tmp_path):
    path = tmp_path / "accounting"
    path.write_bytes(HEADER + b"".join(colon_line(200, n) for n in range(1, 41)))
    adapter = GridEngine(accounting_path=str(path))
    first = adapter.accounting_since(None, 2048)  # the next batch is now read ahead
    again = adapter.accounting_since(None, 2048)  # not the cursor read ahead: read afresh, the same
    assert [r.task_number for r in again.records] == [r.task_number for r in first.records]
    cursor = first.cursor
    while (batch := adapter.accounting_since(cursor, 2048)).records:
        cursor = batch.cursor
    with open(path, "ab") as fh:  # the end was read (nothing read ahead); new lines come next
        fh.write(colon_line(201, 1))
    assert [(r.job_number, r.task_number) for r in adapter.accounting_since(cursor, 2048).records] == [(201, 1)]
