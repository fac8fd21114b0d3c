"""The dev cluster's execution hosts seen from the tests: queue instances and tasks per host read with
regexes from qstat, and an execd taken down or brought back through scripts/cluster-faults (root)."""
from __future__ import annotations

import os
import re
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from django.conf import settings

from tests.sge_env import sge_env

FAULTS_DIR = Path("/run/tco-dev-cluster")


def sge(*argv: str) -> str:
    return subprocess.run(list(argv), capture_output=True, text=True, check=True, timeout=30,
                          env=sge_env(settings.SGE_ROOT, settings.SGE_CELL, TZ="UTC", LC_ALL="C")).stdout


def wait_runners_started(campaign_id: int, task_numbers, timeout: float = 120) -> None:
    """Wait until the runner of each of ``task_numbers`` of campaign ``campaign_id`` has started: its work
    directory holds the input it writes first (``<spool>/work/<campaign>/<task>/input.json``). The
    shepherd writes its pid file before it starts the job, so a host crashed after this has every
    such job's shepherd on record: its execd, back, writes failed 19 ("before writing exit_status")
    for each. Crashed sooner (qstat already says r), a shepherd may not have written its pid file,
    and the record says failed 7 ("before prolog"; seen once in CI). Fails after ``timeout`` s."""
    from execution.spool.layout import SpoolLayout

    layout = SpoolLayout(settings.TCO_SPOOL_DIR)
    paths = {n: Path(layout.work_dir(campaign_id, n)) / "input.json" for n in task_numbers}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if all(p.exists() for p in paths.values()):
            return
        time.sleep(0.2)
    pytest.fail(f"runners not started after {timeout:.0f} s: {sorted(n for n, p in paths.items() if not p.exists())}")


def queue_instances() -> dict[str, tuple[str, int]]:
    """``queue@host`` -> (state letters, slots_total), from ``qstat -f -xml`` read with regexes."""
    found = {}
    for block in re.findall(r"<Queue-List>(.*?)</Queue-List>", sge("qstat", "-f", "-xml"), re.S):
        block = re.sub(r"<job_list.*?</job_list>", "", block, flags=re.S)
        state = re.search(r"<state>([^<]*)</state>", block)
        found[re.search(r"<name>([^<]+)</name>", block).group(1)] = (
            state.group(1) if state else "", int(re.search(r"<slots_total>(\d+)</slots_total>", block).group(1)))
    return found


def qstat_tasks(job: int) -> dict[int, tuple[str, str]]:
    """task number -> (state letters, host or "") of ``job`` in ``qstat -u '*'`` (plain text; ranges expanded)."""
    tasks: dict[int, tuple[str, str]] = {}
    for line in sge("qstat", "-u", "*", "-g", "d").splitlines()[2:]:
        f = line.split()
        if not f or f[0] != str(job):
            continue
        host = f[7].split("@", 1)[1] if len(f) >= 10 and "@" in f[7] else ""
        tasks[int(f[-1])] = (f[4], host)
    return tasks


def agent_hosts() -> tuple[list[str], int]:
    """The hosts agent.q spans and its slots per host (the smallest)."""
    agent = {name.split("@", 1)[1]: total for name, (_, total) in queue_instances().items()
             if name.startswith("agent.q@")}
    return sorted(agent), min(agent.values())


def fault(action: str, host: str, timeout: float = 60) -> None:
    """Ask scripts/cluster-faults (root) to take ``host``'s execd down (kill -9) or up; wait until done."""
    fifo = FAULTS_DIR / f"faults-{settings.SGE_CELL}.fifo"
    done = FAULTS_DIR / f"faults-{settings.SGE_CELL}.log"
    if not fifo.exists():
        pytest.fail(f"{fifo} is missing: run the tests through scripts/test, which starts scripts/cluster-faults")
    request = uuid.uuid4().hex
    fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    try:
        os.write(fd, f"{request} {action} {host}\n".encode())
    finally:
        os.close(fd)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for line in done.read_text().splitlines():
            f = line.split()
            if f and f[0] == request:
                assert f[3] == "0", f"scripts/cluster-faults: {action} {host} failed (exit {f[3]})"
                return
        time.sleep(0.2)
    pytest.fail(f"scripts/cluster-faults did not do '{action} {host}' within {timeout:g} s")
