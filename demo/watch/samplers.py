"""The watch's samplers: qstat (the scheduler's side of the lag), memory and page times (load).

Threads; each is started, then stopped with ``stop()``.
"""
from __future__ import annotations

import os
import threading
import time
import urllib.request
from pathlib import Path
from typing import Callable, Mapping

from demo.watch.lags import Sightings

__all__ = ["QstatSampler", "rss_bytes", "descendants", "cpu_seconds", "host_cpu_seconds", "service_pids", "LoadSampler"]

CLK_TCK = os.sysconf("SC_CLK_TCK")


class QstatSampler(threading.Thread):
    """Samples ``list_tasks()`` every ``period_s`` seconds into :class:`Sightings` (module doc).
    ``errors`` counts failed samples; ``samples`` the good ones."""

    def __init__(self, list_tasks: Callable[[], list], *, period_s: float = 0.25) -> None:
        super().__init__(name="tco-qstat-sampler", daemon=True)
        self.list_tasks, self.period_s = list_tasks, period_s
        self.sightings = Sightings()
        self.samples = self.errors = 0
        self.durations: list[float] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        """Sample until :meth:`stop`."""
        while not self._stop_event.is_set():
            began = time.time()
            try:
                tasks = self.list_tasks()
            except Exception:  # noqa: BLE001 - a failed sample is counted, the next one goes on
                self.errors += 1
            else:
                states = {(t.job_number, t.task_number or 0): t.state for t in tasks}
                self.sightings.observe(began, states, complete_jobs=self.sightings.jobs())
                self.samples += 1
                self.durations.append(time.time() - began)
            self._stop_event.wait(max(0.0, self.period_s - (time.time() - began)))

    def stop(self) -> None:
        """Stop sampling and wait (at most 30 s) for the thread to end."""
        self._stop_event.set()
        self.join(timeout=30)


