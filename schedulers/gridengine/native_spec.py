"""The native specification: qsub options built only from validated ``ArrayJobSpec`` fields.

User input never reaches a shell or the options string unchecked: every
field is matched against an allow-list or a strict pattern first
(:func:`validate_spec`), and :func:`native_specification` only joins
validated values. Also the job id arguments of the control commands and
the job name of a campaign (:func:`sanitize_name`).

Sources: submit(1) (qsub options, ``-N`` name rules, ``-o [host]:path``),
sge_types(1) (``name``), qdel(1) (``wc_job_range_list``),
drmaa_attributes(3), drmaa_jobtemplate(3).
"""
from __future__ import annotations

import re
from typing import Iterable, Mapping, Sequence

from schedulers.base import PRIORITY_MAX, PRIORITY_MIN, ArrayJobSpec, InvalidSubmission

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



def is_int(value: object) -> bool:
    """Whether ``value`` is an integer (never a bool)."""
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

    if not is_int(spec.count) or not 1 <= spec.count <= max_tasks:
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
        if is_int(value):
            if value < 0:
                raise bad(f"resource {name}={value}: must not be negative")
        elif not isinstance(value, str) or not RESOURCE_VALUE_RE.match(value):
            raise bad(f"resource {name}={value!r}: use an integer or letters, digits, '_' and '.'")

    if not is_int(spec.priority) or not PRIORITY_MIN <= spec.priority <= PRIORITY_MAX:
        raise bad(f"priority {spec.priority!r}: must be an integer from {PRIORITY_MIN} to {PRIORITY_MAX}")
    for label, value in (("concurrency cap (-tc)", spec.concurrency_cap),
                         ("predecessor job (-hold_jid_ad)", spec.hold_jid_ad),
                         ("advance reservation (-ar)", spec.advance_reservation)):
        if value is not None and (not is_int(value) or not 1 <= value <= 2**31 - 1):
            raise bad(f"{label} {value!r}: must be a positive integer")
    if not isinstance(spec.hold, bool):
        raise bad("hold must be True or False")
    if not isinstance(spec.rerunnable, bool):
        raise bad("rerunnable must be True or False")

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
    ``-hold_jid_ad``, ``-ar``, ``-r y`` (``spec.rerunnable``) built from validated fields, and ``-notify``
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
    if spec.rerunnable:
        parts += ["-r", "y"]
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
    if not is_int(job_number) or job_number < 1:
        raise InvalidSubmission(f"job number {job_number!r}: must be a positive integer")
    if task_numbers is None:
        return [str(job_number)]
    tasks = list(task_numbers)
    if not tasks:
        raise InvalidSubmission("task_numbers is empty; pass None for the whole job")
    for t in tasks:
        if not is_int(t) or t < 1:
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
