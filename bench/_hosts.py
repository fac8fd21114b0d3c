"""The cluster a benchmark ran on, in one line: how many execution hosts, printed beside each figure.

Reads ``qhost -xml`` and ``qstat -f -xml`` of the cell the environment names
(SGE_ROOT, SGE_CELL and the port variables, as every client does), through
tco's parsers; on any error says so instead of a count.
"""
from __future__ import annotations

import os
import subprocess


def cluster_label() -> str:
    """``"3 execution hosts (agent.q on 2, classic.q on 1)"``, or ``"hosts unknown (why)"``."""
    from schedulers.hosts import parse_queue_instances
    from schedulers.gridengine.parsers.qhost import parse_qhost

    env = {**os.environ, "SGE_ROOT": os.environ.get("SGE_ROOT", "/var/lib/gridengine"),
           "SGE_CELL": os.environ.get("SGE_CELL", "default")}
    try:
        hosts = [h for h in parse_qhost(subprocess.run(["qhost", "-xml"], capture_output=True, check=True,
                                                        timeout=30, env=env).stdout) if h["name"] != "global"]
        instances = parse_queue_instances(subprocess.run(["qstat", "-f", "-xml"], capture_output=True, check=True,
                                                         timeout=30, env=env).stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        return f"hosts unknown ({exc})"
    per_queue = {}
    for qi in instances:
        per_queue.setdefault(qi["queue"], set()).add(qi["host"])
    spread = ", ".join(f"{q} on {len(h)}" for q, h in sorted(per_queue.items()))
    return f"{len(hosts)} execution host{'s' if len(hosts) != 1 else ''} ({spread})"
