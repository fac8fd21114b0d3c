"""The Grid Engine accounting file, read incrementally and strictly.

Two line formats, told apart per line (as OCS's qacct does, ocs_qacct.cc):

- **Colon format** (SGE 8.1.9 ``common/accounting``; OCS/GCS 9 with
  ``reporting_params old_accounting=true``), accounting(5): 45 fields
  separated by ``:``, or 43 in files written before advance reservations
  (no ``arid``, ``ar_sub_time``). Nothing is escaped, and field 40
  ``category`` may itself contain colons, so fields 1-39 are taken from the
  left, the last 5 (or 3) from the right, and the middle is re-joined with
  ``:`` as the category. A 43-field line is recognised by its last field,
  ``maxvmem``, printed ``%f`` (it has a ``.``), where a 45-field line ends
  with the integer ``ar_sub_time``. Times are epoch seconds, 0 = none;
  ``project``, ``granted_pe``, ``pe_taskid`` are ``NONE`` when empty;
  ``task_number`` 0 for a non-array job.
- **JSON lines** (OCS/GCS 9 ``common/accounting.jsonl``), sge_accounting(5)
  of OCS 9: a line starting with ``{``. Times are µs since the epoch;
  ``usage.rusage`` holds getrusage values (``ru_wallclock`` integer
  seconds), ``usage.eusage`` (``usage.usage`` before 9.0.6) the scheduler's
  own (``cpu`` s, ``maxvmem`` bytes…); string attributes that are NULL are
  omitted. Every other object under ``usage`` is a flexible-accounting
  group (``usage_patterns``) and is kept as written in ``record.usage``.

A line whose fields do not have the types of their position (a job number
that is not an integer, a time that is not an epoch value, a wrong field
count) raises ``AccountingLineError`` and is quarantined by
``read_accounting``: a shifted line is never ingested.

Bytes that are not UTF-8 are decoded with ``errors="replace"`` (U+FFFD):
record strings stay valid text for the database and JSON; the quarantine
keeps a rejected line's raw bytes.
"""
from __future__ import annotations

import datetime as dt
import gc
import json
import math
import os
from typing import Callable

from schedulers.base import (AccountingBatch, AccountingCursor, AccountingLineError, AccountingRecord,
                   QuarantinedLine, SchedulerUnavailable)

__all__ = ["parse_line", "read_accounting", "usage_group_values", "UTC"]

UTC = dt.timezone.utc
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=UTC)
# An epoch time outside 1980..2100 is not a time: the line is shifted.
_T_MIN = 315532800
_T_MAX = 4102444800
_T_MIN_US = _T_MIN * 1_000_000
_T_MAX_US = _T_MAX * 1_000_000

# 0-based positions in the colon format (accounting(5) numbers them from 1).
_COLON_FIELDS = (
    "qname", "hostname", "group", "owner", "job_name", "job_number", "account", "priority",
    "submission_time", "start_time", "end_time", "failed", "exit_status", "ru_wallclock",
    "ru_utime", "ru_stime", "ru_maxrss", "ru_ixrss", "ru_ismrss", "ru_idrss", "ru_isrss",
    "ru_minflt", "ru_majflt", "ru_nswap", "ru_inblock", "ru_oublock", "ru_msgsnd", "ru_msgrcv",
    "ru_nsignals", "ru_nvcsw", "ru_nivcsw", "project", "department", "granted_pe", "slots",
    "task_number", "cpu", "mem", "io",
)
# The numeric fields whose types are checked (a line shifted by a stray
# colon puts a string where one of them should be: strings and numbers
# alternate in the left part), searched in this order to name the culprit.
_INT_FIELDS = (5, 7, 8, 9, 10, 11, 12, 34, 35)
_FLOAT_FIELDS = (13, 36, 38)


def _count_error(n: int) -> str:
    return f"{n} fields; accounting(5) lines have 45 (or 43 before ARs)"


