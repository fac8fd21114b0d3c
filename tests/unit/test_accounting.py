"""Accounting lines (SGE 8 colon format, OCS 9 JSON) and the incremental reader."""
from __future__ import annotations

import datetime as dt
import json
import os
from pathlib import Path

import pytest

from schedulers.gridengine.parsers.accounting import parse_line, read_accounting
from schedulers.base import AccountingCursor, AccountingLineError

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
BUG06 = FIXTURES / "cases" / "BUG-06_malformed_accounting_lines"
OCS9 = FIXTURES / "ocs9"
UTC = dt.timezone.utc


def utc(*args) -> dt.datetime:
    return dt.datetime(*args, tzinfo=UTC)


# accounting(5) field order, 45 fields, with plausible values.
FIELDS = [
    ("qname", "agent.q"), ("hostname", "node01"), ("group", "tco"), ("owner", "tco"), ("job_name", "review"),
    ("job_number", "5101"), ("account", "sge"), ("priority", "0"), ("submission_time", "1741597200"),
    ("start_time", "1741597260"), ("end_time", "1741597320"), ("failed", "0"), ("exit_status", "0"),
    ("ru_wallclock", "60"), ("ru_utime", "1.500000"), ("ru_stime", "0.250000"), ("ru_maxrss", "20480.000000"),
    ("ru_ixrss", "0"), ("ru_ismrss", "0"), ("ru_idrss", "0"), ("ru_isrss", "0"), ("ru_minflt", "900"),
    ("ru_majflt", "0"), ("ru_nswap", "0"), ("ru_inblock", "0.000000"), ("ru_oublock", "8"), ("ru_msgsnd", "0"),
    ("ru_msgrcv", "0"), ("ru_nsignals", "0"), ("ru_nvcsw", "120"), ("ru_nivcsw", "7"), ("project", "research"),
    ("department", "defaultdepartment"), ("granted_pe", "NONE"), ("slots", "1"), ("task_number", "3"),
    ("cpu", "1.750000"), ("mem", "0.012000"), ("io", "0.000100"), ("category", "-q agent.q"),
    ("iow", "0.000000"), ("pe_taskid", "NONE"), ("maxvmem", "104857600.000000"), ("arid", "0"),
    ("ar_sub_time", "0"),
]


def colon_line(drop_ar: bool = False, **values: str) -> bytes:
    fields = dict(FIELDS)
    fields.update(values)
    names = [name for name, _ in FIELDS]
    if drop_ar:
        names = names[:-2]
    return ":".join(fields[name] for name in names).encode("utf-8")


def write(path: Path, *lines: bytes, end: bytes = b"\n") -> Path:
    path.write_bytes(b"\n".join(lines) + end)
    return path


# --------------------------------------------------------------------- BUG-06

def test_bug06_each_line_gets_the_expected_action():
    expected = json.loads((BUG06 / "expected.json").read_text())
    batch = read_accounting(BUG06 / "accounting", None)
    lines = (BUG06 / "accounting").read_bytes().split(b"\n")
    starts = [sum(len(line) + 1 for line in lines[:i]) for i in range(len(lines))]
    accepted = {r.job_number: r for r in batch.records}
    quarantined_offsets = {q.offset for q in batch.quarantined}
    for entry in expected["per_line"]:
        start = starts[entry["line"] - 1]
        if entry["action"] == "accept":
            record = accepted[entry["job_number"]]
            assert record.job_name == entry["job_name"]
            assert record.wallclock_s == entry["wallclock_s"]
        elif entry["action"] == "accept_with_defaults":
            record = accepted[entry["job_number"]]
            assert lines[entry["line"] - 1].count(b":") + 1 == entry["fields"]
            assert record.arid == entry["arid"]
            assert record.ar_submitted_at is None and entry["ar_submission_time"] == 0
        elif entry["action"] == "quarantine":
            assert start in quarantined_offsets
        elif entry["action"] == "defer":
            assert batch.cursor.offset == start
    counters = expected["counters_after_pass"]
    assert len(batch.records) == counters["accepted"]
    assert len(batch.quarantined) == counters["quarantined"]
    assert (1 if batch.deferred_bytes else 0) == counters["deferred"]
    assert batch.cursor.offset == expected["resume_offset_bytes"]


