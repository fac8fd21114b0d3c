"""Running Grid Engine's client commands: qstat, qhost, qquota, qconf, qmod, qdel, qhold, qrls, qalter,
and the advance-reservation commands qrsub, qrstat, qrdel.

Every status and control command goes through :func:`run_command`: an argv
list (never a shell string), a timeout, the cell's environment with
``TZ=UTC LC_ALL=C``, and typed errors (a qmaster that cannot be reached is
``SchedulerUnavailable``, a refusal ``SchedulerCommandError``).

Sources: qstat(1), qhold(1)/qrls(1)/qdel(1)/qalter(1)/qmod(1) of SGE 8.1.9
(OCS 9 keeps the options and messages used here).
"""
from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
from typing import Mapping, Sequence

from schedulers.base import (PRIORITY_MAX, PRIORITY_MIN, InvalidSubmission, SchedulerCommandError,
                             SchedulerUnavailable)

from .native_spec import ACCOUNT_RE, is_int, job_id_arguments

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


# ---- advance reservations: qrsub(1), qrdel(1)
#: An AR name (sge_types(5) "name"): a letter first, so never an option.
AR_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")
#: A user of ``-u``: an account name or ``@acl``; never a leading '-'.
AR_USER_RE = re.compile(r"^@?[A-Za-z_][A-Za-z0-9_.-]{0,31}$")
#: A parallel environment or queue name as tco accepts it (no leading '-').
AR_OBJECT_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$")
#: Longest reservation tco books (seconds): one week.
AR_MAX_DURATION_S = 7 * 24 * 3600
#: "Your advance reservation 12 has been granted" (qrsub, SGE 8.1.9 and OCS 9).
AR_GRANTED_RE = re.compile(rb"advance reservation (\d+) has been granted")


def reservation_submit_argv(spec, *, queues=frozenset(), resources=frozenset(),
                            now: "dt.datetime | None" = None) -> list[str]:
    """The ``qrsub`` argv for a :class:`schedulers.base.ReservationSpec`.

    ``-a`` is the start as ``CCYYMMDDhhmm.SS`` in UTC (qrsub reads it in its
    ``TZ``, which :func:`run_command` sets to UTC), ``-d`` the duration as
    ``HH:MM:SS`` (sge_types(5) "time"). ``queues``/``resources``: allow-lists
    (empty: any name of the right shape). ``now`` (aware UTC, default the
    clock) rejects a start more than a minute in the past. Raises
    InvalidSubmission; nothing of the spec reaches an argument unchecked.
    """
    def bad(message: str):
        raise InvalidSubmission(message)

    if not isinstance(spec.name, str) or not AR_NAME_RE.match(spec.name):
        bad(f"reservation name {spec.name!r}: a letter, then letters, digits, '_', '.', '-' (at most 64)")
    if not isinstance(spec.start, dt.datetime) or spec.start.tzinfo is None:
        bad("reservation start must be a timezone-aware datetime")
    now = now or dt.datetime.now(dt.timezone.utc)
    if spec.start < now - dt.timedelta(seconds=60):
        bad(f"reservation start {spec.start.isoformat()} is in the past")
    if not is_int(spec.duration_s) or not 60 <= spec.duration_s <= AR_MAX_DURATION_S:
        bad(f"reservation duration {spec.duration_s!r}: whole seconds from 60 to {AR_MAX_DURATION_S}")
    if not isinstance(spec.queue, str) or not AR_OBJECT_RE.match(spec.queue) or (queues and spec.queue not in queues):
        bad(f"queue {spec.queue!r} is not one tco may reserve ({', '.join(sorted(queues)) or 'none'})")
    if not is_int(spec.slots) or not 1 <= spec.slots <= 10_000:
        bad(f"slots {spec.slots!r}: a whole number from 1")
    if spec.pe is not None and (not isinstance(spec.pe, str) or not AR_OBJECT_RE.match(spec.pe)):
        bad(f"parallel environment {spec.pe!r}: not a valid name")
    if spec.slots > 1 and not spec.pe:
        bad("more than one slot needs a parallel environment (-pe)")
    if not is_int(spec.seats) or not 0 <= spec.seats <= 100_000:
        bad(f"seats {spec.seats!r}: a whole number from 0")
    if spec.seats and (not AR_OBJECT_RE.match(spec.seat_resource or "")
                       or (resources and spec.seat_resource not in resources)):
        bad(f"consumable {spec.seat_resource!r} is not one tco may reserve")
    users = list(spec.users or [])
    if any(not isinstance(u, str) or not AR_USER_RE.match(u) for u in users):
        bad(f"users {users!r}: account names or @access_list names")
    if not isinstance(spec.account, str) or not ACCOUNT_RE.match(spec.account):
        bad(f"account {spec.account!r}: letters, digits, '_', '.', '-', not starting with '-'")
    start = spec.start.astimezone(dt.timezone.utc)
    hours, rest = divmod(int(spec.duration_s), 3600)
    argv = ["qrsub", "-a", start.strftime("%Y%m%d%H%M.%S"), "-d", f"{hours:02d}:{rest // 60:02d}:{rest % 60:02d}",
            "-N", spec.name, "-A", spec.account, "-q", spec.queue]
    if spec.pe:
        argv += ["-pe", spec.pe, str(spec.slots)]
    if spec.seats:
        argv += ["-l", f"{spec.seat_resource}={spec.seats}"]
    if users:
        argv += ["-u", ",".join(users)]
    return argv


def reservation_id_from(output: bytes) -> int:
    """The id in qrsub's answer ("Your advance reservation 12 has been granted").

    Raises SchedulerCommandError when the answer does not name one.
    """
    match = AR_GRANTED_RE.search(output or b"")
    if not match:
        text = (output or b"").decode("utf-8", "replace").strip()
        raise SchedulerCommandError(f"qrsub: no reservation id in its answer: {text[:200]!r}", stderr=text)
    return int(match.group(1))


def reservation_id_argument(reservation_id: object) -> str:
    """``reservation_id`` as qrdel/qrstat's argument. Raises InvalidSubmission unless a positive int."""
    if not is_int(reservation_id) or not 0 < reservation_id <= 9_999_999:
        raise InvalidSubmission(f"reservation id {reservation_id!r}: a whole number from 1 to 9999999 (qrsub(1))")
    return str(reservation_id)
