"""Grid Engine adapter (Son of Grid Engine 8.1.9, Open/Gridware Cluster Scheduler 9.x).

Every status and control command goes through :func:`run_command` (an argv
list, never a shell string, with a timeout, ``TZ=UTC LC_ALL=C`` and typed
errors). Submission goes through DRMAA (:mod:`schedulers.drmaa_session`), with a
native specification built only from validated :class:`ArrayJobSpec` fields.

Parsing lives in ``schedulers.qstat_xml``; it is imported lazily so this
module (and :func:`native_specification`) works without it.

Sources: submit(1) (qsub options, ``-N`` name rules, ``-o [host]:path``),
qstat(1), qhold(1)/qrls(1)/qdel(1)/qalter(1)/qmod(1) (``wc_job_range_list``),
sge_types(1) (``name``), drmaa_attributes(3), drmaa_jobtemplate(3).
"""
from __future__ import annotations

import os
import re
import subprocess
from typing import Iterable, Mapping, Sequence

from schedulers.base import (
    ArrayJobSpec,
    QstatTask,
    SchedulerCommandError,
    SchedulerParseError,
    SchedulerUnavailable,
)

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

#: Queue, project, resource (complex) names: the subset of sge_types(1)
#: ``name`` that also survives the native specification's whitespace split.
NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")
#: A resource request value that is not an integer (``true``, ``4G``, ``1.5``).
RESOURCE_VALUE_RE = re.compile(r"^[A-Za-z0-9_.]+$")
#: Account string (``-A``): written raw into the colon-separated accounting file.
ACCOUNT_RE = re.compile(r"^[A-Za-z0-9_.][A-Za-z0-9_.-]{0,63}$")  # no leading '-': not an option
#: Job name (``-N``). sge_types(1) forbids ``\n \t \r / : @ \ * ?``; a space made
#: qsub fail ("Error reading answer list from qmaster"); the name is also
#: written raw into the colon-separated accounting file. We allow a safe subset.
JOB_NAME_RE = re.compile(r"^[A-Za-z0-9_.+=-]+$")
JOB_NAME_MAX = 64
#: Environment variable names passed with ``jobEnvironment`` (``-v``).
ENV_KEY_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Paths (command, working directory, output/error). ``$`` admits DRMAA and SGE
#: placeholders (``$drmaa_incr_ph$``, ``$TASK_ID``); ``:`` and ``,`` are
#: separators in ``-o [host:]path[,...]``, so they are not allowed.
PATH_RE = re.compile(r"^/[A-Za-z0-9_.+=@%/$-]*$")

PRIORITY_MIN, PRIORITY_MAX = -1023, 1024
DEFAULT_MAX_TASKS = 75_000  # SGE's default max_aj_tasks
ENV_VALUE_MAX = 4096

# Variables Grid Engine sets in every job, or that change how a process loads
# code. A spec may not override them: the runner trusts JOB_ID/SGE_TASK_ID
# to name its record.
_RESERVED_ENV_PREFIXES = ("SGE_", "LD_")
_RESERVED_ENV_KEYS = frozenset({
    "JOB_ID", "JOB_NAME", "JOB_SCRIPT", "TASK_ID", "QUEUE", "REQUEST", "NHOSTS", "NQUEUES",
    "NSLOTS", "PE", "PE_HOSTFILE", "RESTARTED", "ENVIRONMENT", "HOME", "USER", "LOGNAME",
    "SHELL", "TMPDIR", "TMP", "ARC", "HOSTNAME",
})

CONTROL_COMMANDS = {
    "hold": ["qhold"],
    "release": ["qrls"],
    "delete": ["qdel"],
    "priority": ["qalter", "-p"],
    "clear_error": ["qmod", "-cj"],
}


class InvalidSubmission(ValueError):
    """A submission or control request was refused before anything reached the scheduler."""


# --------------------------------------------------------------------------- commands

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


# --------------------------------------------------------------------------- validation

