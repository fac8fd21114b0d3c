"""Settings of what one launch may take and one team may hold: the sandbox limits (the site's, per
queue, per agent) and the advance reservation ceilings, read from the environment.

Imported by ``tco_web/settings.py`` (``from tco_web.limit_settings import *``; the names below are
settings like any other there, ``settings.TCO_SANDBOX_LIMITS``). Parsed strictly as there: a
malformed value stops start-up with a message naming the variable. Read once, when this module is
first imported (a reload of ``tco_web.settings`` keeps these values).
"""
from __future__ import annotations

import os

from django.core.exceptions import ImproperlyConfigured

from tco_web.env import env_int, env_str

__all__ = ["TCO_RESERVATION_MAX_S", "TCO_RESERVATION_TEAM_MAX_SEATS", "TCO_RESERVATION_TEAM_MAX_SLOTS",
           "TCO_RESERVATION_TEAM_MAX_TOTAL_S", "TCO_RESERVATION_MAX_LEAD_S", "TCO_SANDBOX_LIMITS",
           "TCO_QUEUE_SANDBOX_LIMITS", "TCO_AGENT_SANDBOX_LIMITS", "TCO_SANDBOX_WORKDIR", "TCO_SANDBOX_SECCOMP"]

# The longest advance reservation a launcher may book (seconds): a booking holds slots and
# model API seats away from every other team for its whole duration (dashboards/launch/reservations.py).
TCO_RESERVATION_MAX_S = env_int("TCO_RESERVATION_MAX_S", 24 * 3600)
# What one team may hold through advance reservations booked by its launchers (admins may book
# above these; dashboards/launch/reservations.py): model API seats and slots at any moment, the
# reserved time of its reservations not yet ended (seconds, summed), and how far ahead a booking
# may start (seconds). A launcher booked every seat of the cluster for 48 h by chaining two 24 h
# reservations before these existed (issue 23, finding 2).
TCO_RESERVATION_TEAM_MAX_SEATS = env_int("TCO_RESERVATION_TEAM_MAX_SEATS", 32)
TCO_RESERVATION_TEAM_MAX_SLOTS = env_int("TCO_RESERVATION_TEAM_MAX_SLOTS", 32)
TCO_RESERVATION_TEAM_MAX_TOTAL_S = env_int("TCO_RESERVATION_TEAM_MAX_TOTAL_S", 48 * 3600)
TCO_RESERVATION_MAX_LEAD_S = env_int("TCO_RESERVATION_MAX_LEAD_S", 7 * 24 * 3600)
# The site's sandbox limits, passed to every task's runner (docs/limits.md); unset ones keep the
# runner's defaults (LIMIT_DEFAULTS in execution/runner/config.py). A runner checks each value.
TCO_SANDBOX_LIMITS = {name: os.environ[name] for name in (
    "TCO_SANDBOX_MEMORY_BYTES", "TCO_SANDBOX_FILE_BYTES", "TCO_SANDBOX_CPU_S", "TCO_SANDBOX_WORK_BYTES",
    "TCO_SANDBOX_WORK_CHECK_S", "TCO_SANDBOX_MAX_PROCESSES", "TCO_SANDBOX_TMPFS_BYTES") if os.environ.get(name)}
# Where a task's /sandbox lives, passed to its runner too: "tmpfs" (the default: a tmpfs of the disk
# limit, the kernel refuses the write past it) or "spool" (a bind of the spool's work directory, the
# limit kept by a periodic walk: for work directories bigger than memory). docs/limits.md;
# execution/runner/workdir_tmpfs.py checks it again.
TCO_SANDBOX_WORKDIR = os.environ.get("TCO_SANDBOX_WORKDIR", "").strip()
if TCO_SANDBOX_WORKDIR not in ("", "tmpfs", "spool"):
    from django.core.exceptions import ImproperlyConfigured

    raise ImproperlyConfigured(f"TCO_SANDBOX_WORKDIR={TCO_SANDBOX_WORKDIR!r}: tmpfs or spool")
# The sandbox's seccomp filter, passed to every task's runner: "default" (the deny-list of
# execution/sandbox/seccomp.py) or "off" (no filter: an agent that must trace processes, at the
# site's risk). docs/limits.md; the runner checks it again.
TCO_SANDBOX_SECCOMP = os.environ.get("TCO_SANDBOX_SECCOMP", "").strip()
if TCO_SANDBOX_SECCOMP not in ("", "default", "off"):
    raise ImproperlyConfigured(f"TCO_SANDBOX_SECCOMP={TCO_SANDBOX_SECCOMP!r}: default or off")


def sandbox_limit_table(name: str, raw: str | None) -> dict[str, dict[str, dict[str, int]]]:
    """An admin's per-queue or per-agent sandbox limits (docs/limits.md, "Per queue and agent"):
    ``raw`` is JSON ``{"<queue or agent name>": {"memory_bytes": {"max": B, "default": B},
    "work_bytes": {...}}}``, bytes, ``max`` (the ceiling a launch may not exceed) and ``default``
    (what a launch that leaves the limit blank gets) each optional. Returns that mapping;
    empty for a blank ``raw``. Raises ``ImproperlyConfigured`` naming ``name`` for anything else: not
    JSON, another limit, a value that is not a whole number of bytes at least the launch minimum
    (64 MiB of memory, 1 MiB of disk), or a default above its own max."""
    import json

    minima = {"memory_bytes": 64 << 20, "work_bytes": 1 << 20}  # = core.limits.LAUNCH_SANDBOX_MINIMA
    if not raw or not raw.strip():
        return {}
    try:
        table = json.loads(raw)
    except ValueError as exc:
        raise ImproperlyConfigured(f"{name}: not JSON ({exc})") from None
    if not isinstance(table, dict):
        raise ImproperlyConfigured(f"{name}: a JSON object of queue or agent names")
    out: dict[str, dict[str, dict[str, int]]] = {}
    for who, entry in table.items():
        if not isinstance(entry, dict):
            raise ImproperlyConfigured(f"{name}: {who!r}: an object of limits (memory_bytes, work_bytes)")
        out[who] = {}
        for key, bounds in entry.items():
            if key not in minima:
                raise ImproperlyConfigured(f"{name}: {who!r}: {key!r} is not memory_bytes or work_bytes")
            if not isinstance(bounds, dict) or not bounds or set(bounds) - {"max", "default"}:
                raise ImproperlyConfigured(f"{name}: {who!r}: {key}: an object with max and/or default")
            for which, value in bounds.items():
                if type(value) is not int or value < minima[key]:
                    raise ImproperlyConfigured(f"{name}: {who!r}: {key}.{which}: a whole number of bytes, at "
                                               f"least {minima[key]}")
            if "max" in bounds and "default" in bounds and bounds["default"] > bounds["max"]:
                raise ImproperlyConfigured(f"{name}: {who!r}: {key}: default above max")
            out[who][key] = dict(bounds)
    return out


# Admins' ceilings and defaults per queue and per agent definition (by name), within the site's
# TCO_SANDBOX_* values: a launch asking for more is refused (docs/limits.md).
TCO_QUEUE_SANDBOX_LIMITS = sandbox_limit_table("TCO_QUEUE_SANDBOX_LIMITS", env_str("TCO_QUEUE_SANDBOX_LIMITS", ""))
TCO_AGENT_SANDBOX_LIMITS = sandbox_limit_table("TCO_AGENT_SANDBOX_LIMITS", env_str("TCO_AGENT_SANDBOX_LIMITS", ""))
