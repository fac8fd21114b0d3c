"""The runner's settings: constants, limits from the environment, the task's identity.

See docs/runner.md ("Environment", "Limits", "Exit status and flags").
Standard library only; quick to import (the runner starts once per task).
"""
from __future__ import annotations

import dataclasses
import os
import signal
import sys
from collections.abc import Mapping

from execution.spool.layout import SpoolLayout, check_campaign_id
from execution.spool.contract import SpoolError

#: The agent's stdout and stderr are each kept up to this many bytes.
OUTPUT_CAP_BYTES = 1 << 20
#: Each declared output file is copied up to this many bytes.
OUTPUT_FILE_CAP_BYTES = 1 << 20
#: At most this many declared output files are copied.
MAX_OUTPUT_FILES = 64
#: Seconds between asking the agent to stop (SIGTERM) and killing its sandbox.
KILL_GRACE_S = 5.0
#: The most grace after a signal to the runner (seconds): Grid Engine's notify time before its
#: SIGKILL is 5 s on the dev cluster, and the record must be out first.
SIGNALLED_GRACE_S = 3.0
#: Seconds the runner waits for the output pipes to drain at the end.
OUTPUT_DRAIN_S = 2.0
#: Seconds the runner waits for the metering proxy to start or stop.
PROXY_STOP_S = 15.0
#: How often the runner looks at the campaign's network policy file (seconds).
NETWORK_POLICY_POLL_S = 0.25
#: The most network policy changes one runner record notes.
MAX_NETWORK_CHANGES_NOTED = 100
#: Exit statuses of the runner itself (docs/runner.md, "Exit status and flags").
EXIT_TIMEOUT = 124
EXIT_WORKDIR_QUOTA = 122
EXIT_CONFIG = 78
EXIT_INTERNAL = 70
#: The sandbox's limits (environment variable -> default); see docs/runner.md, "Limits".
LIMIT_DEFAULTS = {"TCO_SANDBOX_TMPFS_BYTES": 256 << 20, "TCO_SANDBOX_MAX_PROCESSES": 256,
                  "TCO_SANDBOX_WORK_BYTES": 4 << 30, "TCO_SANDBOX_WORK_CHECK_S": 10,
                  "TCO_SANDBOX_MEMORY_BYTES": 4 << 30, "TCO_SANDBOX_FILE_BYTES": 1 << 30,
                  "TCO_SANDBOX_CPU_S": 24 * 3600}
#: The limits a runner spec's ``limits`` may lower (spec key -> environment variable): the
#: site's value (environment, else the default) is the ceiling; a spec never raises it.
SPEC_LIMITS = {"memory_bytes": "TCO_SANDBOX_MEMORY_BYTES", "file_bytes": "TCO_SANDBOX_FILE_BYTES",
               "cpu_s": "TCO_SANDBOX_CPU_S", "work_bytes": "TCO_SANDBOX_WORK_BYTES",
               "max_processes": "TCO_SANDBOX_MAX_PROCESSES", "tmpfs_bytes": "TCO_SANDBOX_TMPFS_BYTES"}
#: The metering proxy's limits: environment variable -> field of execution/metering/endpoints.py's
#: ``Limits`` (whose defaults apply when the variable is unset).
PROXY_LIMITS = {"TCO_PROXY_MAX_CONNECTIONS": "max_connections", "TCO_PROXY_MAX_HEADER_BYTES": "max_header_bytes",
                "TCO_PROXY_MAX_BODY_BYTES": "max_body_bytes", "TCO_PROXY_MAX_BUFFERED_BYTES": "max_buffered_bytes",
                "TCO_PROXY_RECORDS_IN_MEMORY": "records_in_memory",
                "TCO_PROXY_RECORD_FILE_BYTES": "record_file_bytes"}
#: The work directory as the agent sees it.
INSIDE_WORKDIR = "/sandbox"
#: The API key the agent sees; the proxy drops it and adds the real credential.
PLACEHOLDER_KEY = "tco-sandbox-no-key-the-proxy-adds-it"
#: Variables of the runner's environment that reach the agent unchanged.
PASSED_THROUGH_ENV = ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "PYTHONUNBUFFERED", "LANG", "LC_ALL", "TZ")
#: The repository root (tco's own code, which the default policy shows read-only).
CODE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
#: Signals that would kill the runner without a record; it stops the agent and writes one.
TERMINATING_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1,
                       signal.SIGUSR2, signal.SIGXCPU)


class RunnerError(Exception):
    """The runner could not start the agent (environment, spec, input or policy is wrong)."""


def default_policy() -> dict:
    """The policy of a spec without one, as a mapping (execution/sandbox/policy's schema):
    system directories and tco's own code (for its bundled agents) read-only, the work
    directory and a private /tmp writable, no network."""
    read_only = ["/usr", "/lib", "/lib64", "/bin", "/etc", os.path.join(CODE_ROOT, "demo")]
    if sys.prefix != sys.base_prefix:  # the venv the bundled agents run with
        read_only.append(sys.prefix)
    return {"version": 1,
            "filesystem_policy": {"include_workdir": True, "read_only": read_only,
                                  "read_write": [INSIDE_WORKDIR, "/tmp"]},
            "process": {"run_as_user": "sandbox", "run_as_group": "sandbox"}}


