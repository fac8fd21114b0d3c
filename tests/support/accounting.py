"""Accounting files written by the tests: SGE 8 colon lines under a header."""
from __future__ import annotations

HEADER = b"# Version: 8.1.9\n#\n# DO NOT MODIFY THIS FILE MANUALLY!\n#\n"


def colon_line(job: int, task: int, *, exit_status: int = 0, failed: int = 0, start: int = 1764417600,
               wall: int = 7, project: str = "research", category: str = "-q agent.q -l anthropic_api=1",
               submitted: int | None = None, name: str = "tco-c1-demo", host: str = "vm") -> bytes:
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