def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and all its descendants (bytes, ``VmRSS`` of /proc/<pid>/status);
    0 when it is gone."""
    total = 0
    for p in descendants(pid):
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
        except (OSError, ValueError):
            continue
    return total


def descendants(pid: int) -> list[int]:
    """``pid`` and every live descendant (from /proc/<pid>/task/*/children)."""
    out, stack = [], [pid]
    while stack:
        p = stack.pop()
        out.append(p)
        try:
            for task in Path(f"/proc/{p}/task").iterdir():
                stack += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return out


def cpu_seconds(pid: int) -> float:
    """CPU time (seconds, user + system) used so far by ``pid`` and its descendants: for each live
    process of the tree, ``utime + stime + cutime + cstime`` of /proc/<pid>/stat (proc(5), fields
    14-17, clock ticks), so children already reaped count through their parent. 0.0 when it is gone."""
    ticks = 0
    for p in descendants(pid):
        try:
            stat = Path(f"/proc/{p}/stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2:].split()   # after "pid (comm) ": field 3 is fields[0]
        ticks += sum(int(v) for v in fields[11:15])
    return ticks / CLK_TCK


def host_cpu_seconds() -> dict[str, float]:
    """The whole host's CPU time so far (seconds, all CPUs), from the first line of /proc/stat
    (proc(5)): ``{"user", "nice", "system", "idle", "iowait", "other"}``; ``nice`` is time of
    processes at a positive nice value (the agents run at nice 19)."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    user, nice, system, idle, iowait = fields[:5]
    return {"user": user / CLK_TCK, "nice": nice / CLK_TCK, "system": system / CLK_TCK,
            "idle": idle / CLK_TCK, "iowait": iowait / CLK_TCK, "other": sum(fields[5:8]) / CLK_TCK}


def _python_name(proc: Path) -> str:
    """A Python process named by what it runs: ``python <script>``, ``python manage.py <command>`` or
    ``python -m <module> [-Q queue]`` (celery's queue), from /proc/<pid>/cmdline."""
    try:
        args = (proc / "cmdline").read_bytes().decode(errors="replace").split("\0")[1:]
    except OSError:
        return "python"
    args = [a for a in args if a]
    while args and args[0].startswith("-") and args[0] != "-m":
        args = args[1:]
    if not args:
        return "python"
    if args[0] == "-c":
        return "python -c"
    if args[0] == "-m" and len(args) > 1:
        queue = args[args.index("-Q") + 1] if "-Q" in args[:-1] else ""
        return f"python -m {args[1]}" + (f" -Q {queue}" if queue else "")
    if Path(args[0]).name == "manage.py" and len(args) > 1:
        return f"python manage.py {args[1]}"
    return f"python {Path(args[0]).name}"


def process_cpu_table() -> dict[tuple[int, int], tuple[str, int, float]]:
    """Every process on the host: ``{(pid, start time in ticks): (command name, nice, CPU seconds)}``, CPU
    seconds being ``utime + stime + cutime + cstime`` (/proc/<pid>/stat, proc(5) fields 14-17 and 19, 22),
    so a child reaped by its parent counts in the parent's row."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        comm = stat[stat.index("(") + 1:stat.rindex(")")]
        if comm.startswith("python"):
            comm = _python_name(entry)
        fields = stat[stat.rindex(")") + 2:].split()
        out[(int(entry.name), int(fields[19]))] = (comm, int(fields[16]),
                                                   sum(int(v) for v in fields[11:15]) / CLK_TCK)
    return out


def cpu_by_command(before: dict, after: dict) -> list[tuple[str, float]]:
    """CPU seconds used between two :func:`process_cpu_table` readings, summed per command name (a name
    run at a positive nice value gets " (nice N)"), largest first. A process that started and ended
    between the readings counts only through its parent's reaped-children time."""
    sums: dict[str, float] = {}
    for key, (comm, nice, cpu) in after.items():
        used = cpu - before[key][2] if key in before else cpu
        name = f"{comm} (nice {nice})" if nice > 0 else comm
        sums[name] = sums.get(name, 0.0) + used
    return sorted(((n, v) for n, v in sums.items() if v > 0), key=lambda nv: -nv[1])


def service_pids(state_dir: Path) -> dict[str, int]:
    """``{name: pid}`` of the running web server and workers from scripts/services' pid files
    (``<state dir>/run/<name>.pid``)."""
    out = {}
    for name in ("web", "live", "poll", "worker", "ingest", "submit", "beat", "demo-model"):
        try:
            pid = int((Path(state_dir) / "run" / f"{name}.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        if Path(f"/proc/{pid}").exists():
            out[name] = pid
    return out


class LoadSampler(threading.Thread):
    """Every ``period_s`` seconds: the RSS of each process in ``pids``; every ``page_every_s``: one GET
    of each of ``pages()`` (paths) as ``session_key``, timed (seconds, request sent -> body read)."""

    def __init__(self, *, pids: Mapping[str, int], base_url: str, session_key: str,
                 pages: Callable[[], list[str]], period_s: float = 1.0, page_every_s: float = 5.0) -> None:
        super().__init__(name="tco-load-sampler", daemon=True)
        self.pids, self.base, self.session_key, self.pages = dict(pids), base_url.rstrip("/"), session_key, pages
        self.period_s, self.page_every_s = period_s, page_every_s
        self.rss: dict[str, list[int]] = {name: [] for name in self.pids}
        self.page_times: dict[str, list[float]] = {}
        self.page_errors: list[str] = []
        self.cpu: dict[str, list[float]] = {}   # name -> [CPU seconds at start, at stop]
        self.processes: list[dict] = []          # process_cpu_table() at start, at stop
        self._stop_event = threading.Event()

    def cpu_now(self) -> dict[str, float]:
        """CPU seconds so far: each service in ``pids`` (tree), this process (the watchers), and the
        host's ``host busy`` (user + nice + system + other) and ``host nice`` (the agents, nice 19)."""
        out = {name: cpu_seconds(pid) for name, pid in self.pids.items()}
        self_times = os.times()
        out["watchers (this process)"] = self_times.user + self_times.system
        host = host_cpu_seconds()
        out["host busy"] = host["user"] + host["nice"] + host["system"] + host["other"]
        out["host nice"] = host["nice"]
        return out

    def run(self) -> None:
        """Sample until :meth:`stop`."""
        from django.conf import settings

        self.cpu = {name: [v] for name, v in self.cpu_now().items()}
        self.processes = [process_cpu_table()]
        next_pages = time.monotonic()
        while not self._stop_event.is_set():
            for name, pid in self.pids.items():
                self.rss[name].append(rss_bytes(pid))
            if time.monotonic() >= next_pages:
                next_pages = time.monotonic() + self.page_every_s
                for path in self.pages():
                    req = urllib.request.Request(self.base + path, headers={
                        "Cookie": f"{settings.SESSION_COOKIE_NAME}={self.session_key}"})
                    began = time.perf_counter()
                    try:
                        with urllib.request.urlopen(req, timeout=30) as resp:
                            resp.read()
                    except OSError as exc:
                        self.page_errors.append(f"{path}: {exc}")
                        continue
                    kind = "queue page" if path == "/" else "campaign page"
                    self.page_times.setdefault(kind, []).append(time.perf_counter() - began)
            self._stop_event.wait(self.period_s)

    def stop(self) -> None:
        """Stop sampling and wait (at most 60 s) for the thread to end; takes the CPU seconds at stop."""
        self._stop_event.set()
        self.join(timeout=60)
        for name, v in self.cpu_now().items():
            if name in self.cpu:
                self.cpu[name].append(v)
        if self.processes:
            self.processes.append(process_cpu_table())

    def top_commands(self, n: int = 12) -> list[tuple[str, float]]:
        """The ``n`` command names that used the most CPU seconds between start and stop (host-wide)."""
        return cpu_by_command(*self.processes)[:n] if len(self.processes) == 2 else []