def _colon_failure(fields: list[str], right: int) -> str:
    """Say which field broke a colon line (slow path, quarantine only)."""
    for i in _INT_FIELDS:
        if not fields[i].isdigit():
            return f"field {i + 1} ({_COLON_FIELDS[i]}) is {fields[i]!r}, not an integer: line shifted"
    for i in _FLOAT_FIELDS:
        try:
            float(fields[i])
        except ValueError:
            return f"field {i + 1} ({_COLON_FIELDS[i]}) is {fields[i]!r}, not a number: line shifted"
    names = ("iow", "pe_taskid", "maxvmem", "arid", "ar_sub_time")
    for offset, name in enumerate(names[: len(fields) - right]):
        value = fields[right + offset]
        if name == "pe_taskid":
            continue
        try:
            float(value) if name in ("iow", "maxvmem") else int(value)
        except ValueError:
            return f"field {name} is {value!r}, not a number: line shifted"
    for i in (8, 9, 10):
        value = int(fields[i])
        if value and not _T_MIN <= value < _T_MAX:
            return f"field {i + 1} ({_COLON_FIELDS[i]}) is {value}, not an epoch time: line shifted"
    if len(fields) - right == 5 and int(fields[-1]) and not _T_MIN <= int(fields[-1]) < _T_MAX:
        return f"field ar_sub_time is {fields[-1]}, not an epoch time: line shifted"
    if int(fields[5]) == 0:
        return "field 6 (job_number) is 0"
    return "fields do not have the types of the accounting(5) format"


# Submission time -> datetime, shared by every task of an array job.
_SUBMITTED_CACHE: dict[str, dt.datetime | bool] = {}


def _parse_colon(line: bytes, *, _fromts=dt.datetime.fromtimestamp, _UTC=UTC, _Record=AccountingRecord,
                 _tmin=_T_MIN, _tmax=_T_MAX, _submitted=_SUBMITTED_CACHE) -> AccountingRecord:
    # The hot path (>= 300,000 lines/s): one decode, one split, each field
    # converted once, local names only. int() alone is the type check for
    # most integer fields; the range checks below reject the negative or
    # non-epoch values int() lets through.
    f = str(line, "utf-8", "replace").split(":")
    n = len(f)
    try:
        if "." in f[-1]:
            # 43 fields: ... category : iow : pe_taskid : maxvmem
            right = n - 3
            arid = ar_sub = 0
        else:
            right = n - 5
            arid_s = f[-2]
            ar_sub_s = f[-1]
            if arid_s == "0" and ar_sub_s == "0":
                arid = ar_sub = 0
            else:
                arid = int(arid_s)
                ar_sub = int(ar_sub_s)
        if right < 40:
            raise AccountingLineError(_count_error(n))
        job_number = int(f[5])
        start = int(f[9])
        end = int(f[10])
        failed = int(f[11])
        exit_status = int(f[12])
        wallclock = float(f[13])
        slots = int(f[34])
        task_number = int(f[35])
        cpu = float(f[36])
        float(f[38])
        maxvmem = float(f[right + 2])
    except ValueError:
        raise AccountingLineError(_colon_failure(f, right) if right >= 40 else _count_error(n)) from None
    except IndexError:
        raise AccountingLineError(_count_error(n)) from None
    if (job_number <= 0 or not f[7].isdigit() or (start and not _tmin <= start < _tmax)
            or (end and not _tmin <= end < _tmax) or (ar_sub and not _tmin <= ar_sub < _tmax)
            or failed < 0 or slots < 0 or task_number < 0 or arid < 0):
        raise AccountingLineError(_colon_failure(f, right))
    sub_s = f[8]
    submitted = _submitted.get(sub_s)
    if submitted is None:
        try:
            sub = int(sub_s)
        except ValueError:
            raise AccountingLineError(_colon_failure(f, right)) from None
        if sub == 0:
            submitted = False
        elif _tmin <= sub < _tmax:
            submitted = _fromts(sub, _UTC)
        else:
            raise AccountingLineError(_colon_failure(f, right))
        if len(_submitted) > 4096:
            _submitted.clear()
        _submitted[sub_s] = submitted
    project = f[31]
    department = f[32]
    granted_pe = f[33]
    pe_taskid = f[right + 1]
    return _Record(
        job_number,
        task_number or None,
        None if pe_taskid == "NONE" else pe_taskid,
        f[4],
        f[3],
        f[2],
        None if project == "NONE" else project,
        None if department == "NONE" else department,
        f[6],
        f[0],
        f[1],
        slots,
        submitted or None,
        _fromts(start, _UTC) if start else None,
        _fromts(end, _UTC) if end else None,
        wallclock,
        cpu,
        maxvmem,
        failed,
        exit_status,
        f[39] if right == 40 else ":".join(f[39:right]),
        {},
        None if granted_pe == "NONE" else granted_pe,
        arid,
        _fromts(ar_sub, _UTC) if ar_sub else None,
        None,
    )


