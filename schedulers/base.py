"""The scheduler adapter interface shared by every backend and by the fake.

Every backend (Grid Engine today; others behind the same names later) turns
scheduler output into the plain records below. Django code never sees XML or
accounting lines, only these records.

Lifecycle words follow DESIGN.md ("Lifecycle of a task"): the scheduler states
``pending, held, starting, running, suspended, deleting, error, unknown`` come
from qstat state letters; ``finishing, done, failed, deleted, lost`` are
decided by tco from observation gaps and accounting.
"""
from __future__ import annotations

import abc
import dataclasses
import datetime as dt
from typing import Any, ClassVar, Sequence


class SchedulerError(Exception):
    """Base class of every error a scheduler adapter raises."""


class SchedulerUnavailable(SchedulerError):
    """The scheduler could not be asked: command missing, timed out, qmaster down.

    Transient: a poll that raises this is retried and is never read as an
    empty queue.
    """


class SchedulerParseError(SchedulerError):
    """The scheduler answered, but its output is not in a shape we know."""


class UnknownJob(SchedulerError):
    """``qstat -j ID -xml`` says the job does not exist (any more).

    Grid Engine answers an unknown id with ``<unknown_jobs><><ST_name>ID</ST_name></></unknown_jobs>``,
    which is not even well-formed XML. ``job_ids`` holds the ids it named.
    """

    def __init__(self, message: str, *, job_ids: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.job_ids = list(job_ids)


class AccountingLineError(SchedulerParseError):
    """One accounting line is not a record we can trust (wrong field count,
    a non-integer job number, a time that is not an epoch value, bad JSON).

    The line is quarantined with ``reason``, never ingested with shifted values.
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class AccountingMissing(SchedulerError):
    """The accounting file the adapter was told to read does not exist (or is not readable).

    Never read as "no job has finished": on Grid Engine the file exists as
    soon as the qmaster has written one record, and a wrong path (an OCS 9
    cell writes ``common/accounting.jsonl``, not ``common/accounting``)
    would otherwise ingest nothing, silently. ``path`` is the path tried.
    """

    def __init__(self, message: str, *, path: str = "") -> None:
        super().__init__(message)
        self.path = path


class InvalidSubmission(ValueError):
    """A submission or control request was refused before anything reached the scheduler."""


class SchedulerCommandError(SchedulerError):
    """The scheduler refused a request (qsub/qalter/qdel exit status not 0).

    ``stderr`` holds the command's message for the user.
    """

    def __init__(self, message: str, *, argv: Sequence[str] = (), returncode: int | None = None,
                 stderr: str = "") -> None:
        super().__init__(message)
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr


#: qsub/qalter ``-p`` range (submit(1): "-1023 to 1024"; only operators and
#: managers may go above 0). The same in SGE 8.1.9 and OCS 9.
PRIORITY_MIN, PRIORITY_MAX = -1023, 1024
#: The control actions :meth:`SchedulerAdapter.control` knows.
CONTROL_ACTIONS = ("hold", "release", "delete", "priority", "clear_error")

SCHEDULER_STATES = ("pending", "held", "starting", "running", "suspended", "deleting", "error", "unknown")
TCO_STATES = ("finishing", "done", "failed", "deleted", "lost")
LIFECYCLE_STATES = SCHEDULER_STATES + TCO_STATES
ACTIVE_STATES = frozenset(SCHEDULER_STATES) | {"finishing"}
TERMINAL_STATES = frozenset({"done", "failed", "deleted", "lost"})


@dataclasses.dataclass(slots=True)
class QstatTask:
    """One task as ``qstat -xml -u '*'`` shows it (pending ranges expanded).

    ``task_number`` is None for a non-array job. ``state`` is the lifecycle
    word, ``state_code`` the raw letters (``Eqw``). ``queue`` is the cluster
    queue (``agent.q``) and ``host`` the exec host, both None while pending.
    Times are timezone-aware UTC datetimes. ``priority`` is ``JAT_prio``.
    """

    job_number: int
    task_number: int | None
    name: str
    owner: str
    project: str | None
    state: str
    state_code: str
    restarted: bool
    queue: str | None
    host: str | None
    slots: int
    submitted_at: dt.datetime | None
    started_at: dt.datetime | None
    priority: float

    @property
    def key(self) -> tuple[int, int]:
        """(job_number, task_number or 0): the identity of an active task."""
        return (self.job_number, self.task_number or 0)


@dataclasses.dataclass(slots=True)
class AccountingRecord:
    """One accounting record (SGE 8 colon line or OCS 9 JSON line).

    Times are timezone-aware UTC datetimes, or None where the file says 0
    (a failed start). ``task_number`` is None for a non-array job (the file
    says 0). ``wallclock_s`` is seconds as ``qacct`` sums them (``ru_wallclock``;
    whole seconds in OCS 9 JSON); ``wallclock_exact_s`` see below.
    ``cpu_s`` seconds, ``maxvmem_bytes`` bytes. ``usage`` holds
    flexible-accounting objects as written (OCS 9 JSON only), else ``{}``.
    Source: accounting(5) of SGE 8.1.9; sge_accounting(5) of OCS 9.
    """

    job_number: int
    task_number: int | None
    pe_taskid: str | None
    job_name: str
    owner: str
    group: str
    project: str | None
    department: str | None
    account: str
    queue: str
    hostname: str
    slots: int
    submitted_at: dt.datetime | None
    started_at: dt.datetime | None
    ended_at: dt.datetime | None
    wallclock_s: float
    cpu_s: float
    maxvmem_bytes: float
    failed: int
    exit_status: int
    category: str
    usage: dict
    # Additions (defaults keep older constructors valid). ``granted_pe`` None
    # where the file says NONE or omits it; ``arid`` 0 without an advance
    # reservation (and for 43-field lines, which predate ARs);
    # ``deleted_by`` is OCS 9.1.2+ JSON only (``user@host``).
    granted_pe: str | None = None
    arid: int = 0
    ar_submitted_at: dt.datetime | None = None
    deleted_by: str | None = None
    # OCS 9 JSON only: the exact wall clock, ``usage.eusage.wallclock`` (else
    # end - start), seconds; ``wallclock_s`` keeps ``usage.rusage.ru_wallclock``,
    # whole seconds, which is what ``qacct`` sums and the bill uses. None on SGE 8.
    wallclock_exact_s: float | None = None

    def identity(self, cluster: str) -> tuple:
        """DESIGN.md's record identity: (cluster, job_number, task_number, pe_taskid,
        submission_time, start_time, end_time)."""
        return (cluster, self.job_number, self.task_number or 0, self.pe_taskid or "",
                self.submitted_at, self.started_at, self.ended_at)


@dataclasses.dataclass(slots=True)
class TaskDiff:
    """What changed between two polls of ``qstat`` (see :func:`diff_tasks`).

    ``added`` and ``changed`` hold the current tasks, ``gone`` the previous
    ones no longer listed. ``current`` maps ``QstatTask.key`` to every current
    task, ready to be the ``previous`` of the next poll.
    """

    added: list[QstatTask]
    changed: list[QstatTask]
    gone: list[QstatTask]
    current: dict[tuple[int, int], QstatTask]


def diff_tasks(previous: dict[tuple[int, int], QstatTask], current: list[QstatTask]) -> TaskDiff:
    """Compare two polls. ``previous`` maps ``QstatTask.key`` to the last poll's
    task (``TaskDiff.current`` of the last call).

    ``added``: keys not in ``previous``; ``changed``: keys in both whose
    state_code, queue, host, slots, started_at or priority differ (current
    objects); ``gone``: previous tasks not listed now.
    """
    now: dict[tuple[int, int], QstatTask] = {}
    added: list[QstatTask] = []
    changed: list[QstatTask] = []
    get_previous = previous.get
    for task in current:
        key = (task.job_number, task.task_number or 0)
        now[key] = task
        before = get_previous(key)
        if before is None:
            added.append(task)
        elif (before.state_code != task.state_code or before.queue != task.queue
              or before.host != task.host or before.slots != task.slots
              or before.started_at != task.started_at or before.priority != task.priority):
            changed.append(task)
    gone = [task for key, task in previous.items() if key not in now]
    return TaskDiff(added=added, changed=changed, gone=gone, current=now)


@dataclasses.dataclass(frozen=True, slots=True)
class AccountingCursor:
    """Checkpoint in the accounting file: its inode, the byte offset just
    after the last complete line consumed, and the fingerprint of the bytes
    before it (``schedulers.accounting_cursor.fingerprint``: ``"<n>:<sha256>"``
    of the first ``n`` bytes; empty when not known), which tells a file
    truncated and regrown past the offset from the same file grown."""

    inode: int
    offset: int
    fingerprint: str = ""


@dataclasses.dataclass(slots=True)
class QuarantinedLine:
    """A line that was not ingested: its byte offset in the file, the raw
    bytes (without the newline) and why."""

    offset: int
    raw: bytes
    reason: str


@dataclasses.dataclass(slots=True)
class AccountingBatch:
    """The result of one accounting pass (``SchedulerAdapter.accounting_since``).

    ``skipped`` counts header/comment lines and lines of one character or
    less. ``deferred_bytes`` is the length of a trailing line without a
    newline, left for the next pass. ``reset`` is ``'rotated'`` (inode
    changed) or ``'truncated'`` (file shorter than the cursor) when the
    pass restarted from offset 0, else None.
    """

    records: list[AccountingRecord]
    quarantined: list[QuarantinedLine]
    skipped: int
    deferred_bytes: int
    cursor: AccountingCursor
    reset: str | None = None


@dataclasses.dataclass(slots=True)
class ArrayJobSpec:
    """What one campaign submits: an array job of ``count`` tasks (1..count).

    Every field is validated before it gets here; the adapter builds the
    native specification from these fields only, never from free text.
    ``resources`` maps a requestable complex to its value (``{"anthropic_api": 1}``).
    ``environment`` is passed to every task (``TCO_CAMPAIGN_ID`` …).
    """

    name: str
    command: str
    args: list[str]
    count: int
    queue: str
    project: str
    resources: dict[str, str | int]
    environment: dict[str, str]
    working_directory: str
    output_path: str
    error_path: str
    account: str = "tco"
    priority: int = 0
    concurrency_cap: int | None = None
    hold_jid_ad: int | None = None
    advance_reservation: int | None = None
    hold: bool = False
    #: ``-r y``: the scheduler may rerun a task elsewhere when its host is lost (reschedule_unknown).
    rerunnable: bool = False


@dataclasses.dataclass(slots=True)
class ReservationSpec:
    """An advance reservation to book (``qrsub``, qrsub(1)).

    ``start`` is an aware datetime (sent in UTC, whole seconds), ``duration_s``
    seconds (at least 60). ``queue`` is a cluster queue of the adapter's
    allow-list. ``slots`` are job slots: 1 without a parallel environment,
    else ``pe`` (e.g. ``smp``) is required and ``slots`` are its slot count.
    ``seats`` is the consumable ``seat_resource`` (``anthropic_api``)
    reserved for the jobs in the reservation (0: none). ``name`` is the AR
    name (sge_types(5) "name": a letter first, then letters, digits, ``_ . -``;
    at most 64 characters). ``users`` are the accounts (or ``@acl``) allowed
    to submit into it (``-u``; empty: only the owner). ``account`` is ``-A``.
    """

    name: str
    start: dt.datetime
    duration_s: int
    queue: str
    slots: int = 1
    pe: str | None = None
    seats: int = 0
    seat_resource: str = "anthropic_api"
    users: list[str] = dataclasses.field(default_factory=list)
    account: str = "tco"


class SchedulerAdapter(abc.ABC):
    """Everything tco asks of a scheduler cell. Implemented by the Grid Engine
    adapter (:class:`schedulers.gridengine.adapter.GridEngine`) and by the fake
    (:class:`schedulers.fake.FakeScheduler`); chosen per cluster flavour through
    :mod:`schedulers.registry`.

    Every method that asks the scheduler raises ``SchedulerUnavailable`` when
    it cannot be asked (transient: retry, never read as an empty answer) and
    ``SchedulerParseError`` when the answer is not in a known shape. Dict
    shapes below are the parsers' (``schedulers/gridengine/parsers/``); they
    are JSON-ready except for datetimes.
    """

    #: The cluster flavour this adapter serves (``"sge8"``, ``"ocs9"``, ``"fake"``).
    flavour: ClassVar[str] = ""

    # ---- reading the queue
    @abc.abstractmethod
    def list_tasks(self) -> list[QstatTask]:
        """Every job's tasks, all users (``qstat -u '*'``), pending ranges expanded,
        each with its project. Ordered as the scheduler lists them."""

    @abc.abstractmethod
    def job_detail(self, job_number: int, *, timeout: float | None = None) -> dict[str, Any]:
        """One job as ``qstat -j N`` shows it.

        Shape (``parsers.qstat_j.parse_job_detail``): ``{"job_number", "name",
        "owner", "project", "submitted_at" (aware UTC or None), "hard_resources"
        {name: value}, "tasks" [{"task_number", "state", …}], "holds", "predecessors",
        "scheduler_messages" [str], "global_messages" [str], "context"}``.
        ``timeout`` (seconds) bounds this one call (a web request passes a
        short one); None uses the adapter's default.
        Raises UnknownJob (the scheduler does not know the job),
        InvalidSubmission (``job_number`` not a positive int).
        """

    @abc.abstractmethod
    def queue_summary(self) -> list[dict[str, Any]]:
        """Cluster queues (``qstat -g c``): ``[{"name", "load" (float|None), "used",
        "resv", "available", "total", "temp_disabled", "manual_intervention"}]`` (slots, ints)."""

    @abc.abstractmethod
    def hosts(self) -> list[dict[str, Any]]:
        """Exec hosts with their resources (``qhost -F``): ``[{"name", "arch",
        "num_proc", "load_avg", "mem_total_bytes", "mem_used_bytes", …, "resources"}]``."""

    @abc.abstractmethod
    def quotas(self) -> list[dict[str, Any]]:
        """Resource quota (RQS) usage (``qquota -u '*'``): ``[{"rule", "filters",
        "limits": [{"resource", "limit", "value"}]}]``."""

    @abc.abstractmethod
    def global_capacity(self) -> dict[str, float]:
        """Cluster-wide consumable capacities (``complex_values`` of the global
        host): ``{"anthropic_api": 96.0}``; non-numeric complexes left out."""

    @abc.abstractmethod
    def share_tree(self) -> list[dict[str, Any]]:
        """Share-tree usage per node (``sge_share_mon``): ``[{"node", "user",
        "project", "shares", "job_count", "actual_share", "usage", …}]``, root first."""

    # ---- accounting
    @abc.abstractmethod
    def accounting_since(self, cursor: AccountingCursor | None, max_bytes: int) -> AccountingBatch:
        """Accounting records written after ``cursor`` (None: from the start),
        reading at most about ``max_bytes`` bytes (whole records only).

        The batch's ``cursor`` is where the next call starts; a rotated or
        truncated file restarts at 0 (``batch.reset``). Lines that are not
        records are returned as ``quarantined``, never skipped silently.
        Raises AccountingMissing when the accounting file does not exist.
        """

    # ---- submitting and controlling
    @abc.abstractmethod
    def native_specification(self, spec: ArrayJobSpec) -> str:
        """The qsub options string :meth:`submit_array` would pass for ``spec``
        (validated against the adapter's allow-lists). Raises InvalidSubmission."""

    @abc.abstractmethod
    def submit_array(self, spec: ArrayJobSpec) -> tuple[int, list[int]]:
        """Submit one array job of tasks 1..``spec.count``; return ``(job_number, task_numbers)``.

        Raises InvalidSubmission (nothing submitted), SchedulerCommandError
        (refused by the scheduler), SchedulerUnavailable.
        """

    @abc.abstractmethod
    def control(self, action: str, job_number: int, task_numbers: Sequence[int] | None = None,
                priority: int | None = None) -> None:
        """``hold``, ``release``, ``delete``, ``priority`` (whole job;
        ``PRIORITY_MIN``..``PRIORITY_MAX``) or ``clear_error`` on a job or some
        of its tasks (``task_numbers``; None for the whole job).

        Raises InvalidSubmission (bad action or argument; nothing run),
        SchedulerCommandError (refused, e.g. no such job), SchedulerUnavailable.
        """

    # ---- advance reservations (qrsub(1), qrstat(1), qrdel(1))
    @abc.abstractmethod
    def reservations(self) -> list[dict[str, Any]]:
        """Every user's advance reservations with their details (``qrstat -u '*' -xml``,
        then ``qrstat -ar ID,... -xml``). Shape (``parsers.qrstat.parse_qrstat``,
        detailed): ``[{"id", "name", "owner", "state" (waiting|warning|running|error|deleted),
        "state_code", "start_at", "end_at" (aware UTC), "duration_s", "submitted_at",
        "queues" [{"queue_instance", "queue", "host", "slots"}], "slots", "resources"
        {name: value}, "pe", "pe_slots", "users", "group", "account"}]``, by id.
        """

    @abc.abstractmethod
    def reservation_submit(self, spec: ReservationSpec) -> int:
        """Book ``spec`` (``qrsub``, an argv list); return the reservation id.

        Raises InvalidSubmission (bad field; nothing run), SchedulerCommandError
        (refused: no queue can hold it, not in ``arusers``, limit reached),
        SchedulerUnavailable.
        """

    @abc.abstractmethod
    def reservation_delete(self, reservation_id: int) -> None:
        """Delete advance reservation ``reservation_id`` (``qrdel ID``); its jobs are deleted too.

        Raises InvalidSubmission (not a positive int), SchedulerCommandError
        (refused or unknown), SchedulerUnavailable.
        """


def abstract_methods(cls: type) -> set[str]:
    """The interface methods ``cls`` leaves unimplemented (empty for a complete adapter)."""
    return set(getattr(cls, "__abstractmethods__", ()))
