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
    """The kernel holds the limit: /sandbox is a tmpfs of 32 MiB, the agent's next write fails with
    ENOSPC (it exits 1 with Python's OSError), and nothing past the limit reaches the spool's disk."""
    proc, record = run_agent(spool, MANY_FILES, TCO_SANDBOX_FILE_BYTES=str(8 * MIB),
                             TCO_SANDBOX_WORK_BYTES=str(32 * MIB), TCO_SANDBOX_WORK_CHECK_S="0.2")
    assert proc.returncode == 1 and record["exit_status"] == 1
    assert "No space left on device" in (spool.root / "records" / "c-1" / "1.stderr").read_text()
    assert "workdir_over_quota" in record["flags"]
    assert record["error"] == "work directory limit 32 MiB reached"
    assert record["sandbox"]["workdir"] == "tmpfs"
    assert 31 * MIB < record["sandbox"]["work_bytes"] <= 32 * MIB
    # What it wrote is kept in the spool's work directory (the task page lists it), never more.
    assert 31 * MIB < work_bytes(spool) <= 32 * MIB
    assert record["sandbox"]["work_kept"]["files"] >= 31


# Writes 1 MiB files without end and swallows the failures (ENOSPC): the kernel refuses every byte
# past the limit and the runner's check ends the task once the tmpfs is full.
STUBBORN = ("import time\nb = b'x' * (1 << 20)\ni = 0\nwhile True:\n    try:\n"
            "        open('/sandbox/f%d' % i, 'wb').write(b)\n    except OSError:\n        time.sleep(0.01)\n"
            "    i += 1\n")


def test_an_agent_that_ignores_enospc_is_ended_once_its_work_directory_is_full(spool):
    proc, record = run_agent(spool, STUBBORN, TCO_SANDBOX_WORK_BYTES=str(16 * MIB), TCO_SANDBOX_WORK_CHECK_S="0.2")
    assert proc.returncode == config.EXIT_WORKDIR_QUOTA
    assert record["stages"]["agent_exited_at"] is None and "workdir_over_quota" in record["flags"]
    assert record["error"] == "work directory limit 16 MiB reached"
    assert record["sandbox"]["work_bytes"] <= 16 * MIB and work_bytes(spool) <= 16 * MIB


def test_the_spool_mode_keeps_the_work_directory_on_the_spool_under_the_runners_walk(spool):
    """TCO_SANDBOX_WORKDIR=spool (a site whose work directories must outgrow memory): the old bind,
    stopped by the walk after it went past the limit."""
    proc, record = run_agent(spool, MANY_FILES, TCO_SANDBOX_FILE_BYTES=str(8 * MIB),
                             TCO_SANDBOX_WORK_BYTES=str(32 * MIB), TCO_SANDBOX_WORK_CHECK_S="0.2",
                             TCO_SANDBOX_WORKDIR="spool")
    assert proc.returncode == config.EXIT_WORKDIR_QUOTA
    assert record["sandbox"]["workdir"] == "spool" and "work_kept" not in record["sandbox"]
    assert record["error"] == "work directory limit 32 MiB reached"
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
    """On a host without tco's memory cgroup: the per-process limit (RLIMIT_DATA) alone."""
    spool.write([{"task": 1}], command=[sys.executable, "-c", ALLOCATE])
    peak = tmp_path / "peak"
    proc = subprocess.run([sys.executable, "-c", PEAK_OF, str(peak), sys.executable, "-m", "execution.runner"],
                          env={**spool.env(1), "TCO_SANDBOX_MEMORY_BYTES": str(256 * MIB),
                               "TCO_MEMORY_CGROUP_ROOT": str(tmp_path / "no-cgroup")}, cwd=str(spool.root),
                          capture_output=True, timeout=60, start_new_session=True)
    record = spool.record(1)
    assert any(n.startswith("no memory cgroup for the whole task") for n in record["sandbox"]["notes"])
    assert "memory_cgroup" not in record["sandbox"]
    assert record["exit_status"] == 1 and proc.returncode == 1
    assert "memory_limit" in record["flags"]
    assert record["error"] == "memory limit 256 MiB reached"
    assert record["sandbox"]["limits"]["memory_bytes"] == 256 * MIB
    assert "MemoryError" in (spool.root / "records" / "c-1" / "1.stderr").read_text()
    # No process of the task (the runner, bubblewrap, the relay, the agent: all reaped, so all
    # counted in the launcher's children) ever held more than the limit (ru_maxrss is in KiB).
    assert int(peak.read_text()) < (256 + 16) * 1024


# Four processes, each touching 96 MiB (under a 256 MiB per-process limit), 384 MiB together.
FORKED_HOGS = ("import os, time\nkids = []\nfor _ in range(4):\n    pid = os.fork()\n    if pid == 0:\n"
               "        keep = [b'\\x01' * (16 << 20) for _ in range(6)]\n        time.sleep(3)\n        os._exit(0)\n"
               "    kids.append(pid)\n"
               "codes = [os.waitstatus_to_exitcode(os.waitpid(p, 0)[1]) for p in kids]\n"
               "print('children', codes)\nraise SystemExit(0 if codes == [0, 0, 0, 0] else 3)\n")


