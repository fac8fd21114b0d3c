"""Issue 23, finding 1: a hostile agent cannot fill the host's disk or memory.

Each agent here runs in the runner's real bubblewrap sandbox and tries to use without end one
resource: it must end by itself (no timeout set), with the limit's reason in its runner record,
while this process (the host's stand-in) keeps its memory and the spool its disk.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from execution.runner import config
from execution.runner.config import RunnerError, effective_limits, size_text
from tests.support.runner import Spool

MIB = 1 << 20

# Writes 1 MiB blocks to one file, without end.
ONE_FILE = ("import os\nb = b'x' * (1 << 20)\nwith open('/sandbox/big', 'wb') as f:\n"
            "    while True:\n        f.write(b); f.flush()\n")
# Writes many 1 MiB files (each under the file size limit), without end.
MANY_FILES = ("b = b'x' * (1 << 20)\ni = 0\nwhile True:\n"
              "    open('/sandbox/f%d' % i, 'wb').write(b); i += 1\n")
# Allocates and touches (writes) 16 MiB blocks, without end.
ALLOCATE = "keep = []\nwhile True:\n    keep.append(b'\\x01' * (16 << 20))\n"
# Burns CPU without end.
SPIN = "while True:\n    pass\n"


@pytest.fixture
def spool(tmp_path) -> Spool:
    return Spool(tmp_path / "spool")


def run_agent(spool: Spool, code: str, timeout: float = 60, **limits: str) -> tuple[subprocess.CompletedProcess, dict]:
    spool.write([{"task": 1}], command=[sys.executable, "-c", code])
    started = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "execution.runner"], env={**spool.env(1), **limits},
                          cwd=str(spool.root), capture_output=True, timeout=timeout, start_new_session=True)
    assert time.monotonic() - started < timeout
    return proc, spool.record(1)


def work_bytes(spool: Spool) -> int:
    total = 0
    for root, _, files in os.walk(spool.root / "work"):
        total += sum(os.lstat(os.path.join(root, f)).st_blocks * 512 for f in files)
    return total


def test_one_file_written_without_end_stops_at_the_file_size_limit(spool):
    # Python ignores SIGXFSZ: its write fails with EFBIG ("File too large") and it exits 1.
    proc, record = run_agent(spool, ONE_FILE, TCO_SANDBOX_FILE_BYTES=str(8 * MIB))
    assert record["exit_status"] == 1 and proc.returncode == 1
    assert "file_size_limit" in record["flags"]
    assert record["error"] == "file size limit 8 MiB reached"
    assert os.path.getsize(spool.root / "work" / "c-1" / "1" / "big") == 8 * MIB
    assert record["sandbox"]["limits"]["file_bytes"] == 8 * MIB


def test_a_program_killed_by_sigxfsz_stops_at_the_file_size_limit(spool):
    spool.write([{"task": 1}], command=["/bin/dd", "if=/dev/zero", "of=/sandbox/big", "bs=1M"])
    proc = subprocess.run([sys.executable, "-m", "execution.runner"],
                          env={**spool.env(1), "TCO_SANDBOX_FILE_BYTES": str(3 * MIB)},
                          cwd=str(spool.root), capture_output=True, timeout=60, start_new_session=True)
    record = spool.record(1)
    assert record["signal"] == signal.SIGXFSZ and proc.returncode == 128 + signal.SIGXFSZ
    assert record["error"] == "file size limit 3 MiB reached" and "file_size_limit" in record["flags"]
    assert os.path.getsize(spool.root / "work" / "c-1" / "1" / "big") == 3 * MIB


def test_many_files_written_without_end_stop_at_the_work_directory_limit(spool):
    proc, record = run_agent(spool, MANY_FILES, TCO_SANDBOX_FILE_BYTES=str(8 * MIB),
                             TCO_SANDBOX_WORK_BYTES=str(32 * MIB), TCO_SANDBOX_WORK_CHECK_S="0.2")
    assert proc.returncode == config.EXIT_WORKDIR_QUOTA
    assert "workdir_over_quota" in record["flags"]
    assert record["error"] == "work directory limit 32 MiB reached"
    # Stopped within a few checks: far below what it would write in the test's minute.
    assert 32 * MIB < work_bytes(spool) < 2048 * MIB


#: Runs argv[2:] and writes the peak resident size (KiB) of it and the processes it reaped to argv[1].
#: A fresh interpreter in between: a process forked from pytest starts its ru_maxrss at pytest's own
#: peak (Linux keeps the old image's high-water mark across exec), some 300 MiB after the whole
#: unit suite, and getrusage(RUSAGE_CHILDREN) in pytest counts every child it ever had.
PEAK_OF = ("import resource, subprocess, sys\n"
           "code = subprocess.run(sys.argv[2:]).returncode\n"
           "open(sys.argv[1], 'w').write(str(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss))\n"
           "sys.exit(code)\n")


def test_memory_allocated_without_end_stops_at_the_memory_limit(spool, tmp_path):
    spool.write([{"task": 1}], command=[sys.executable, "-c", ALLOCATE])
    peak = tmp_path / "peak"
    proc = subprocess.run([sys.executable, "-c", PEAK_OF, str(peak), sys.executable, "-m", "execution.runner"],
                          env={**spool.env(1), "TCO_SANDBOX_MEMORY_BYTES": str(256 * MIB)}, cwd=str(spool.root),
                          capture_output=True, timeout=60, start_new_session=True)
    record = spool.record(1)
    assert record["exit_status"] == 1 and proc.returncode == 1
    assert "memory_limit" in record["flags"]
    assert record["error"] == "memory limit 256 MiB reached"
    assert record["sandbox"]["limits"]["memory_bytes"] == 256 * MIB
    assert "MemoryError" in (spool.root / "records" / "c-1" / "1.stderr").read_text()
    # No process of the task (the runner, bubblewrap, the relay, the agent: all reaped, so all
    # counted in the launcher's children) ever held more than the limit (ru_maxrss is in KiB).
    assert int(peak.read_text()) < (256 + 16) * 1024


def test_cpu_burnt_without_end_stops_at_the_cpu_limit(spool):
    proc, record = run_agent(spool, SPIN, TCO_SANDBOX_CPU_S="1")
    assert record["signal"] == signal.SIGXCPU and "cpu_limit" in record["flags"]
    assert record["error"] == "CPU time limit 1 s reached"


def test_a_spec_lowers_a_limit_but_never_raises_it(spool):
    spool.write([{"task": 1}], command=[sys.executable, "-c", ONE_FILE], limits={"file_bytes": 4 * MIB})
    proc = subprocess.run([sys.executable, "-m", "execution.runner"],
                          env={**spool.env(1), "TCO_SANDBOX_FILE_BYTES": str(8 * MIB)},
                          cwd=str(spool.root), capture_output=True, timeout=60, start_new_session=True)
    assert spool.record(1)["error"] == "file size limit 4 MiB reached"
    assert os.path.getsize(spool.root / "work" / "c-1" / "1" / "big") == 4 * MIB
    limits = effective_limits({"TCO_SANDBOX_FILE_BYTES": str(8 * MIB)}, {"limits": {"file_bytes": 64 * MIB}})
    assert limits["TCO_SANDBOX_FILE_BYTES"] == 8 * MIB
    assert limits["TCO_SANDBOX_MEMORY_BYTES"] == config.LIMIT_DEFAULTS["TCO_SANDBOX_MEMORY_BYTES"]
    assert proc.returncode == 1


@pytest.mark.parametrize("asked", [{"disk": 1}, {"cpu_s": 0}, {"cpu_s": True}, {"memory_bytes": "1"}])
def test_a_spec_limit_that_is_not_a_known_positive_integer_is_refused(asked):
    with pytest.raises(RunnerError):
        effective_limits({}, {"limits": asked})


def test_the_demo_agent_runs_under_the_default_limits(spool):
    spool.write([{"task": 1, "duration_s": 0}])
    result = spool.run(1)
    record = spool.record(1)
    assert result.returncode == 0 and record["error"] is None and record["flags"] == []
    assert record["sandbox"]["limits"] == {"memory_bytes": 4 << 30, "file_bytes": 1 << 30, "cpu_s": 86400,
                                           "work_bytes": 4 << 30, "max_processes": 256, "tmpfs_bytes": 256 << 20}


def test_sizes_read_as_people_write_them():
    assert [size_text(n) for n in (4 << 30, 256 << 20, 1536 << 10, 100, (3 << 29))] == \
        ["4 GiB", "256 MiB", "1.5 MiB", "100 bytes", "1.5 GiB"]
