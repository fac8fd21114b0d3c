"""The jobs' CPU share on the dev cluster: every job runs in the cpu cgroup ``tco-jobs`` at nice 19.

The seed replay fell 10-14 s behind qstat with the jobs at nice 19: with autogroup scheduling
(Debian's default) nice only weighs within a session, and each job (its shepherd) and each sandbox
(bubblewrap --new-session) is a session of its own, so 96 agents weighed as much as 96 of tco's
services. scripts/dev-cluster now starts each execd in the cgroup v1 cpu group ``tco-jobs`` with a
small ``cpu.shares``: everything a job starts is in it (and not autogrouped). Here a plain job on
agent.q reports its own cgroups and nice value from /proc (proc(5)).
"""
from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest

from tests.support.cluster import SGE_ENV, qdel_quietly

pytestmark = [pytest.mark.integration]

GROUP = Path("/sys/fs/cgroup/cpu/tco-jobs")
SCRIPT = """#!/bin/sh
cat /proc/self/cgroup
awk '{print "nice " $19}' /proc/self/stat
"""


def test_a_job_runs_in_the_jobs_cpu_group_below_the_services_share_and_at_nice_19(tmp_path):
    if not (GROUP.parent / "cpu.shares").exists():
        pytest.fail("no cgroup v1 cpu controller at /sys/fs/cgroup/cpu: scripts/dev-cluster puts the jobs there")
    shares = int((GROUP / "cpu.shares").read_text())
    assert shares < 1024            # below one process at nice 0 in the root group
    script = tmp_path / "report.sh"
    script.write_text(SCRIPT)
    out = tmp_path / "report.out"
    tmp_path.chmod(0o755)
    submitted = subprocess.run(["qsub", "-terse", "-P", "research", "-q", "agent.q", "-S", "/bin/sh", "-o", str(out), "-j", "y",
                                "-N", "cpu-share", str(script)], capture_output=True, text=True, env=SGE_ENV,
                               timeout=60)
    assert submitted.returncode == 0, submitted.stderr
    job = int(submitted.stdout.strip())
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and "nice" not in (out.read_text() if out.exists() else ""):
            time.sleep(0.5)
        lines = out.read_text().splitlines()
    finally:
        qdel_quietly(job)
    cpu = [line.split(":", 2) for line in lines if ":" in line and "cpu" in line.split(":")[1].split(",")]
    assert cpu and all(path == "/tco-jobs" for _, _, path in cpu), lines
    assert "nice 19" in lines, lines