def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def sanitize_name(text: str, *, max_length: int = JOB_NAME_MAX, fallback: str = "tco") -> str:
    """Turn free text (a campaign title) into a valid job name.

    Characters outside ``[A-Za-z0-9_.+=-]`` become ``_``; the result is cut to
    ``max_length``; a name not starting with a letter or ``_`` gets a ``j``
    prefix (Grid Engine refuses a leading digit). Returns ``fallback`` for
    empty text.
    """
    cleaned = re.sub(r"[^A-Za-z0-9_.+=-]", "_", text or "").strip("_")
    if not cleaned:
        cleaned = fallback
    if not (cleaned[0].isalpha() or cleaned[0] == "_"):
        cleaned = "j" + cleaned
    return cleaned[:max_length]


def validate_spec(spec: ArrayJobSpec, *, queues: Iterable[str], projects: Iterable[str],
                  resources: Iterable[str], max_tasks: int = DEFAULT_MAX_TASKS) -> None:
    """Check every field of ``spec``; raise :class:`InvalidSubmission` on the first bad one.

    Rules (submit(1), sge_types(1), drmaa_attributes(3)): queue, project and
    resource names match :data:`NAME_RE` and are in the allow-lists; resource
    values are non-negative ints or match :data:`RESOURCE_VALUE_RE`; ``count``
    is 1..``max_tasks``; ``priority`` is -1023..1024; ``concurrency_cap``,
    ``hold_jid_ad`` and ``advance_reservation`` are positive ints; the job
    name matches :data:`JOB_NAME_RE`, starts with a letter or ``_`` and is at
    most :data:`JOB_NAME_MAX` long; the account matches :data:`ACCOUNT_RE`;
    environment keys match :data:`ENV_KEY_RE` and are not reserved, values
    hold no control characters and no ``,``; command and paths are absolute
    and match :data:`PATH_RE`; args hold no NUL or newline.
    """
    def bad(message: str) -> InvalidSubmission:
        return InvalidSubmission(message)

    queues, projects, resources = set(queues), set(projects), set(resources)

    if not isinstance(spec.name, str) or not JOB_NAME_RE.match(spec.name):
        raise bad(f"job name {spec.name!r}: use only letters, digits and _ . + = - "
                  "(no spaces, ':', '/', '@', '\\', '*', '?')")
    if len(spec.name) > JOB_NAME_MAX:
        raise bad(f"job name is {len(spec.name)} characters long; at most {JOB_NAME_MAX}")
    if spec.name[0].isdigit():
        # qsub: '"9abc" is not a valid object name (cannot start with a digit)'
        raise bad(f"job name {spec.name!r} starts with a digit; Grid Engine refuses it")
    if not (spec.name[0].isalpha() or spec.name[0] == "_"):
        raise bad(f"job name {spec.name!r} must start with a letter or '_'")

    if not _is_int(spec.count) or not 1 <= spec.count <= max_tasks:
        raise bad(f"count {spec.count!r}: must be an integer from 1 to {max_tasks}")

    for label, value, allowed in (("queue", spec.queue, queues), ("project", spec.project, projects)):
        if not isinstance(value, str) or not NAME_RE.match(value):
            raise bad(f"{label} {value!r}: not a valid {label} name")
        if value not in allowed:
            raise bad(f"{label} {value!r} is not allowed here (allowed: {', '.join(sorted(allowed)) or 'none'})")

    if not isinstance(spec.resources, Mapping):
        raise bad("resources must be a mapping of resource name to value")
    for name, value in spec.resources.items():
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise bad(f"resource name {name!r} is not valid")
        if name not in resources:
            raise bad(f"resource {name!r} is not requestable here (allowed: {', '.join(sorted(resources)) or 'none'})")
        if _is_int(value):
            if value < 0:
                raise bad(f"resource {name}={value}: must not be negative")
        elif not isinstance(value, str) or not RESOURCE_VALUE_RE.match(value):
            raise bad(f"resource {name}={value!r}: use an integer or letters, digits, '_' and '.'")

    if not _is_int(spec.priority) or not PRIORITY_MIN <= spec.priority <= PRIORITY_MAX:
        raise bad(f"priority {spec.priority!r}: must be an integer from {PRIORITY_MIN} to {PRIORITY_MAX}")
    for label, value in (("concurrency cap (-tc)", spec.concurrency_cap),
                         ("predecessor job (-hold_jid_ad)", spec.hold_jid_ad),
                         ("advance reservation (-ar)", spec.advance_reservation)):
        if value is not None and (not _is_int(value) or not 1 <= value <= 2**31 - 1):
            raise bad(f"{label} {value!r}: must be a positive integer")
    if not isinstance(spec.hold, bool):
        raise bad("hold must be True or False")

    if not isinstance(spec.account, str) or not ACCOUNT_RE.match(spec.account):
        raise bad(f"account {spec.account!r}: use 1 to 64 letters, digits, '_', '.', '-' "
                  "(not starting with '-')")

    if not isinstance(spec.environment, Mapping):
        raise bad("environment must be a mapping")
    for key, value in spec.environment.items():
        if not isinstance(key, str) or not ENV_KEY_RE.match(key):
            raise bad(f"environment variable name {key!r} is not valid")
        if key in _RESERVED_ENV_KEYS or key.startswith(_RESERVED_ENV_PREFIXES):
            raise bad(f"environment variable {key} is set by Grid Engine or the loader; it may not be overridden")
        if not isinstance(value, str):
            raise bad(f"environment variable {key}: value must be a string")
        if "," in value:
            raise bad(f"environment variable {key}: value may not contain ',' (qsub -v splits on commas)")
        if any(ord(ch) < 0x20 or ord(ch) == 0x7F for ch in value):
            raise bad(f"environment variable {key}: value may not contain newlines or control characters")
        if len(value) > ENV_VALUE_MAX:
            raise bad(f"environment variable {key}: value longer than {ENV_VALUE_MAX} characters")

    for label, value in (("command", spec.command), ("working directory", spec.working_directory),
                         ("output path", spec.output_path), ("error path", spec.error_path)):
        if not isinstance(value, str) or not PATH_RE.match(value):
            raise bad(f"{label} {value!r}: must be an absolute path of letters, digits and _ . + = @ % / $ -")
    if "$" in spec.command or "$" in spec.working_directory:
        raise bad("command and working directory may not contain '$'")

    if not isinstance(spec.args, (list, tuple)):
        raise bad("args must be a list of strings")
    for arg in spec.args:
        if not isinstance(arg, str) or any(ch in arg for ch in "\0\n\r"):
            raise bad(f"argument {arg!r}: must be a string without NUL or newlines")