def _json_int(obj: dict, key: str, *, required: bool = True, default: int = 0) -> int:
    value = obj.get(key)
    if value is None:
        if required:
            raise AccountingLineError(f"JSON record has no {key!r}")
        return default
    if type(value) is not int:  # bool is not a number here, nor 1.0
        raise AccountingLineError(f"JSON {key!r} is {value!r}, not an integer")
    return value


def _json_number(obj: dict, key: str) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if type(value) not in (int, float):
        raise AccountingLineError(f"JSON usage {key!r} is {value!r}, not a number")
    return float(value)


def _json_time(obj: dict, key: str, *, required: bool = True) -> dt.datetime | None:
    value = _json_int(obj, key, required=required)
    if value == 0:
        return None
    if not _T_MIN_US <= value < _T_MAX_US:
        raise AccountingLineError(f"JSON {key!r} is {value}, not a time in microseconds since the epoch")
    return _EPOCH + dt.timedelta(microseconds=value)


def _json_str(obj: dict, key: str) -> str:
    value = obj.get(key)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise AccountingLineError(f"JSON {key!r} is {value!r}, not a string")
    return value


def _json_optional_str(obj: dict, key: str) -> str | None:
    value = _json_str(obj, key)
    return None if value in ("", "NONE") else value


def _parse_json(line: bytes) -> AccountingRecord:
    try:
        obj = json.loads(line.decode("utf-8", "replace"))
    except ValueError as exc:
        raise AccountingLineError(f"not valid JSON: {exc}") from None
    if not isinstance(obj, dict):
        raise AccountingLineError("JSON line is not an object")
    usage = obj.get("usage") or {}
    if not isinstance(usage, dict):
        raise AccountingLineError("JSON 'usage' is not an object")
    rusage = usage.get("rusage") or {}
    # 9.0.0-9.0.5 call it "usage", 9.0.6 on "eusage" (qacct reads both).
    eusage = usage.get("eusage") or usage.get("usage") or {}
    if not isinstance(rusage, dict) or not isinstance(eusage, dict):
        raise AccountingLineError("JSON 'usage.rusage'/'usage.eusage' is not an object")
    # ru_wallclock: whole seconds, what qacct -P sums (the bill); eusage.wallclock: exact.
    exact = _json_number(eusage, "wallclock")
    wallclock = _json_number(rusage, "ru_wallclock")
    if wallclock is None:
        wallclock = exact or 0.0
    cpu = _json_number(eusage, "cpu")
    if cpu is None:
        cpu = (_json_number(rusage, "ru_utime") or 0.0) + (_json_number(rusage, "ru_stime") or 0.0)
    flexible = {key: value for key, value in usage.items() if key not in ("rusage", "eusage", "usage")}
    task_number = _json_int(obj, "task_number", required=False)
    started, ended = _json_time(obj, "start_time"), _json_time(obj, "end_time")
    if exact is None and started is not None and ended is not None:
        exact = (ended - started).total_seconds()
    return AccountingRecord(
        job_number=_json_int(obj, "job_number"),
        task_number=task_number or None,
        pe_taskid=_json_optional_str(obj, "pe_taskid"),
        job_name=_json_str(obj, "job_name"),
        owner=_json_str(obj, "owner"),
        group=_json_str(obj, "group"),
        project=_json_optional_str(obj, "project"),
        department=_json_optional_str(obj, "department"),
        account=_json_str(obj, "account"),
        queue=_json_str(obj, "qname"),
        hostname=_json_str(obj, "hostname"),
        slots=_json_int(obj, "slots", required=False, default=1),
        submitted_at=_json_time(obj, "submission_time"),
        started_at=started,
        ended_at=ended,
        wallclock_s=wallclock,
        cpu_s=cpu,
        maxvmem_bytes=_json_number(eusage, "maxvmem") or 0.0,
        failed=_json_int(obj, "failed"),
        exit_status=_json_int(obj, "exit_status"),
        category=_json_str(obj, "category"),
        usage=flexible,
        granted_pe=_json_optional_str(obj, "granted_pe"),
        arid=_json_int(obj, "arid", required=False),
        ar_submitted_at=_json_time(obj, "ar_submission_time", required=False),
        deleted_by=_json_optional_str(obj, "deleted_by"),
        wallclock_exact_s=exact,
    )


