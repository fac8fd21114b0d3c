"""Queue epilog for OCS/GCS 9 flexible accounting: append a task's token totals to its usage file.

Grid Engine's shepherd writes ``$SGE_JOB_SPOOL_DIR/usage``, a file of
``name=value`` lines that belongs to the admin user; with
``reporting_params usage_patterns=tco:tco_*`` the matching lines go into the
accounting record's ``usage.tco`` object and ``qacct -j`` prints them
(GRIDENGINE.md section 2; the "Flexible Accounting" article). The runner,
running as the job's user, writes its totals to ``<spool>/records/<campaign>/
<task>.usage``; this epilog, configured as ``sgeadmin@<venv>/bin/python -m
execution.usage_epilog`` (with ``PYTHONPATH`` set to tco's code), copies them
over. It reads the job's environment (``TCO_SPOOL_DIR``, ``TCO_CAMPAIGN_ID``,
``SGE_TASK_ID``) and copies only ``tco_<name>=<number>`` lines, since qacct
(<= 9.1) reads every value as a double and a job may have written the file.
SGE 8.1.9 has no flexible accounting: there it is not configured.

Exit status 0 always (an epilog failure would put the queue in error state);
problems go to stderr, which Grid Engine keeps in the job's error file.
"""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Mapping

from execution.spool.layout import SpoolLayout

LINE = re.compile(r"^tco_[a-z0-9_]{1,64}=-?[0-9]+(\.[0-9]+)?$")


def usage_lines(path: Path) -> list[str]:
    """The valid ``tco_name=number`` lines of a runner's usage file; others are dropped."""
    lines = []
    for raw in path.read_text(encoding="ascii", errors="replace").splitlines():
        if LINE.match(raw.strip()):
            lines.append(raw.strip())
    return lines


def append(environ: Mapping[str, str]) -> list[str]:
    """Append the task's totals to ``$SGE_JOB_SPOOL_DIR/usage``; return the lines appended.

    Raises KeyError when the environment lacks a variable, ValueError for a
    campaign id or task number that is not one, OSError when a file cannot be
    read or written. Nothing is appended when the task has no totals.
    """
    task = environ.get("SGE_TASK_ID", "undefined")
    # A non-array job's runner writes as task 1 (execution/runner/).
    task_number = int(task) if task.isdigit() else 1
    campaign = environ["TCO_CAMPAIGN_ID"]
    if not campaign.isdigit():
        raise ValueError(f"TCO_CAMPAIGN_ID {campaign!r} is not a number")
    source = Path(SpoolLayout(environ["TCO_SPOOL_DIR"]).task_file(campaign, task_number, "usage"))
    if not source.is_file():
        return []
    lines = usage_lines(source)
    if lines:
        with open(Path(environ["SGE_JOB_SPOOL_DIR"]) / "usage", "a", encoding="ascii") as fh:
            fh.write("".join(line + "\n" for line in lines))
    return lines


def main() -> int:
    """Entry point: append the task's usage lines (:func:`append`) to the job's usage file. Always
    returns 0: a missing or bad file is reported on stderr, never an epilog failure."""
    try:
        append(os.environ)
    except (KeyError, ValueError, OSError) as exc:
        print(f"tco usage epilog: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