def native_specification(spec: ArrayJobSpec, *, queues: Iterable[str], projects: Iterable[str],
                         resources: Iterable[str], max_tasks: int = DEFAULT_MAX_TASKS,
                         notify: bool = False) -> str:
    """The qsub options string for ``spec`` (validated first).

    Contains only ``-q``, ``-P``, ``-l``, ``-p``, ``-A``, ``-tc``,
    ``-hold_jid_ad``, ``-ar`` built from validated fields, and ``-notify``
    when ``notify`` is true (see :class:`GridEngine`). Job name, paths,
    environment and hold go through DRMAA attributes instead (drmaa_attributes(3)).
    ``-t`` is never used: in a native specification it does not make an
    array; :meth:`GridEngine.submit_array` uses ``runBulkJobs``.
    libdrmaa's own defaults stay (``-w e``: an unschedulable request is
    refused at submit).

    Raises InvalidSubmission.
    """
    validate_spec(spec, queues=queues, projects=projects, resources=resources, max_tasks=max_tasks)
    parts = ["-q", spec.queue, "-P", spec.project]
    if spec.resources:
        parts += ["-l", ",".join(f"{name}={value}" for name, value in sorted(spec.resources.items()))]
    parts += ["-p", str(spec.priority), "-A", spec.account]
    if spec.concurrency_cap is not None:
        parts += ["-tc", str(spec.concurrency_cap)]
    if spec.hold_jid_ad is not None:
        parts += ["-hold_jid_ad", str(spec.hold_jid_ad)]
    if spec.advance_reservation is not None:
        parts += ["-ar", str(spec.advance_reservation)]
    if notify:
        parts.append("-notify")
    return " ".join(parts)