@pytest.fixture
def memory_cgroup_root() -> str:
    """The host's delegated cgroup v1 memory directory (scripts/dev-cluster makes it)."""
    from execution.runner.memory_cgroup import DEFAULT_ROOT

    if not os.path.isfile(os.path.join(os.path.dirname(DEFAULT_ROOT), "memory.limit_in_bytes")):
        pytest.skip("this host has no cgroup v1 memory controller")
    if not os.access(DEFAULT_ROOT, os.W_OK):
        pytest.fail(f"{DEFAULT_ROOT} is missing or not writable: run scripts/dev-cluster (as root)")
    return DEFAULT_ROOT


def test_processes_that_together_pass_the_memory_limit_are_stopped_by_the_tasks_memory_cgroup(spool,
                                                                                               memory_cgroup_root):
    """Each process stays under its own limit; the task's memory cgroup holds them together: the
    kernel kills one, the agent fails, and the record says which limit and what the group held."""
    # The group holds the processes and the tmpfs work directory's pages: 256 + 16 MiB.
    proc, record = run_agent(spool, FORKED_HOGS, TCO_SANDBOX_MEMORY_BYTES=str(256 * MIB),
                             TCO_SANDBOX_WORK_BYTES=str(16 * MIB), TCO_MEMORY_CGROUP_ROOT=memory_cgroup_root)
    group = record["sandbox"]["memory_cgroup"]
    assert group["limit_bytes"] == 272 * MIB and group["oom_kills"] >= 1
    assert 200 * MIB < group["peak_bytes"] <= 272 * MIB
    assert record["exit_status"] == 3 and proc.returncode == 3
    assert "memory_limit" in record["flags"]
    assert record["error"] == (f"memory limit 256 MiB reached (the task's processes together with the files of "
                               f"its work directory, held in memory: 272 MiB in all; the kernel killed "
                               f"{group['oom_kills']} of them)")
    assert "children" in (spool.root / "records" / "c-1" / "1.stdout").read_text()
    assert not os.path.exists(group["path"])  # removed with the task
    # The same agent under 512 MiB: nothing is killed, and the group is gone after it too.
    spool2 = Spool(spool.root.parent / "spool2")
    proc, record = run_agent(spool2, FORKED_HOGS, TCO_SANDBOX_MEMORY_BYTES=str(512 * MIB),
                             TCO_SANDBOX_WORK_BYTES=str(16 * MIB), TCO_MEMORY_CGROUP_ROOT=memory_cgroup_root)
    assert proc.returncode == 0 and record["flags"] == [] and record["sandbox"]["memory_cgroup"]["oom_kills"] == 0
    assert record["sandbox"]["memory_cgroup"]["peak_bytes"] > 384 * MIB
    assert not os.path.exists(record["sandbox"]["memory_cgroup"]["path"])


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


def test_groups_left_by_dead_runners_are_removed_by_the_next_task_and_live_ones_kept(memory_cgroup_root):
    """A crashed host kills its runners before they remove their groups: the next runner on the host
    removes those (dead pid, no process), never a live runner's."""
    from execution.runner.memory_cgroup import make_group

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan = os.path.join(memory_cgroup_root, f"c-test.1.0.{dead.pid}")
    live = os.path.join(memory_cgroup_root, f"c-test.2.0.{os.getpid()}")
    os.mkdir(orphan)
    os.mkdir(live)
    try:
        group, note = make_group({"TCO_MEMORY_CGROUP_ROOT": memory_cgroup_root}, f"c-test.3.0.{os.getpid()}x", MIB << 6)
        assert note is None and not os.path.exists(orphan) and os.path.isdir(live)
        group.remove()
    finally:
        for path in (orphan, live):
            if os.path.isdir(path):
                os.rmdir(path)


def test_all_agents_together_are_held_below_the_hosts_memory(memory_cgroup_root):
    """The fresh attack's A3: 96 slots x 4 GiB per task (384 GiB) against a 24 GiB host, and the tasks'
    parent group unlimited: one launcher's campaign could push the host into a system-wide OOM kill.
    The tasks' groups are children of the delegated directory, whose limit (root's, set by
    scripts/dev-cluster: 75% of MemTotal) bounds them together; the submit account cannot raise it."""
    with open("/proc/meminfo") as fh:
        total = next(int(line.split()[1]) * 1024 for line in fh if line.startswith("MemTotal:"))
    with open(os.path.join(memory_cgroup_root, "memory.limit_in_bytes")) as fh:
        limit = int(fh.read())
    with open(os.path.join(memory_cgroup_root, "memory.use_hierarchy")) as fh:
        assert fh.read().strip() == "1"  # a child's charge counts in this group's
    assert limit <= total * 0.8, f"the agents together may use {limit >> 20} MiB of the host's {total >> 20} MiB"
    assert not os.access(os.path.join(memory_cgroup_root, "memory.limit_in_bytes"), os.W_OK) or os.geteuid() == 0
