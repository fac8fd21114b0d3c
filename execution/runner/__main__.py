"""``python -m execution.runner``: what Grid Engine runs once per agent task (docs/runner.md).

The stage clock is anchored before anything else is imported: ``task_started_at``
is the runner's first timestamp, and queue wait is measured up to it.
"""
import execution.runner.clock  # noqa: F401 - first: it anchors the stage clock
import os
import sys

from execution.runner.main import main

if __name__ == "__main__":
    code = main()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):  # its output files cannot be written (a full spool): keep the status
        os._exit(code)
    sys.exit(code)