def job_id_arguments(job_number: int, task_numbers: Sequence[int] | None = None) -> list[str]:
    """Job ids for qhold/qrls/qdel/qalter/qmod, one argv element per task range.

    ``job_id_arguments(7)`` → ``["7"]``; ``job_id_arguments(7, [1, 2, 3, 5])``
    → ``["7.1-3", "7.5"]``. Ranges are separate arguments, never
    ``7.1-3,5``: in a ``wc_job_range_list`` a comma separates *jobs*, so
    ``7.1-3,5`` means "tasks 1-3 of job 7, and job 5" (qdel(1)).

    Raises InvalidSubmission for anything but positive ints.
    """
    if not _is_int(job_number) or job_number < 1:
        raise InvalidSubmission(f"job number {job_number!r}: must be a positive integer")
    if task_numbers is None:
        return [str(job_number)]
    tasks = list(task_numbers)
    if not tasks:
        raise InvalidSubmission("task_numbers is empty; pass None for the whole job")
    for t in tasks:
        if not _is_int(t) or t < 1:
            raise InvalidSubmission(f"task number {t!r}: must be a positive integer")
    tasks = sorted(set(tasks))
    ids, start, prev = [], tasks[0], tasks[0]
    for t in tasks[1:] + [None]:
        if t is not None and t == prev + 1:
            prev = t
            continue
        ids.append(f"{job_number}.{start}" if start == prev else f"{job_number}.{start}-{prev}")
        if t is not None:
            start = prev = t
    return ids


def parse_job_ids(ids: Sequence[str]) -> tuple[int, list[int]]:
    """``["123.1", "123.2"]`` → ``(123, [1, 2])``, as ``runBulkJobs`` returns them.

    Raises SchedulerParseError on an empty list, a malformed id or mixed job numbers.
    """
    if not ids:
        raise SchedulerParseError("DRMAA returned no job ids")
    job_numbers, tasks = set(), []
    for job_id in ids:
        m = re.fullmatch(r"(\d+)(?:\.(\d+))?", str(job_id).strip())
        if not m:
            raise SchedulerParseError(f"DRMAA returned a job id we cannot read: {job_id!r}")
        job_numbers.add(int(m.group(1)))
        tasks.append(int(m.group(2)) if m.group(2) else 1)
    if len(job_numbers) != 1:
        raise SchedulerParseError(f"DRMAA returned ids of several jobs: {sorted(job_numbers)}")
    return job_numbers.pop(), tasks


# --------------------------------------------------------------------------- adapter

# (sge_root, sge_cell) -> {job_number: project or None}, filled from qstat -ext.
_PROJECTS: dict[tuple[str, str], dict[int, str | None]] = {}