def usage_group_values(usage: dict, group: str, prefix: str = "") -> dict[str, float | int]:
    """The numeric values of one flexible-accounting group of a record, names without ``prefix``.

    ``usage`` is ``AccountingRecord.usage`` (the JSON record's ``usage``
    object less ``rusage``/``eusage``); ``group`` a ``usage_patterns`` name,
    e.g. ``"tco"`` for ``reporting_params usage_patterns=tco:tco_*``, whose
    object holds ``{"tco_input_tokens": 1200, ...}`` (sge_conf(5) of OCS 9,
    ``usage_patterns``; GRIDENGINE.md section 2). Returns ``{"input_tokens":
    1200, ...}``: only names that start with ``prefix``; only JSON numbers
    (OCS 9.2 writes quoted values as strings, ``true``/``false`` as 1/0:
    strings and booleans are left out); an integral float (qacct <= 9.1
    reads values as doubles) becomes an int. ``{}`` when the group is absent
    or not an object (SGE 8 colon records, a cell without the pattern).
    Never raises.
    """
    values = usage.get(group) if isinstance(usage, dict) else None
    if not isinstance(values, dict):
        return {}
    out: dict[str, float | int] = {}
    for name, value in values.items():
        if not isinstance(name, str) or not name.startswith(prefix) or len(name) == len(prefix):
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            continue
        out[name[len(prefix):]] = int(value) if isinstance(value, float) and value.is_integer() else value
    return out


def parse_line(line: bytes, tz: dt.tzinfo = UTC) -> AccountingRecord:
    """Parse one accounting line (with or without its newline) of either format.

    Returns an AccountingRecord (times aware UTC, None for 0; task_number
    None for 0; ``NONE`` -> None for project, department, granted_pe,
    pe_taskid; wallclock_s = ``ru_wallclock`` seconds, cpu_s = ``cpu``
    seconds, maxvmem_bytes bytes; ``usage`` = flexible-accounting groups of
    a JSON line, else ``{}``). ``tz`` is accepted for symmetry with the
    qstat parsers and unused: accounting times are epoch values, zone-free.

    Raises AccountingLineError(reason) for a line that is not a record
    (including comment and empty lines: ``read_accounting`` skips those
    before calling this).
    """
    line = line.rstrip(b"\r\n")
    if not line:
        raise AccountingLineError("empty line")
    if line[0] == 0x7B:  # "{"
        return _parse_json(line)
    return _parse_colon(line)