def test_bug06_values_written_out():
    batch = read_accounting(BUG06 / "accounting", None)
    assert [r.job_number for r in batch.records] == [7001, 7003]
    assert batch.skipped == 4
    (bad,) = batch.quarantined
    assert bad.offset == 357
    assert bad.raw.startswith(b"all.q:node02.example.org:team_c:user08:x9:stray:")
    assert "job_number" in bad.reason and "stray" in bad.reason
    assert batch.deferred_bytes == 144
    assert batch.cursor == AccountingCursor(inode=os.stat(BUG06 / "accounting").st_ino, offset=976)
    assert batch.reset is None
    ok = batch.records[0]
    assert (ok.submitted_at, ok.started_at, ok.ended_at) == (utc(2025, 3, 10, 15, 20), utc(2025, 3, 10, 15, 20, 10),
                                                             utc(2025, 3, 10, 15, 30, 10))
    assert (ok.cpu_s, ok.maxvmem_bytes, ok.project, ok.category) == (598.0, 1073741824.0, "proj_gamma",
                                                                     "-U team_c -q all.q")


def test_a_half_written_last_line_is_read_once_it_is_complete(tmp_path):
    path = tmp_path / "accounting"
    full = colon_line(job_number="42")
    path.write_bytes(colon_line(job_number="41") + b"\n" + full[:100])
    first = read_accounting(path, None)
    assert [r.job_number for r in first.records] == [41]
    assert first.deferred_bytes == 100
    with open(path, "ab") as handle:
        handle.write(full[100:] + b"\n")
    second = read_accounting(path, first.cursor)
    assert [r.job_number for r in second.records] == [42]
    assert second.deferred_bytes == 0
    assert second.cursor.offset == path.stat().st_size
    assert read_accounting(path, second.cursor).records == []


# ------------------------------------------------------------ colon format

def test_a_45_field_line_gives_every_record_field():
    record = parse_line(colon_line() + b"\n")
    assert (record.job_number, record.task_number, record.pe_taskid) == (5101, 3, None)
    assert (record.job_name, record.owner, record.group, record.account) == ("review", "tco", "tco", "sge")
    assert (record.project, record.department, record.granted_pe) == ("research", "defaultdepartment", None)
    assert (record.queue, record.hostname, record.slots) == ("agent.q", "node01", 1)
    assert record.submitted_at == utc(2025, 3, 10, 9, 0, 0)
    assert record.ended_at - record.started_at == dt.timedelta(seconds=60)
    assert (record.wallclock_s, record.cpu_s, record.maxvmem_bytes) == (60.0, 1.75, 104857600.0)
    assert (record.failed, record.exit_status, record.category, record.usage) == (0, 0, "-q agent.q", {})
    assert record.identity("c1") == ("c1", 5101, 3, "", record.submitted_at, record.started_at, record.ended_at)


def test_a_43_field_line_from_before_advance_reservations_is_accepted():
    record = parse_line(colon_line(drop_ar=True))
    assert record.job_number == 5101 and record.arid == 0 and record.ar_submitted_at is None


def test_an_advance_reservation_is_read_from_the_last_two_fields():
    record = parse_line(colon_line(arid="17", ar_sub_time="1741590000"))
    assert record.arid == 17 and record.ar_submitted_at == utc(2025, 3, 10, 7, 0, 0)


@pytest.mark.parametrize("drop_ar", [False, True])
def test_a_category_with_colons_is_rejoined(drop_ar):
    category = "-l h_rt=01:00:00,anthropic_api=1 -q agent.q -ac tco=a:b"
    record = parse_line(colon_line(drop_ar=drop_ar, category=category))
    assert record.category == category
    assert (record.job_number, record.maxvmem_bytes, record.pe_taskid) == (5101, 104857600.0, None)


def test_none_and_zero_mean_absent():
    record = parse_line(colon_line(project="NONE", granted_pe="NONE", pe_taskid="NONE", task_number="0",
                                   submission_time="0", start_time="0", end_time="0", failed="9"))
    assert (record.project, record.granted_pe, record.pe_taskid, record.task_number) == (None, None, None, None)
    assert (record.submitted_at, record.started_at, record.ended_at, record.failed) == (None, None, None, 9)