class GridEngine:
    """SchedulerAdapter for one Grid Engine cell.

    ``queues``, ``projects`` and ``resources`` are the allow-lists a
    submission is checked against (names of cluster queues, projects and
    requestable complexes). ``sge_root``/``sge_cell`` select the cell for
    commands; DRMAA uses the process environment (one session per process,
    so one cell per submitting process). ``timeout`` is seconds per command.

    ``notify`` adds ``-notify`` to every submission. Without it, qdel kills a
    task with SIGKILL (queue ``terminate_method NONE``), which the runner
    cannot catch: the task leaves no runner record, only accounting
    (``failed`` 100, exit 137). With it, Grid Engine first sends the
    notification signal (SIGUSR2, or ``execd_params NOTIFY_KILL=TERM``) and
    waits the queue's ``notify`` time, so the runner writes its record. But
    ``-notify`` also sends SIGUSR1 before a suspension, which ends the runner
    and the agent unless the cluster sets ``execd_params NOTIFY_SUSP=none``:
    enable it only on such a cluster.
    """

    def __init__(self, *, queues: Iterable[str] = (), projects: Iterable[str] = (),
                 resources: Iterable[str] = (), sge_root: str | None = None,
                 sge_cell: str | None = None, timeout: float = 10.0,
                 max_tasks: int = DEFAULT_MAX_TASKS, notify: bool = False) -> None:
        self.queues = frozenset(queues)
        self.projects = frozenset(projects)
        self.resources = frozenset(resources)
        self.sge_root = sge_root or os.environ.get("SGE_ROOT") or DEFAULT_SGE_ROOT
        self.sge_cell = sge_cell or os.environ.get("SGE_CELL") or DEFAULT_SGE_CELL
        self.timeout = timeout
        self.max_tasks = max_tasks
        self.notify = notify

    # ---- commands
    def _run(self, argv: list[str], timeout: float | None = None) -> bytes:
        return run_command(argv, timeout=timeout or self.timeout,
                           env_extra={"SGE_ROOT": self.sge_root, "SGE_CELL": self.sge_cell})

    def list_tasks(self) -> list[QstatTask]:
        """Every job's tasks, all users: ``qstat -xml -u '*'`` (qstat(1)).

        Raises SchedulerUnavailable, SchedulerCommandError, SchedulerParseError.
        """
        from schedulers.qstat_xml import parse_qstat
        tasks = parse_qstat(self._run(["qstat", "-xml", "-u", "*"]))
        self._fill_projects(tasks)
        return tasks

    def _fill_projects(self, tasks: list[QstatTask]) -> None:
        """Set each task's project, which plain ``qstat -xml`` leaves out.

        ``-ext`` prints ``JB_project`` but drops the start and submission
        times (seen on SGE 8.1.9), so the poll reads the plain listing and asks
        ``qstat -xml -ext`` only when a job it has not seen yet appears; a
        job's project never changes while it is queued, so it is remembered.
        """
        from schedulers.qstat_xml import parse_qstat

        cell = (self.sge_root, self.sge_cell)
        known = _PROJECTS.setdefault(cell, {})
        if any(t.project is None and t.job_number not in known for t in tasks):
            for t in parse_qstat(self._run(["qstat", "-xml", "-ext", "-u", "*"])):
                known[t.job_number] = t.project
            if len(known) > 200_000:  # jobs long gone; the next poll asks again
                live = {t.job_number for t in tasks}
                for job in [j for j in known if j not in live]:
                    del known[job]
        for t in tasks:
            if t.project is None:
                t.project = known.get(t.job_number)

    def queue_summary(self):
        """Cluster queue summary, ``qstat -g c -xml``, parsed by ``parse_cluster_queue_summary``."""
        from schedulers.qstat_xml import parse_cluster_queue_summary
        return parse_cluster_queue_summary(self._run(["qstat", "-g", "c", "-xml"]))

    def hosts(self):
        """Exec hosts with resources, ``qhost -F -xml``, parsed by ``parse_qhost``."""
        from schedulers.qstat_xml import parse_qhost
        return parse_qhost(self._run(["qhost", "-F", "-xml"]))

    def quotas(self):
        """Resource quota usage, ``qquota -u '*' -xml``, parsed by ``parse_qquota``."""
        from schedulers.qstat_xml import parse_qquota
        return parse_qquota(self._run(["qquota", "-u", "*", "-xml"]))

    def global_capacity(self) -> dict[str, float]:
        """Cluster-wide consumable capacities: ``complex_values`` of the global host.

        ``qconf -se global`` (sge_host_conf(5)) prints ``complex_values
        anthropic_api=96,licence=4`` (``NONE`` when empty; long lists continue
        on lines ending with ``\\``). Returns ``{"anthropic_api": 96.0}``;
        values that are not numbers (string complexes) are left out.
        """
        return parse_complex_values(self._run(["qconf", "-se", "global"]))

    def share_tree(self) -> list[dict]:
        """Share-tree usage per node, ``sge_share_mon -c 1 -n``, parsed by ``sharetree.parse_share_mon``.

        sge_share_mon lives in ``$SGE_ROOT/utilbin/<arch>`` (Debian: also
        ``/usr/lib/gridengine``), not on PATH. Raises SchedulerUnavailable when
        it is missing or the qmaster does not answer.
        """
        from schedulers.sharetree import parse_share_mon
        candidates = [os.path.join(self.sge_root, "utilbin", "lx-amd64", "sge_share_mon"),
                      "/usr/lib/gridengine/sge_share_mon"]
        binary = next((c for c in candidates if os.access(c, os.X_OK)), candidates[-1])
        return parse_share_mon(self._run([binary, "-c", "1", "-n"]))

    def job_detail(self, job_number: int):
        """One job, ``qstat -j N -xml``, parsed by ``parse_job_detail``.

        Raises InvalidSubmission for a bad job number; SchedulerCommandError
        when the job does not exist (qstat exits 1).
        """
        from schedulers.qstat_xml import parse_job_detail
        (job_id,) = job_id_arguments(job_number)
        return parse_job_detail(self._run(["qstat", "-j", job_id, "-xml"]))

    def control(self, action: str, job_number: int, task_numbers: Sequence[int] | None = None,
                priority: int | None = None) -> None:
        """Act on a job or some of its tasks.

        ``hold`` → qhold, ``release`` → qrls, ``delete`` → qdel,
        ``priority`` → ``qalter -p N`` (whole job only; -1023..1024),
        ``clear_error`` → ``qmod -cj``. Raises InvalidSubmission for a bad
        action or argument (nothing is run), SchedulerCommandError when
        refused, SchedulerUnavailable.
        """
        argv = control_argv(action, job_number, task_numbers, priority)
        try:
            self._run(argv)
        except SchedulerCommandError as exc:
            # SGE 8.1.9's qmod exits 1 even when it did clear the error state (seen on the
            # dev cluster: "tco@vm cleared error state of job 297", status 1).
            if action == "clear_error" and qmod_cleared(exc.stderr):
                return
            raise

    # ---- submission
    def native_specification(self, spec: ArrayJobSpec) -> str:
        """The native specification for ``spec`` under this adapter's allow-lists.

        Raises InvalidSubmission.
        """
        return native_specification(spec, queues=self.queues, projects=self.projects,
                                    resources=self.resources, max_tasks=self.max_tasks,
                                    notify=self.notify)

    def submit_array(self, spec: ArrayJobSpec) -> tuple[int, list[int]]:
        """Submit ``spec`` as one array job of tasks 1..count via DRMAA ``runBulkJobs``.

        Returns ``(job_number, task_numbers)``. Everything is validated before
        the DRMAA session is touched. Raises InvalidSubmission (nothing
        submitted), SchedulerCommandError (refused, e.g. by ``-w e``),
        SchedulerUnavailable (libdrmaa not loadable, qmaster unreachable).
        """
        native = self.native_specification(spec)
        from schedulers import drmaa_session

        environment = dict(spec.environment)
        return drmaa_session.run_bulk(
            remote_command=spec.command,
            args=list(spec.args),
            job_name=spec.name,
            native_specification=native,
            environment=environment,
            working_directory=spec.working_directory,
            output_path=":" + spec.output_path,
            error_path=":" + spec.error_path,
            hold=spec.hold,
            count=spec.count,
            sge_root=self.sge_root,
            sge_cell=self.sge_cell,
        )


def parse_complex_values(output: bytes) -> dict[str, float]:
    """The numeric ``complex_values`` of a ``qconf -se HOST`` answer (sge_host_conf(5))."""
    text = output.decode("utf-8", errors="replace").replace("\\\n", "")
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key != "complex_values":
            continue
        values: dict[str, float] = {}
        for item in value.strip().split(","):
            name, eq, amount = item.strip().partition("=")
            if not eq:
                continue
            try:
                values[name] = float(amount)
            except ValueError:
                continue
        return values
    raise SchedulerParseError("qconf -se: no complex_values line")


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
        if not _is_int(priority) or not PRIORITY_MIN <= priority <= PRIORITY_MAX:
            raise InvalidSubmission(f"priority {priority!r}: must be an integer from "
                                    f"{PRIORITY_MIN} to {PRIORITY_MAX}")
        return [*CONTROL_COMMANDS[action], str(priority), *ids]
    if priority is not None:
        raise InvalidSubmission(f"priority is only used with action 'priority', not {action!r}")
    return [*CONTROL_COMMANDS[action], *ids]
