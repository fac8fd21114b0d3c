"""Accounting files written by the tests: SGE 8 colon lines under a header."""
from __future__ import annotations

HEADER = b"# Version: 8.1.9\n#\n# DO NOT MODIFY THIS FILE MANUALLY!\n#\n"


def colon_line(job: int, task: int, *, exit_status: int = 0, failed: int = 0, start: int = 1764417600,
               wall: int = 7, project: str = "research", category: str = "-q agent.q -l anthropic_api=1",
               submitted: int | None = None, name: str = "tco-inst1-c1-demo", host: str = "vm") -> bytes:
    """One SGE 8.1.9 accounting line (accounting(5): 45 fields), built field by field (submitted 3 s
    before ``start`` unless ``submitted`` says when)."""
    fields = [
        "agent.q", host, "tco", "tco", name, str(job), "admin", "0",
        str(start - 3 if submitted is None else submitted), str(start), str(start + wall), str(failed),
        str(exit_status), str(wall),
        "0.5", "0.1", "2048.000000", "0", "0", "0", "0", "100", "0", "0", "0", "8", "0", "0", "0", "30", "2",
        project, "defaultdepartment", "NONE", "1", str(task), "0.6", "0.01", "0.0001", category, "0.0", "NONE",
        "104857600.000000", "0", "0",
    ]
    assert len(fields) == 45
    return (":".join(fields) + "\n").encode()


def write(path, data: bytes, mode: str = "ab") -> None:
    with open(path, mode) as fh:
        fh.write(data)


def finished_job_records(campaign, *, job_number: int, name: str, owner: str) -> None:
    """Store the accounting records of a finished 2-task job ``job_number`` named ``name`` of ``owner``
    on ``campaign``'s cluster (submitted, started and ended now; exit 0): what ingest keeps of it."""
    from django.utils import timezone

    from dashboards.models import AccountingRecord

    now = timezone.now()
    us = int(now.timestamp()) * 1_000_000
    for n in (1, 2):
        AccountingRecord.objects.create(
            cluster=campaign.cluster, job_number=job_number, task_number=n, submission_us=us, start_us=us,
            end_us=us, submitted_at=now, started_at=now, ended_at=now, job_name=name, owner=owner, group=owner,
            project="research", queue="agent.q", hostname="h1", wallclock_s=0.0, cpu_s=0.0, maxvmem_bytes=0.0,
            failed=0, exit_status=0)