def test_a_parallel_task_keeps_its_pe_and_task_id():
    record = parse_line(colon_line(granted_pe="smp", pe_taskid="1.node01", slots="4"))
    assert (record.granted_pe, record.pe_taskid, record.slots) == ("smp", "1.node01", 4)


def test_non_utf8_bytes_in_a_job_name_do_not_crash():
    record = parse_line(colon_line().replace(b":review:", b":r\xe9v\xff:"))
    assert record.job_name == "r\ufffdv\ufffd"


@pytest.mark.parametrize("line", [b"abc", b"x.y", b"1:2:3", b"a:b:c:d:e:f:g:h:i:j:k:l:m:n:o:p:q:r:s:t:x.y",
                                  b"a:b:c:d:e:f:g:h:i:j:k:l:m:n:o:p:q:r:s:t:u:v", b" ", b"\xff\xfe"])
def test_short_garbage_lines_raise_a_field_count_reason(line):
    with pytest.raises(AccountingLineError) as caught:
        parse_line(line)
    assert "fields" in caught.value.reason


@pytest.mark.parametrize(
    ("line", "reason_part"),
    [
        (colon_line(job_name="a:b"), "job_number"),
        (colon_line(job_number="12x"), "job_number"),
        (colon_line(start_time="soon"), "start_time"),
        (colon_line(end_time="600"), "end_time"),
        (colon_line(slots="NONE"), "slots"),
        (colon_line(cpu="n/a"), "cpu"),
        (b":".join(colon_line().split(b":")[:30]), "fields"),
        (colon_line(arid="x"), "arid"),
    ],
    ids=["colon-in-name", "job-number", "time-word", "time-not-epoch", "slots", "cpu", "too-few", "arid"],
)
def test_shifted_or_mistyped_lines_raise_with_a_reason(line, reason_part):
    with pytest.raises(AccountingLineError) as caught:
        parse_line(line)
    assert reason_part in caught.value.reason


# ---------------------------------------------------------------- OCS 9 JSON

def json_lines(name: str) -> list[bytes]:
    return (OCS9 / name).read_bytes().splitlines()


def test_ocs_900_json_line_with_inner_usage_key():
    done, failed_start = [parse_line(line) for line in json_lines("accounting_9.0.0.jsonl")]
    assert (done.job_number, done.task_number, done.project, done.granted_pe) == (311, None, None, None)
    assert done.started_at == utc(2026, 3, 2, 14, 5, 1, 123456)
    assert done.submitted_at == utc(2026, 3, 2, 14, 4, 59, 500000)
    assert (done.wallclock_s, done.cpu_s, done.maxvmem_bytes) == (30.0, 13.25, 104857600.0)
    assert (done.category, done.usage, done.pe_taskid, done.deleted_by) == ("-q agent.q", {}, None, None)
    assert (failed_start.task_number, failed_start.started_at, failed_start.failed) == (4, None, 26)


def test_ocs_91x_json_line_with_eusage_deleted_by_and_flexible_accounting():
    first, second = [parse_line(line) for line in json_lines("accounting_9.1.x.jsonl")]
    assert (first.project, first.granted_pe, first.pe_taskid, first.slots) == ("research", "smp", None, 4)
    assert (first.wallclock_s, first.cpu_s, first.maxvmem_bytes) == (71.0, 3.75, 314572800.0)
    assert first.usage == {"tco": {"input_tokens": 20111, "output_tokens": 1043, "cost_uusd": 75978},
                           "gpu": {"nvidia_power": 35.5}}
    assert first.ended_at == utc(2026, 3, 2, 14, 6, 12)
    assert (second.exit_status, second.deleted_by) == (137, "tco@vm")
    assert set(second.usage) == {"tco"}


@pytest.mark.parametrize(
    "line",
    [b'{"job_number": 1, "submission_time": ', b'{["not", "json"]',
     b'{"job_number": "1", "submission_time": 1772460299500000, "start_time": 0, "end_time": 0, '
     b'"failed": 0, "exit_status": 0}',
     b'{"job_number": 1, "submission_time": 1772460299, "start_time": 0, "end_time": 0, '
     b'"failed": 0, "exit_status": 0}',
     b'{"job_number": 1, "submission_time": 1772460299500000, "start_time": 0, "end_time": 0, "failed": 0}'],
    ids=["truncated", "not-json", "job-number-string", "seconds-not-microseconds", "no-exit-status"],
)
def test_bad_json_lines_raise(line):
    with pytest.raises(AccountingLineError):
        parse_line(line)


