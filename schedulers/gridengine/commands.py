"""Running Grid Engine's client commands: qstat, qhost, qquota, qconf, qmod, qdel, qhold, qrls, qalter.

Every status and control command goes through :func:`run_command`: an argv
list (never a shell string), a timeout, the cell's environment with
``TZ=UTC LC_ALL=C``, and typed errors (a qmaster that cannot be reached is
``SchedulerUnavailable``, a refusal ``SchedulerCommandError``).

Sources: qstat(1), qhold(1)/qrls(1)/qdel(1)/qalter(1)/qmod(1) of SGE 8.1.9
(OCS 9 keeps the options and messages used here).
"""
from __future__ import annotations

import os
import subprocess
from typing import Mapping, Sequence

from schedulers.base import (PRIORITY_MAX, PRIORITY_MIN, InvalidSubmission, SchedulerCommandError,
                             SchedulerUnavailable)

from .native_spec import is_int, job_id_arguments

DEFAULT_SGE_ROOT = "/var/lib/gridengine"
DEFAULT_SGE_CELL = "default"

# Messages with which SGE clients say they could not reach the qmaster (as
# opposed to the qmaster refusing the request). Matched case-insensitively on
# stderr and stdout: some clients print them on stdout ("Unable to run job:").
_UNREACHABLE_MARKERS = (
    "unable to contact qmaster",
    "commlib error",
    "unable to send message to qmaster",
    "cannot get configuration from qmaster",
    "failed receiving gdi request",
    "can't get configuration",
    "please set the environment variable sge_root",
    "sge_root directory",
    "cell directory",
    "act_qmaster",
)


CONTROL_COMMANDS = {
    "hold": ["qhold"],
    "release": ["qrls"],
    "delete": ["qdel"],
    "priority": ["qalter", "-p"],
    "clear_error": ["qmod", "-cj"],
}


def sge_environment(env_extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment every scheduler command runs in.

    The current environment, ``SGE_ROOT``/``SGE_CELL`` defaulted to Debian's
    (``/var/lib/gridengine``, ``default``), then ``env_extra``, then
    ``TZ=UTC`` and ``LC_ALL=C`` forced last: qstat prints times in the
    caller's ``TZ`` and parsers assume UTC and C-locale messages.
    """
    env = dict(os.environ)
    env.setdefault("SGE_ROOT", DEFAULT_SGE_ROOT)
    env.setdefault("SGE_CELL", DEFAULT_SGE_CELL)
    if env_extra:
        env.update({str(k): str(v) for k, v in env_extra.items()})
    env["TZ"] = "UTC"
    env["LC_ALL"] = "C"
    return env


def _is_unreachable(text: str) -> bool:
    low = text.lower()
    return any(marker in low for marker in _UNREACHABLE_MARKERS)


def run_command(argv: list[str], *, timeout: float = 10.0,
                env_extra: Mapping[str, str] | None = None) -> bytes:
    """Run one scheduler command and return its stdout bytes.

    ``argv`` is a list of strings executed directly (no shell); ``timeout`` is
    in seconds. The environment is :func:`sge_environment` (``env_extra``
    can set ``SGE_ROOT``/``SGE_CELL`` for another cell).

    Raises:
        SchedulerUnavailable: the binary is missing or not executable, the
            command timed out, or it failed with a "cannot reach the qmaster"
            message (``unable to contact qmaster``, ``commlib error`` …, and
            a missing ``SGE_ROOT`` or cell directory).
        SchedulerCommandError: any other non-zero exit; ``.stderr`` holds the
            message (stdout when stderr is empty, as some clients print there).
        TypeError: ``argv`` is not a non-empty list of strings.
    """
    if not isinstance(argv, (list, tuple)) or not argv or not all(isinstance(a, str) for a in argv):
        raise TypeError("argv must be a non-empty list of str")
    if any("\0" in a for a in argv):
        raise TypeError("argv elements must not contain NUL")
    argv = list(argv)
    try:
        proc = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True,
                              timeout=timeout, env=sge_environment(env_extra), check=False)
    except FileNotFoundError as exc:
        raise SchedulerUnavailable(f"{argv[0]}: command not found (is the Grid Engine client "
                                   f"installed and on PATH?)") from exc
    except PermissionError as exc:
        # Also what a PATH search yields when some PATH entry is unreadable
        # and no entry has the command.
        raise SchedulerUnavailable(f"{argv[0]}: not found or not executable: {exc}") from exc
    except subprocess.TimeoutExpired as exc:
        raise SchedulerUnavailable(f"{' '.join(argv)}: no answer within {timeout:g} s") from exc
    if proc.returncode == 0:
        return proc.stdout
    stderr = proc.stderr.decode("utf-8", "replace").strip()
    stdout = proc.stdout.decode("utf-8", "replace").strip()
    message = stderr or stdout
    if _is_unreachable(stderr) or _is_unreachable(stdout):
        raise SchedulerUnavailable(f"{argv[0]}: cannot reach the qmaster: {message}")
    first_line = message.splitlines()[0] if message else "(no message)"
    raise SchedulerCommandError(f"{argv[0]} exited with status {proc.returncode}: {first_line}",
                                argv=argv, returncode=proc.returncode, stderr=message)


def qmod_cleared(message: str) -> bool:
    """Whether ``qmod -cj`` output says it cleared every error it was asked to (one line each)."""
    lines = [line for line in (message or "").splitlines() if line.strip()]
    return bool(lines) and all("cleared error state of" in line for line in lines)


def control_argv(action: str, job_number: int, task_numbers: Sequence[int] | None = None,
                 priority: int | None = None) -> list[str]:
    """The argv :meth:`GridEngine.control` runs. Raises InvalidSubmission."""
    if action not in CONTROL_COMMANDS:
        raise InvalidSubmission(f"unknown action {action!r}; use one of {', '.join(CONTROL_COMMANDS)}")
    ids = job_id_arguments(job_number, task_numbers)
    if action == "priority":
        if task_numbers is not None:
            raise InvalidSubmission("priority applies to a whole job, not to single tasks")
        if not is_int(priority) or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
            raise InvalidSubmission(f"priority {priority!r}: must be an integer from "
                                    f"{PRIORITY_MIN} to {PRIORITY_MAX}")
        return [*CONTROL_COMMANDS[action], str(priority), *ids]
    if priority is not None:
        raise InvalidSubmission(f"priority is only used with action 'priority', not {action!r}")
    return [*CONTROL_COMMANDS[action], *ids]
