"""Turn captured Grid Engine output into JSON objects, one per line.

Used by ``python manage.py inspect KIND FILE [--tz ZONE]`` (see
worker/management/commands/inspect.py) to check a parser against real
output by eye or in a script. No Django and no database here.

Times are ISO 8601 in UTC ending in ``Z``; a fraction of a second is printed
only when the time has one (OCS µs), e.g. ``2025-03-10T09:00:05Z``,
``2024-11-02T07:35:13.429415Z``.
"""
from __future__ import annotations

import datetime as dt
import json
import os
from typing import IO, Iterator

from schedulers import pending
from schedulers.gridengine.parsers import accounting
from schedulers.gridengine.parsers.qhost import parse_qhost
from schedulers.gridengine.parsers.qquota import parse_qquota
from schedulers.gridengine.parsers.qstat import parse_qstat
from schedulers.gridengine.parsers.qstat_j import parse_job_detail
from schedulers.gridengine.parsers.queue_summary import parse_cluster_queue_summary
from schedulers.base import AccountingRecord, QstatTask

__all__ = ["KINDS", "iso_utc", "qstat_objects", "job_object", "accounting_objects", "qhost_objects",
           "qquota_objects", "queue_summary_objects", "run"]

UTC = dt.timezone.utc


def iso_utc(value: dt.datetime | None) -> str | None:
    """Aware datetime -> ``YYYY-MM-DDTHH:MM:SS[.ffffff]Z`` in UTC; None -> None."""
    if value is None:
        return None
    if value.tzinfo is None:
        raise ValueError("naive datetime: every time must be aware")
    value = value.astimezone(UTC)
    text = value.strftime("%Y-%m-%dT%H:%M:%S")
    if value.microsecond:
        text += f".{value.microsecond:06d}"
    return text + "Z"


def task_object(task: QstatTask) -> dict:
    """The JSON object of one qstat task."""
    return {
        "job_number": task.job_number,
        "task_number": task.task_number,
        "name": task.name,
        "owner": task.owner,
        "project": task.project,
        "state": task.state,
        "state_code": task.state_code,
        "restarted": task.restarted,
        "queue": task.queue,
        "host": task.host,
        "slots": task.slots,
        "submitted_at": iso_utc(task.submitted_at),
        "started_at": iso_utc(task.started_at),
        "priority": task.priority,
    }


def qstat_objects(data: bytes, tz: dt.tzinfo = UTC) -> Iterator[dict]:
    """``qstat -xml -u '*'`` -> one object per task (keys of task_object)."""
    for task in parse_qstat(data, tz):
        yield task_object(task)


def job_object(data: bytes, tz: dt.tzinfo = UTC, quota: list | None = None, hosts: list | None = None) -> dict:
    """``qstat -j ID -xml`` -> ``job_number, name, owner, project, hard_resources,
    tasks, scheduler_messages, pending_reasons``. Raises UnknownJob."""
    detail = parse_job_detail(data, tz)
    return {
        "job_number": detail["job_number"],
        "name": detail["name"],
        "owner": detail["owner"],
        "project": detail["project"],
        "hard_resources": detail["hard_resources"],
        "tasks": detail["tasks"],
        "scheduler_messages": detail["scheduler_messages"],
        "pending_reasons": pending.explain_pending(detail, quota=quota, hosts=hosts),
    }


def record_object(record: AccountingRecord) -> dict:
    """The JSON object of one accounting record."""
    return {
        "job_number": record.job_number,
        "task_number": record.task_number,
        "pe_taskid": record.pe_taskid,
        "job_name": record.job_name,
        "owner": record.owner,
        "group": record.group,
        "project": record.project,
        "department": record.department,
        "account": record.account,
        "queue": record.queue,
        "hostname": record.hostname,
        "slots": record.slots,
        "submitted_at": iso_utc(record.submitted_at),
        "started_at": iso_utc(record.started_at),
        "ended_at": iso_utc(record.ended_at),
        "wallclock_s": record.wallclock_s,
        "cpu_s": record.cpu_s,
        "maxvmem_bytes": record.maxvmem_bytes,
        "failed": record.failed,
        "exit_status": record.exit_status,
        "category": record.category,
        "usage": record.usage,
    }


def accounting_objects(path: str | os.PathLike) -> tuple[list[dict], str]:
    """Read a whole accounting file from offset 0. Returns the record objects
    and the summary line ``accepted=N quarantined=M deferred=K`` (K: 1 when
    a last line without newline was left unread, else 0)."""
    batch = accounting.read_accounting(path, None)
    objects = [record_object(record) for record in batch.records]
    summary = (f"accepted={len(batch.records)} quarantined={len(batch.quarantined)} "
               f"deferred={1 if batch.deferred_bytes else 0}")
    return objects, summary


def qhost_objects(data: bytes) -> list[dict]:
    """``qhost -F -xml`` -> one object per host (parse_qhost keys)."""
    return parse_qhost(data)


def qquota_objects(data: bytes) -> list[dict]:
    """``qquota -xml`` -> one object per limit (parse_qquota keys)."""
    return parse_qquota(data)


def queue_summary_objects(data: bytes) -> list[dict]:
    """``qstat -g c -xml`` -> one object per cluster queue."""
    return parse_cluster_queue_summary(data)


KINDS = ("qstat", "job", "accounting", "qhost", "qquota", "queues")


def run(kind: str, path: str | os.PathLike, tz: dt.tzinfo, out: IO[str], err: IO[str]) -> int:
    """Print the objects of ``kind`` read from ``path`` to ``out``, one JSON
    object per line; the accounting summary goes to ``err``. Returns the
    number of objects printed. Parser errors propagate (SchedulerError)."""
    if kind not in KINDS:
        raise ValueError(f"unknown kind {kind!r}; one of {', '.join(KINDS)}")
    summary = None
    if kind == "accounting":
        objects, summary = accounting_objects(path)
    else:
        with open(path, "rb") as handle:
            data = handle.read()
        if kind == "qstat":
            objects = list(qstat_objects(data, tz))
        elif kind == "job":
            objects = [job_object(data, tz)]
        elif kind == "qhost":
            objects = qhost_objects(data)
        elif kind == "qquota":
            objects = qquota_objects(data)
        else:
            objects = queue_summary_objects(data)
    for obj in objects:
        out.write(json.dumps(obj, sort_keys=False) + "\n")
    if summary is not None:
        err.write(summary + "\n")
    return len(objects)
