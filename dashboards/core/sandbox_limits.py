"""A task's sandbox limits in words: what it ran with, and which one stopped it (docs/limits.md).

The runner record (execution/spool/record.py; docs/runner.md) keeps the limits in force under
``sandbox.limits`` (``memory_bytes``, ``file_bytes``, ``cpu_s``, ``work_bytes``,
``max_processes``, ``tmpfs_bytes``), its seccomp filter (``sandbox.seccomp``: "default deny-list,
64 calls" or "off"; execution/sandbox/seccomp.py), whether the task's memory cgroup held its
processes together (``sandbox.memory_cgroup``: ``{"path", "limit_bytes", "peak_bytes", "oom_kills"}`` or absent) and,
when a limit stopped the agent, one of :data:`LIMIT_FLAGS` in ``flags`` with the reason in
``error`` ("memory limit 4 GiB reached").
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from execution.runner.config import size_text

#: Runner record flag -> the limit it names, in words (the flag is set when that limit stopped the agent).
LIMIT_FLAGS = {"memory_limit": "memory limit", "file_size_limit": "file size limit", "cpu_limit": "CPU time limit",
               "workdir_over_quota": "work directory (disk) limit"}

__all__ = ["LIMIT_FLAGS", "limit_reached", "limits_shown"]


def _sandbox(record: Mapping | None) -> Mapping:
    sandbox = (record or {}).get("sandbox") if isinstance(record, Mapping) else None
    return sandbox if isinstance(sandbox, Mapping) else {}


def limit_reached(record: Mapping | None) -> str | None:
    """Which limit stopped the task, in words, from its runner record: the runner's own reason
    ("memory limit 4 GiB reached") where it gave one, else the limit's name; None when no limit
    stopped it (or there is no record)."""
    if not isinstance(record, Mapping):
        return None
    flags = [f for f in (record.get("flags") or []) if f in LIMIT_FLAGS]
    if not flags:
        return None
    error = record.get("error")
    if isinstance(error, str) and "limit" in error:
        return error
    return f"{LIMIT_FLAGS[flags[0]]} reached"


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def limits_shown(record: Mapping | None, planned: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The limits a task ran with (its runner record), else the ones it will run with (``planned``:
    the campaign's ``memory_bytes`` and ``work_bytes``, ``limits.sandbox_limits_of``).

    Returns ``{"source": "runner record" | "campaign" | None, "rows": [{"what", "value"}],
    "stopped_by": str | None}``; ``rows`` in words, sizes as "4 GiB", times in seconds."""
    limits = _sandbox(record).get("limits")
    source = "runner record" if isinstance(limits, Mapping) else None
    if source is None and planned:
        limits, source = planned, "campaign"
    limits = limits if isinstance(limits, Mapping) else {}
    rows = []
    memory = _int(limits.get("memory_bytes"))
    if memory is not None:
        group = _sandbox(record).get("memory_cgroup") if source == "runner record" else None
        if isinstance(group, Mapping):
            peak = _int(group.get("peak_bytes"))
            value = (f"{size_text(memory)} for the agent's processes together (kernel memory cgroup)"
                     + (f", at most {size_text(peak)} used" if peak else "") + f"; {size_text(memory)} per process")
        elif source == "runner record":
            value = f"{size_text(memory)} per process (no memory cgroup on this host: not the processes together)"
        else:
            value = f"{size_text(memory)} for the agent's processes together where the host has tco's memory cgroup, " \
                    f"else per process"
        rows.append({"what": "memory", "value": value})
    work = _int(limits.get("work_bytes"))
    if work is not None:
        used = _int(_sandbox(record).get("work_bytes"))
        rows.append({"what": "disk (work directory)",
                     "value": size_text(work) + (f", {size_text(used)} used at the end" if used else "")})
    for key, what, unit in (("file_bytes", "one file", "bytes"), ("cpu_s", "CPU time per process", "s"),
                            ("max_processes", "processes", ""), ("tmpfs_bytes", "each scratch directory the policy lists (/tmp, /var/tmp, /dev/shm, /run)", "each")):
        value = _int(limits.get(key))
        if value is None:
            continue
        text = size_text(value) if unit == "bytes" else f"{value} s" if unit == "s" else \
            f"{size_text(value)} each" if unit == "each" else str(value)
        rows.append({"what": what, "value": text})
    seccomp = _sandbox(record).get("seccomp") if source == "runner record" else None
    if isinstance(seccomp, str) and seccomp:
        rows.append({"what": "system calls", "value": f"seccomp filter: {seccomp}" if seccomp != "off"
                     else "no seccomp filter (turned off by the site)"})
    return {"source": source, "rows": rows, "stopped_by": limit_reached(record)}