def read_accounting(path: str | os.PathLike, cursor: AccountingCursor | None,
                    max_bytes: int | None = None) -> AccountingBatch:
    """Read the accounting file from ``cursor`` to its end (or ``max_bytes``).

    - ``cursor`` None, or for a file with another inode (rotated by
      logchecker.sh or replaced: ``reset='rotated'``), or beyond the file's
      size (truncated: ``reset='truncated'``): read from offset 0.
    - Only complete lines are consumed. A last line without its newline is
      being written by the qmaster: it is left for the next pass
      (``deferred_bytes``; BUG-06). When ``max_bytes`` ends inside a line,
      the pass stops at the line before, except that a first line longer
      than ``max_bytes`` is read whole, so every pass makes progress.
    - Lines starting with ``#`` and lines of one character or less are
      skipped (counted in ``skipped``), as qacct does; every other line is
      a record or is quarantined with its offset, raw bytes and reason.
    - The returned ``cursor`` is the checkpoint to store once the records
      are saved: (inode, offset after the last consumed line).

    The caller should read a rotated file's remainder (lines appended after
    the last pass) from the rotated copy before resuming here; this
    function only sees ``path``. Raises FileNotFoundError when there is no
    file (yet), SchedulerUnavailable when it exists but cannot be read.
    Batches of about 1 MiB (``max_bytes``) parse fastest: larger ones keep
    more records alive at once and spend their time allocating.
    """
    try:
        handle = open(path, "rb")
    except FileNotFoundError:
        raise  # no file yet (no job finished, or mid-rotation): the caller's call
    except OSError as exc:
        raise SchedulerUnavailable(f"accounting file {os.fspath(path)!r} cannot be read: {exc}") from exc
    with handle:
        stat = os.fstat(handle.fileno())
        inode, size = stat.st_ino, stat.st_size
        reset = None
        offset = 0
        if cursor is not None:
            if cursor.inode != inode:
                reset = "rotated"
            elif size < cursor.offset:
                reset = "truncated"
            else:
                offset = cursor.offset
        handle.seek(offset)
        length = size - offset
        if max_bytes is not None:
            length = min(length, max(int(max_bytes), 0))
        chunk = handle.read(length) if length > 0 else b""
        last_newline = chunk.rfind(b"\n")
        if last_newline < 0 and chunk and offset + len(chunk) < size:
            chunk += handle.readline()
            last_newline = chunk.rfind(b"\n")
    consumed = last_newline + 1
    records, quarantined, skipped = _parse_block(chunk, consumed, offset)
    return AccountingBatch(records=records, quarantined=quarantined, skipped=skipped,
                           deferred_bytes=len(chunk) - consumed,
                           cursor=AccountingCursor(inode=inode, offset=offset + consumed), reset=reset)


def _parse_block(chunk: bytes, consumed: int, offset: int,
                 parse_colon: Callable[[bytes], AccountingRecord] = _parse_colon,
                 parse_json: Callable[[bytes], AccountingRecord] = _parse_json,
                 ) -> tuple[list[AccountingRecord], list[QuarantinedLine], int]:
    """Parse the complete lines ``chunk[:consumed]``, which start at byte
    ``offset`` of the file. Returns (records, quarantined, skipped)."""
    records: list[AccountingRecord] = []
    quarantined: list[QuarantinedLine] = []
    skipped = 0
    if consumed == 0:
        return records, quarantined, skipped
    append = records.append
    body = chunk[:consumed]
    lines = body.split(b"\n")
    lines.pop()  # the empty piece after the final newline
    search_from = 0  # where the next quarantined line can start in body
    # The loop creates no reference cycles, but keeps tens of thousands of
    # new objects alive, which makes the cyclic collector scan them again
    # and again (a third of the time). Pause it for the loop only.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        for raw in lines:
            if len(raw) <= 1 or raw[0] == 0x23:  # "#"
                skipped += 1
                continue
            try:
                append(parse_json(raw) if raw[0] == 0x7B else parse_colon(raw))  # "{"
            except AccountingLineError as exc:
                # Offsets are only worked out for the rare bad line: it is the
                # first line equal to it after the previous bad one (an equal
                # line in between would have failed the same way).
                if body.startswith(raw + b"\n", search_from):
                    at = search_from
                else:
                    at = body.index(b"\n" + raw + b"\n", search_from) + 1
                search_from = at + len(raw) + 1
                quarantined.append(QuarantinedLine(offset=offset + at, raw=raw, reason=exc.reason))
    finally:
        if gc_was_enabled:
            gc.enable()
    return records, quarantined, skipped