def limit(environ: Mapping[str, str], name: str) -> int | None:
    """The limit ``name`` from the environment: a positive integer, else its default
    (:data:`LIMIT_DEFAULTS`; None for :data:`PROXY_LIMITS`: the proxy's own). Raises
    RunnerError for a value that is not a positive integer."""
    text = environ.get(name)
    if text in (None, ""):
        return LIMIT_DEFAULTS.get(name)
    if not text.isdigit() or int(text) < 1:
        raise RunnerError(f"{name}={text!r}: expected a positive integer")
    return int(text)


def effective_limits(environ: Mapping[str, str], spec: Mapping | None) -> dict[str, int]:
    """Each limit of :data:`SPEC_LIMITS` (by environment variable): the site's value
    (:func:`limit`), lowered by the spec's ``limits`` mapping where it asks for less. Raises
    RunnerError for a spec value that is not a positive integer or a key it does not know."""
    values = {name: limit(environ, name) for name in SPEC_LIMITS.values()}
    asked = (spec or {}).get("limits") or {}
    if not isinstance(asked, Mapping):
        raise RunnerError("the spec's limits must be a mapping")
    for key, value in asked.items():
        if key not in SPEC_LIMITS:
            raise RunnerError(f"the spec's limits.{key}: not one of {', '.join(sorted(SPEC_LIMITS))}")
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise RunnerError(f"the spec's limits.{key}={value!r}: expected a positive integer")
        name = SPEC_LIMITS[key]
        values[name] = min(values[name], value)
    return values


def size_text(n: int) -> str:
    """``n`` bytes as people read it: "4 GiB", "256 MiB", "1.5 MiB", "100 bytes"."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            return f"{n >> shift} {unit}" if n % (1 << shift) == 0 else f"{n / (1 << shift):.1f} {unit}"
    return f"{n} bytes"


def check_interval(environ: Mapping[str, str]) -> float:
    """Seconds between two walks of the work directory (``TCO_SANDBOX_WORK_CHECK_S``, a
    positive finite number; default 10). Raises RunnerError."""
    text = environ.get("TCO_SANDBOX_WORK_CHECK_S")
    if text in (None, ""):
        return float(LIMIT_DEFAULTS["TCO_SANDBOX_WORK_CHECK_S"])
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0 or value != value or value == float("inf"):
        raise RunnerError(f"TCO_SANDBOX_WORK_CHECK_S={text!r}: expected a positive number of seconds")
    return value


@dataclasses.dataclass(frozen=True)
class TaskIdentity:
    """Which task this runner runs, from its environment (:func:`read_task`).

    ``spool``: the spool root (absolute path); ``campaign_id``: a safe name (text);
    ``task_number``: 1.. (1 with ``defaulted`` for a non-array job); ``job_number``: Grid
    Engine's job number or None; ``layout``: the spool's :class:`SpoolLayout`.
    """

    spool: str
    campaign_id: str
    task_number: int
    job_number: int | None
    defaulted: bool
    layout: SpoolLayout

    @property
    def record_dir(self) -> str:
        """``records/<campaign_id>/`` under the spool."""
        return self.layout.records_dir(self.campaign_id)

    def task_file(self, suffix: str) -> str:
        """``records/<campaign_id>/<task>.<suffix>`` under the spool."""
        return self.layout.task_file(self.campaign_id, self.task_number, suffix)


def read_task(environ: Mapping[str, str]) -> TaskIdentity:
    """The task of this runner (docs/runner.md, "Environment"). Raises RunnerError."""
    spool, campaign_id = environ.get("TCO_SPOOL_DIR") or None, environ.get("TCO_CAMPAIGN_ID") or None
    if not spool or not os.path.isabs(spool):
        raise RunnerError("TCO_SPOOL_DIR must be set to an absolute path")
    try:
        check_campaign_id(campaign_id or "")
    except SpoolError:
        raise RunnerError(f"TCO_CAMPAIGN_ID {campaign_id!r} is missing or not a safe name") from None
    layout = SpoolLayout(spool)
    job_id = environ.get("JOB_ID", "")
    job_number = int(job_id) if job_id.isdigit() else None
    task_id = environ.get("SGE_TASK_ID", "undefined")
    if task_id.isdigit() and int(task_id) >= 1:
        task_number, defaulted = int(task_id), False
    elif task_id in ("", "undefined"):
        task_number, defaulted = 1, True
    else:
        raise RunnerError(f"SGE_TASK_ID {task_id!r} is not a task number")
    return TaskIdentity(spool=spool, campaign_id=campaign_id, task_number=task_number, job_number=job_number,
                        defaulted=defaulted, layout=layout)


def check_limits(environ: Mapping[str, str]) -> None:
    """Check every limit of :data:`LIMIT_DEFAULTS` and :data:`PROXY_LIMITS` at once: a bad limit
    is a configuration error before anything starts. Raises RunnerError."""
    for name in (*LIMIT_DEFAULTS, *PROXY_LIMITS):
        if name != "TCO_SANDBOX_WORK_CHECK_S":
            limit(environ, name)
    check_interval(environ)