def test_colon_and_json_lines_mix_in_one_file(tmp_path):
    path = write(tmp_path / "accounting", b"# Version: 9.0.0", colon_line(job_number="1"),
                 json_lines("accounting_9.1.x.jsonl")[0], b"", b"x", b"{not json")
    batch = read_accounting(path, None)
    assert [r.job_number for r in batch.records] == [1, 5101]
    assert batch.skipped == 3
    assert [q.raw for q in batch.quarantined] == [b"{not json"]


def test_quarantined_lines_carry_their_own_byte_offsets_even_when_repeated(tmp_path):
    good = colon_line(job_number="1")
    bad = colon_line(job_number="oops")
    path = write(tmp_path / "accounting", bad, good, bad, b"#", bad)
    batch = read_accounting(path, AccountingCursor(inode=os.stat(path).st_ino, offset=0))
    step = len(bad) + 1
    assert [q.offset for q in batch.quarantined] == [0, step + len(good) + 1, 2 * step + len(good) + 1 + 2]
    assert all(path.read_bytes()[q.offset:q.offset + len(q.raw)] == q.raw for q in batch.quarantined)
    assert [r.job_number for r in batch.records] == [1]


def test_a_quarantined_offset_is_counted_from_the_start_of_the_file(tmp_path):
    path = write(tmp_path / "accounting", colon_line(job_number="1"))
    first = read_accounting(path, None)
    with open(path, "ab") as handle:
        handle.write(colon_line(job_number="x") + b"\n")
    (bad,) = read_accounting(path, first.cursor).quarantined
    assert bad.offset == first.cursor.offset > 0


# ------------------------------------------------------- cursor, rotation

def test_a_rotated_file_is_read_from_the_start(tmp_path):
    path = write(tmp_path / "accounting", colon_line(job_number="1"), colon_line(job_number="2"))
    first = read_accounting(path, None)
    os.rename(path, tmp_path / "accounting.0")
    write(path, colon_line(job_number="3"))
    second = read_accounting(path, first.cursor)
    assert second.reset == "rotated"
    assert [r.job_number for r in second.records] == [3]
    assert second.cursor.inode != first.cursor.inode


def test_a_truncated_file_is_read_from_the_start(tmp_path):
    path = write(tmp_path / "accounting", colon_line(job_number="1"), colon_line(job_number="2"))
    first = read_accounting(path, None)
    with open(path, "r+b") as handle:  # same inode, shorter content
        handle.truncate(0)
        handle.write(colon_line(job_number="9") + b"\n")
    second = read_accounting(path, first.cursor)
    assert second.reset == "truncated"
    assert [r.job_number for r in second.records] == [9]
    assert second.cursor.inode == first.cursor.inode


def test_a_cursor_at_the_end_reads_nothing_and_stays(tmp_path):
    path = write(tmp_path / "accounting", colon_line(job_number="1"))
    first = read_accounting(path, None)
    again = read_accounting(path, first.cursor)
    assert (again.records, again.quarantined, again.skipped, again.reset) == ([], [], 0, None)
    assert again.cursor == first.cursor


def test_max_bytes_stops_at_a_line_boundary_and_resumes(tmp_path):
    lines = [colon_line(job_number=str(n)) for n in range(1, 6)]
    path = write(tmp_path / "accounting", *lines)
    cursor, seen, passes = None, [], 0
    while True:
        batch = read_accounting(path, cursor, max_bytes=len(lines[0]) * 2 + 5)
        passes += 1
        seen += [r.job_number for r in batch.records]
        if batch.cursor == cursor:
            break
        cursor = batch.cursor
    assert seen == [1, 2, 3, 4, 5]
    assert passes == 4


def test_a_line_longer_than_max_bytes_is_still_read(tmp_path):
    path = write(tmp_path / "accounting", colon_line(job_number="1"), colon_line(job_number="2"))
    batch = read_accounting(path, None, max_bytes=10)
    assert [r.job_number for r in batch.records] == [1]
    assert batch.cursor.offset == len(colon_line(job_number="1")) + 1


def test_a_missing_file_raises_file_not_found(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_accounting(tmp_path / "nope", None)
