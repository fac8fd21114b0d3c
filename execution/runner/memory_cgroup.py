"""The task's memory cgroup: every process of the sandbox together under one kernel memory limit.

RLIMIT_DATA (the relay's) bounds each process; an agent that forks could still use the process
limit times as much. Where the execution host gives tco a cgroup v1 memory directory
(``TCO_MEMORY_CGROUP_ROOT``, default ``/sys/fs/cgroup/memory/tco``, made by ``scripts/setup`` and
owned by the submit account; docs/limits.md), the runner makes one child group per task
(``<campaign>.<task>.<job>.<runner pid>``), sets ``memory.limit_in_bytes`` (and
``memory.memsw.limit_in_bytes``, so swap is no way around it) to the task's memory limit, and
starts bubblewrap inside it through :data:`ENTER` (a few lines of Python that move themselves
into the group and exec bubblewrap): the sandbox and everything it forks are charged there, its
tmpfs pages too; the runner and its metering proxy are not. Past the limit the kernel reclaims,
then its OOM killer kills a process of the group (the agent, the largest); the group's
``memory.oom_control`` counts it (``oom_kill``), which is how the runner knows the reason.

cgroup v1 only (the dev cluster's hosts): a cgroup v2 host, or one without the directory, runs
the task with the per-process limits alone and the record's ``sandbox.notes`` says so.
Standard library only.
"""
from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping

#: Where a host delegates its memory cgroup directory to tco (environment variable, default).
ROOT_ENV = "TCO_MEMORY_CGROUP_ROOT"
DEFAULT_ROOT = "/sys/fs/cgroup/memory/tco"
#: Run as ``python -I -S -c ENTER <cgroup.procs> <program> <args...>``: moves itself into the group,
#: puts back the signal dispositions Python's start ignored (SIGPIPE, SIGXFSZ; an ignored signal
#: stays ignored across exec), then becomes ``program``. No shell; its arguments are never parsed.
ENTER = ("import os, signal, sys\n"
         "fd = os.open(sys.argv[1], os.O_WRONLY)\n"
         "os.write(fd, b'0')\n"
         "os.close(fd)\n"
         "for s in (signal.SIGPIPE, signal.SIGXFSZ):\n"
         "    signal.signal(s, signal.SIG_DFL)\n"
         "os.execv(sys.argv[2], sys.argv[2:])\n")
#: How long :meth:`TaskMemoryGroup.remove` waits for killed processes to leave the group (seconds).
REMOVE_WAIT_S = 2.0


class TaskMemoryGroup:
    """One task's memory cgroup at ``path`` (a directory of a cgroup v1 memory hierarchy) with
    ``limit_bytes``. Make it with :func:`make_group`; start the sandbox through :meth:`prefix`;
    after the agent ends read :meth:`report`, then :meth:`remove`."""

    def __init__(self, path: str, limit_bytes: int) -> None:
        self.path = path
        self.limit_bytes = limit_bytes

    def _read(self, name: str) -> str:
        with open(os.path.join(self.path, name), encoding="ascii") as f:
            return f.read()

    def prefix(self, interpreter: str) -> list[str]:
        """The argv to put before bubblewrap's so that it starts inside the group."""
        return [interpreter, "-I", "-S", "-c", ENTER, os.path.join(self.path, "cgroup.procs")]

    def oom_kills(self) -> int:
        """How many processes the kernel's OOM killer killed in the group (``memory.oom_control``'s
        ``oom_kill``; 0 when the kernel does not count them)."""
        for line in self._read("memory.oom_control").splitlines():
            key, _, value = line.partition(" ")
            if key == "oom_kill" and value.strip().isdigit():
                return int(value)
        return 0

    def report(self) -> dict:
        """``{"path", "limit_bytes", "peak_bytes", "oom_kills"}`` for the runner record (bytes;
        ``peak_bytes``: ``memory.max_usage_in_bytes``, the most the group held at once). Raises
        OSError when the group cannot be read."""
        return {"path": self.path, "limit_bytes": self.limit_bytes,
                "peak_bytes": int(self._read("memory.max_usage_in_bytes")), "oom_kills": self.oom_kills()}

    def pids(self) -> list[int]:
        """The processes in the group now (empty when it cannot be read)."""
        try:
            return [int(p) for p in self._read("cgroup.procs").split()]
        except (OSError, ValueError):
            return []

    def remove(self) -> None:
        """SIGKILL whatever is left in the group (nothing of a sandbox may outlive its task) and
        remove it, waiting up to :data:`REMOVE_WAIT_S` for the killed to go. Never raises: a group
        that cannot be removed stays behind (empty groups cost nothing)."""
        deadline = time.monotonic() + REMOVE_WAIT_S
        while True:
            for pid in self.pids():
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            try:
                os.rmdir(self.path)
                return
            except FileNotFoundError:
                return
            except OSError:
                if time.monotonic() > deadline:
                    return
                time.sleep(0.05)


def make_group(environ: Mapping[str, str], name: str, limit_bytes: int) -> tuple[TaskMemoryGroup | None, str | None]:
    """Make the task's group ``name`` under the host's delegated directory (:data:`ROOT_ENV`) with
    ``limit_bytes`` (bytes). Returns ``(group, None)``, or ``(None, note)`` saying in words why the
    task runs without one (the directory is missing or not writable, or the kernel refused the
    limit); nothing is left behind then."""
    root = environ.get(ROOT_ENV) or DEFAULT_ROOT
    if not os.path.isfile(os.path.join(root, "memory.limit_in_bytes")):
        return None, (f"no memory cgroup for the whole task ({root} is not a cgroup v1 memory directory on this "
                      "host): the memory limit holds per process only (RLIMIT_DATA)")
    remove_orphans(root)
    path = os.path.join(root, name)
    group = TaskMemoryGroup(path, limit_bytes)
    try:
        os.mkdir(path)
        for limit_file in ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes"):
            target = os.path.join(path, limit_file)
            if limit_file == "memory.limit_in_bytes" or os.path.exists(target):
                with open(target, "w", encoding="ascii") as f:
                    f.write(str(limit_bytes))
    except OSError as exc:
        if os.path.isdir(path):
            group.remove()
        return None, (f"no memory cgroup for the whole task (cannot make {path}: {exc.strerror or exc}): "
                      "the memory limit holds per process only (RLIMIT_DATA)")
    return group, None


def remove_orphans(root: str) -> list[str]:
    """Remove the groups under ``root`` left by runners that died without removing theirs (a crashed
    host kills them all): a group whose name's last part is a runner pid that no longer exists on
    this host and that holds no process. A live runner's group is never touched (its pid exists).
    Returns the names removed; never raises."""
    removed = []
    try:
        names = os.listdir(root)
    except OSError:
        return removed
    for name in names:
        pid = name.rpartition(".")[2]
        path = os.path.join(root, name)
        if not pid.isdigit() or not os.path.isdir(path) or os.path.exists(f"/proc/{pid}"):
            continue
        if TaskMemoryGroup(path, 0).pids():
            continue
        try:
            os.rmdir(path)
            removed.append(name)
        except OSError:
            pass
    return removed
