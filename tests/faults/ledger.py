"""Every accounting record in a file against the database: "lost 0, doubled 0".

The file is split here, without tco's parser (accounting(5): 45 colon
fields, 43 before advance reservations; or OCS 9 JSON lines), so a parser
bug cannot hide itself. A record's identity is DESIGN.md's: job number, task
number, parallel task id, submission, start and end time (seconds), plus the
host it ran on.
"""
from __future__ import annotations

import collections
import json
import os
from typing import Iterable

LINE = "records in the database vs records in accounting: lost {lost}, doubled {doubled}"


def _identity_colon(fields: list[str]) -> tuple:
    right = len(fields) - (3 if "." in fields[-1] else 5)
    pe = fields[right + 1]
    return (int(fields[5]), int(fields[35]), "" if pe == "NONE" else pe, int(fields[8]), int(fields[9]),
            int(fields[10]), fields[1])


def _identity_json(obj: dict) -> tuple:
    pe = obj.get("pe_taskid") or ""
    return (obj["job_number"], obj.get("task_number") or 0, "" if pe == "NONE" else pe,
            obj["submission_time"] // 1_000_000, obj.get("start_time", 0) // 1_000_000,
            obj.get("end_time", 0) // 1_000_000, obj.get("hostname", ""))


def file_identities(paths: Iterable[str | os.PathLike], jobs: set[int] | None = None,
                    upto: dict | None = None) -> set[tuple]:
    """Identities of the complete record lines of ``paths`` (comments, short lines and a last line
    without its newline are not records), restricted to ``jobs`` when given; ``upto``: {path: bytes},
    the prefix of a file to read (what an ingest had seen when it stopped)."""
    found: set[tuple] = set()
    for path in paths:
        data = open(path, "rb").read()
        if upto and os.fspath(path) in upto:
            data = data[: upto[os.fspath(path)]]
        for raw in data[: data.rfind(b"\n") + 1].split(b"\n"):
            text = raw.decode("utf-8", "replace")
            if len(text) <= 1 or text.startswith("#"):
                continue
            ident = _identity_json(json.loads(text)) if text.startswith("{") else _identity_colon(text.split(":"))
            if jobs is None or ident[0] in jobs:
                found.add(ident)
    return found


def db_identities(cluster, jobs: set[int] | None = None) -> collections.Counter:
    """Identities of the accounting records stored for ``cluster`` (a Counter: a double shows as 2)."""
    from dashboards.models import AccountingRecord

    rows = AccountingRecord.objects.filter(cluster=cluster)
    if jobs is not None:
        rows = rows.filter(job_number__in=sorted(jobs))
    return collections.Counter(
        (r.job_number, r.task_number, r.pe_taskid, r.submission_us // 1_000_000, r.start_us // 1_000_000,
         r.end_us // 1_000_000, r.hostname)
        for r in rows.only("job_number", "task_number", "pe_taskid", "submission_us", "start_us", "end_us",
                           "hostname")
    )


def compare(cluster, paths: Iterable[str | os.PathLike], jobs: set[int] | None = None,
            upto: dict | None = None) -> dict:
    """``{"lost", "doubled", "extra", "records", "line"}``: file records missing from the database,
    database records stored more than once, database records in no file, the file's count, and the
    closing line (printed by the fault tests)."""
    in_file = file_identities(paths, jobs, upto)
    in_db = db_identities(cluster, jobs)
    lost = len(in_file - set(in_db))
    doubled = sum(n - 1 for n in in_db.values() if n > 1)
    extra = len(set(in_db) - in_file)
    return {"lost": lost, "doubled": doubled, "extra": extra, "records": len(in_file),
            "line": LINE.format(lost=lost, doubled=doubled)}


def report(result: dict, name: str) -> str:
    """Print the closing line (with the test's name and record count) and append it to the results log."""
    line = f"{name}: {result['line']} ({result['records']} records, {result['extra']} not in the file)"
    print(line)
    out = os.environ.get("TCO_FAULT_LOG")
    if out:
        with open(out, "a") as fh:
            fh.write(line + "\n")
    return line


def caught_up(cluster, path: str, size: int, name: str) -> dict:
    """After an ingest that caught up with the accounting file ``path`` (``size`` bytes when the test
    began): its checkpoint is past ``size`` with nothing quarantined, and every record up to it is in
    the database once and nothing else is (reported as ``name``). Returns :func:`compare`'s result."""
    from dashboards.models import IngestCheckpoint

    checkpoint = IngestCheckpoint.objects.get(cluster=cluster, source="accounting")
    assert checkpoint.offset >= size and checkpoint.quarantined == 0, (checkpoint.offset, size)
    result = compare(cluster, [path], upto={path: checkpoint.offset})
    report(result, name)
    assert (result["lost"], result["doubled"], result["extra"]) == (0, 0, 0), result
    assert result["records"] > 0
    return result
