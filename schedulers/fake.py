"""An in-memory scheduler implementing the whole ``SchedulerAdapter`` interface, for unit tests.

It validates submissions exactly as :class:`~schedulers.gridengine.adapter.GridEngine`
does (same allow-lists, same :class:`InvalidSubmission`), keeps tasks in
memory, and lets a test move them along: :meth:`FakeScheduler.start`,
:meth:`FakeScheduler.finish`, :meth:`FakeScheduler.set_error`. Finished
tasks leave ``list_tasks()`` and produce :class:`AccountingRecord` objects
(:meth:`FakeScheduler.accounting_records`, :meth:`FakeScheduler.accounting_since`),
as Grid Engine's accounting file would. ``qstat -j`` answers are built from
the tasks (:meth:`FakeScheduler.job_detail`; a test adds scheduler messages
with :meth:`FakeScheduler.set_job_messages` or replaces an answer with
:meth:`FakeScheduler.set_job_detail`); the queue summary, hosts, quotas and
global capacity are the attributes ``queue_rows``, ``host_rows``,
``quota_rows`` and ``capacity``, which a test sets. ``unavailable = True``
makes every call raise SchedulerUnavailable; ``accounting_missing = True``
makes ``accounting_since`` raise AccountingMissing.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Callable, Iterable, Sequence

from schedulers.base import (
    AccountingBatch,
    AccountingCursor,
    AccountingMissing,
    AccountingRecord,
    ArrayJobSpec,
    InvalidSubmission,
    QstatTask,
    ReservationSpec,
    SchedulerAdapter,
    SchedulerCommandError,
    SchedulerUnavailable,
    UnknownJob,
)
from schedulers.gridengine.commands import control_argv, reservation_id_argument, reservation_submit_argv
from schedulers.gridengine.native_spec import DEFAULT_MAX_TASKS, job_id_arguments, native_specification

#: The fake accounting "file" never rotates: its cursor is (FAKE_INODE, records read).
FAKE_INODE = 1

# The state letters qstat shows, per (scheduler state, held).
_STATE_CODES = {"pending": "qw", "held": "hqw", "running": "r", "error": "Eqw", "suspended": "s"}


def _utcnow() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


@dataclasses.dataclass
class FakeTask:
    """One task the fake knows about (mutable; tests may read it)."""

    job_number: int
    task_number: int
    spec: ArrayJobSpec
    submitted_at: dt.datetime
    state: str = "pending"  # pending, held, running, suspended, error
    held: bool = False
    priority: int = 0
    host: str | None = None
    started_at: dt.datetime | None = None


class FakeScheduler(SchedulerAdapter):
    """In-memory SchedulerAdapter. ``clock`` returns aware UTC datetimes."""

    flavour = "fake"

    def __init__(self, *, queues: Iterable[str] = ("agent.q", "classic.q"),
                 projects: Iterable[str] = ("research", "engineering"),
                 resources: Iterable[str] = ("anthropic_api",), first_job_number: int = 1,
                 clock: Callable[[], dt.datetime] = _utcnow, hostname: str = "fakehost",
                 owner: str = "tco", max_tasks: int = DEFAULT_MAX_TASKS) -> None:
        self.queues, self.projects, self.resources = set(queues), set(projects), set(resources)
        self.next_job_number = first_job_number
        self.clock = clock
        self.hostname = hostname
        self.owner = owner
        self.max_tasks = max_tasks
        self.tasks: dict[tuple[int, int], FakeTask] = {}
        self.accounting: list[AccountingRecord] = []
        self.submissions: list[tuple[int, ArrayJobSpec]] = []
        self.control_calls: list[list[str]] = []
        self.unavailable = False
        # Queue instance states by host (schedulers.hosts letters, e.g. {"h2": "u"}); see queue_instances().
        self.host_states: dict[str, str] = {}
        self.accounting_missing = False
        self.queue_rows: list[dict] = []
        self.host_rows: list[dict] = []
        self.quota_rows: list[dict] = []
        self.capacity: dict[str, float] = {}
        self.job_details: dict[int, dict] = {}
        self.job_messages: dict[int, list[str]] = {}
        self.job_detail_calls: list[tuple[int, float | None]] = []
        # Advance reservations by id (reservations() shape); qrsub argv lists in reservation_calls.
        self.reservation_rows: dict[int, dict] = {}
        self.reservation_calls: list[list[str]] = []
        self.next_reservation_id = 1

    def _check_available(self) -> None:
        if self.unavailable:
            raise SchedulerUnavailable("fake scheduler: qmaster unreachable (unavailable=True)")

    # ---- the adapter interface
    def list_tasks(self) -> list[QstatTask]:
        """Active tasks as QstatTask, ordered by (job_number, task_number)."""
        self._check_available()
        out = []
        for (job_number, task_number), t in sorted(self.tasks.items()):
            running = t.state in ("running", "suspended")
            state = "held" if t.held and t.state == "pending" else t.state
            code = _STATE_CODES[state] if not (t.held and running) else "h" + _STATE_CODES[t.state]
            out.append(QstatTask(
                job_number=job_number, task_number=task_number, name=t.spec.name, owner=self.owner,
                project=t.spec.project, state=state, state_code=code, restarted=False,
                queue=t.spec.queue if running else None, host=t.host if running else None,
                slots=1, submitted_at=t.submitted_at, started_at=t.started_at,
                # JAT_prio is normalised to 0..1; this keeps the order of -p.
                priority=round((t.priority - (-1023)) / 2047, 5),
            ))
        return out

    def job_detail(self, job_number: int, *, timeout: float | None = None) -> dict:
        """``qstat -j`` of one job, in ``parse_job_detail``'s shape, built from its tasks.

        An answer set with :meth:`set_job_detail` wins. Each call is logged in
        ``job_detail_calls`` as ``(job_number, timeout)``. Raises InvalidSubmission
        (bad number), UnknownJob (no such job), SchedulerUnavailable.
        """
        job_id_arguments(job_number)
        self._check_available()
        self.job_detail_calls.append((job_number, timeout))
        if job_number in self.job_details:
            return self.job_details[job_number]
        tasks = self._select(job_number, None)
        if not tasks:
            raise UnknownJob(f"fake scheduler: job {job_number} does not exist", job_ids=[str(job_number)])
        spec = tasks[0].spec
        return {
            "job_number": job_number, "name": spec.name, "owner": self.owner, "project": spec.project,
            "submitted_at": tasks[0].submitted_at, "hard_resources": {k: str(v) for k, v in spec.resources.items()},
            "hard_queues": [spec.queue],
            "tasks": [{"task_number": t.task_number,
                       "state": "held" if t.held and t.state == "pending" else t.state} for t in tasks],
            "holds": {}, "predecessors": [spec.hold_jid_ad] if spec.hold_jid_ad else [],
            "scheduler_messages": list(self.job_messages.get(job_number, [])), "global_messages": [],
            "context": {}, "advance_reservation": spec.advance_reservation, "reserve": False,
            "pe": None, "pe_slots": None,
        }

    def set_job_detail(self, job_number: int, detail: dict) -> None:
        """Answer ``job_detail(job_number)`` with ``detail`` (even for a job the fake does not hold)."""
        self.job_details[job_number] = detail

    def set_job_messages(self, job_number: int, messages: list[str]) -> None:
        """The scheduler messages (why a job waits) ``job_detail`` reports for a job."""
        self.job_messages[job_number] = list(messages)

    def queue_summary(self) -> list[dict]:
        """``queue_rows`` (set by the test; shape of ``parse_cluster_queue_summary``)."""
        self._check_available()
        return list(self.queue_rows)

    def hosts(self) -> list[dict]:
        """``host_rows`` (set by the test; shape of ``parse_qhost``)."""
        self._check_available()
        return list(self.host_rows)

    def quotas(self) -> list[dict]:
        """``quota_rows`` (set by the test; shape of ``parse_qquota``)."""
        self._check_available()
        return list(self.quota_rows)

    def global_capacity(self) -> dict[str, float]:
        """``capacity`` (set by the test): ``{consumable: amount}``."""
        self._check_available()
        return dict(self.capacity)

    def queue_instances(self) -> list[dict]:
        """One instance per queue on each host running a task or named in ``host_states``
        (shape of ``schedulers.hosts.parse_queue_instances``; states from ``host_states``)."""
        self._check_available()
        hosts = sorted({t.host for t in self.tasks.values() if t.host} | set(self.host_states) | {self.hostname})
        return [{"name": f"{q}@{h}", "queue": q, "host": h, "qtype": "B",
                 "slots_used": sum(1 for t in self.tasks.values()
                                   if t.host == h and t.spec.queue == q and t.state in ("running", "suspended")),
                 "slots_resv": 0, "slots_total": 48, "load_avg": None if "u" in self.host_states.get(h, "") else 0.5,
                 "arch": "lx-amd64", "states": self.host_states.get(h, ""), "reasons": []}
                for h in hosts for q in sorted(self.queues)]

    def share_tree(self) -> list[dict]:
        """A root and one node per project with its running-task count (no usage decay)."""
        self._check_available()
        nodes = [{"node": "/", "user": None, "project": None, "shares": 1, "job_count": 0}]
        for project in sorted(self.projects):
            running = sum(1 for t in self.tasks.values() if t.spec.project == project and t.state == "running")
            nodes.append({"node": f"/{project}", "user": None, "project": project, "shares": 1,
                          "job_count": running, "actual_share": None, "usage": float(running)})
        nodes[0]["job_count"] = sum(n["job_count"] for n in nodes[1:])
        return nodes

    def native_specification(self, spec: ArrayJobSpec) -> str:
        """The native specification GridEngine would build (no ``-notify``). Raises InvalidSubmission."""
        return native_specification(spec, queues=self.queues, projects=self.projects, resources=self.resources,
                                    max_tasks=self.max_tasks)

    def submit_array(self, spec: ArrayJobSpec) -> tuple[int, list[int]]:
        """Validate like GridEngine, then add ``count`` pending (or held) tasks.

        Raises InvalidSubmission (nothing added), SchedulerUnavailable.
        """
        self.native_specification(spec)
        self._check_available()
        job_number = self.next_job_number
        self.next_job_number += 1
        now = self.clock()
        for n in range(1, spec.count + 1):
            self.tasks[(job_number, n)] = FakeTask(job_number, n, spec, now, held=spec.hold,
                                                   priority=spec.priority)
        self.submissions.append((job_number, spec))
        return job_number, list(range(1, spec.count + 1))

    def control(self, action: str, job_number: int, task_numbers: Sequence[int] | None = None,
                priority: int | None = None) -> None:
        """hold, release, delete, priority, clear_error, as GridEngine.control.

        Raises InvalidSubmission (bad arguments), SchedulerCommandError (no
        such job, as qdel says "does not exist"), SchedulerUnavailable.
        """
        argv = control_argv(action, job_number, task_numbers, priority)
        self._check_available()
        targets = self._select(job_number, task_numbers)
        if not targets:
            raise SchedulerCommandError(f"{argv[0]} exited with status 1: job {job_number} does not exist",
                                        argv=argv, returncode=1,
                                        stderr=f'denied: job "{job_number}" does not exist')
        self.control_calls.append(argv)
        for t in targets:
            if action == "hold":
                t.held = True
            elif action == "release":
                t.held = False
            elif action == "priority":
                t.priority = priority
            elif action == "clear_error" and t.state == "error":
                t.state = "pending"
            elif action == "delete":
                if t.state in ("running", "suspended"):
                    # A running task killed by qdel: accounting says failed 100, killed by SIGKILL.
                    self._account(t, exit_status=137, failed=100)
                del self.tasks[(t.job_number, t.task_number)]

    # ---- advance reservations
    def reservations(self) -> list[dict]:
        """The reservations booked here, by id, in ``parse_qrstat``'s detailed shape; ``state``
        is ``running`` from ``start_at`` on (by ``clock``), else ``waiting``; ended ones are gone."""
        self._check_available()
        now = self.clock()
        out = []
        for ar_id in sorted(self.reservation_rows):
            row = self.reservation_rows[ar_id]
            if row["end_at"] <= now:
                continue
            running = row["start_at"] <= now
            out.append({**row, "state": "running" if running else "waiting", "state_code": "r" if running else "w"})
        return out

    def reservation_submit(self, spec: ReservationSpec) -> int:
        """Validate as GridEngine does (the same qrsub argv, logged in ``reservation_calls``), then book.

        Raises InvalidSubmission (nothing booked), SchedulerUnavailable.
        """
        now = self.clock()
        argv = reservation_submit_argv(spec, queues=self.queues, resources=self.resources, now=now)
        self._check_available()
        ar_id = self.next_reservation_id
        self.next_reservation_id += 1
        self.reservation_calls.append(argv)
        start = spec.start.astimezone(dt.timezone.utc).replace(microsecond=0)
        self.reservation_rows[ar_id] = {
            "id": ar_id, "name": spec.name, "owner": self.owner, "state": "waiting", "state_code": "w",
            "start_at": start, "end_at": start + dt.timedelta(seconds=spec.duration_s),
            "duration_s": spec.duration_s, "submitted_at": now, "group": self.owner, "account": spec.account,
            "queues": [{"queue_instance": f"{spec.queue}@{self.hostname}", "queue": spec.queue,
                        "host": self.hostname, "slots": spec.slots}],
            "slots": spec.slots, "resources": {spec.seat_resource: str(spec.seats)} if spec.seats else {},
            "pe": spec.pe, "pe_slots": spec.slots if spec.pe else None, "users": list(spec.users),
        }
        return ar_id

    def reservation_delete(self, reservation_id: int) -> None:
        """Forget a reservation and delete the jobs submitted into it (as qrdel does).

        Raises InvalidSubmission, SchedulerCommandError (unknown id), SchedulerUnavailable.
        """
        argv = ["qrdel", reservation_id_argument(reservation_id)]
        self._check_available()
        if reservation_id not in self.reservation_rows:
            raise SchedulerCommandError(f"qrdel exited with status 1: advance reservation {reservation_id} "
                                        "does not exist", argv=argv, returncode=1,
                                        stderr=f'denied: advance reservation "{reservation_id}" does not exist')
        self.reservation_calls.append(argv)
        del self.reservation_rows[reservation_id]
        for key, t in list(self.tasks.items()):
            if t.spec.advance_reservation == reservation_id:
                del self.tasks[key]

    # ---- moving tasks along (test helpers)
    def _select(self, job_number: int, task_numbers: Sequence[int] | None) -> list[FakeTask]:
        wanted = None if task_numbers is None else set(task_numbers)
        return [t for (j, n), t in sorted(self.tasks.items())
                if j == job_number and (wanted is None or n in wanted)]

    def start(self, job_number: int, task_numbers: Sequence[int] | None = None,
              host: str | None = None) -> list[FakeTask]:
        """Start pending, not-held tasks (all of the job's by default). Returns those started."""
        started = []
        for t in self._select(job_number, task_numbers):
            if t.state == "pending" and not t.held:
                t.state, t.host, t.started_at = "running", host or self.hostname, self.clock()
                started.append(t)
        return started

    def set_error(self, job_number: int, task_numbers: Sequence[int] | None = None) -> None:
        """Put pending tasks into the error state (``Eqw``)."""
        for t in self._select(job_number, task_numbers):
            if t.state == "pending":
                t.state = "error"

    def finish(self, job_number: int, task_numbers: Sequence[int] | None = None, *,
               exit_status: int = 0, failed: int = 0) -> list[AccountingRecord]:
        """End running tasks: they leave list_tasks() and get an accounting record each."""
        records = []
        for t in self._select(job_number, task_numbers):
            if t.state in ("running", "suspended"):
                records.append(self._account(t, exit_status=exit_status, failed=failed))
                del self.tasks[(t.job_number, t.task_number)]
        return records

    def run_to_completion(self, job_number: int, *, exit_status: int = 0) -> list[AccountingRecord]:
        """Start and finish every task of a job."""
        self.start(job_number)
        return self.finish(job_number, exit_status=exit_status)

    def accounting_records(self, since: int = 0) -> list[AccountingRecord]:
        """Accounting records in the order written, from index ``since`` (a cursor)."""
        return list(self.accounting[since:])

    def accounting_since(self, cursor: AccountingCursor | None, max_bytes: int) -> AccountingBatch:
        """Records after ``cursor``, whose offset counts records (the fake has no bytes):
        at most ``max_bytes`` of them per batch. Raises AccountingMissing when
        ``accounting_missing`` is set."""
        if self.accounting_missing:
            raise AccountingMissing("fake scheduler: accounting file missing (accounting_missing=True)",
                                    path="fake:accounting")
        start = cursor.offset if cursor is not None and cursor.inode == FAKE_INODE else 0
        reset = None
        if cursor is not None and (cursor.inode != FAKE_INODE or cursor.offset > len(self.accounting)):
            start, reset = 0, "rotated" if cursor.inode != FAKE_INODE else "truncated"
        records = self.accounting[start:start + max(1, max_bytes)]
        return AccountingBatch(records=list(records), quarantined=[], skipped=0, deferred_bytes=0,
                               cursor=AccountingCursor(inode=FAKE_INODE, offset=start + len(records)),
                               reset=reset)

    def _account(self, t: FakeTask, *, exit_status: int, failed: int) -> AccountingRecord:
        ended = self.clock()
        started = t.started_at or ended
        category = f"-q {t.spec.queue} -P {t.spec.project}"
        if t.spec.resources:
            category += " -l " + ",".join(f"{k}={v}" for k, v in sorted(t.spec.resources.items()))
        record = AccountingRecord(
            job_number=t.job_number, task_number=t.task_number, pe_taskid=None, job_name=t.spec.name,
            owner=self.owner, group=self.owner, project=t.spec.project, department="defaultdepartment",
            account=t.spec.account, queue=t.spec.queue, hostname=t.host or self.hostname, slots=1,
            submitted_at=t.submitted_at, started_at=started, ended_at=ended,
            wallclock_s=(ended - started).total_seconds(), cpu_s=0.0, maxvmem_bytes=0.0,
            failed=failed, exit_status=exit_status, category=category, usage={},
        )
        self.accounting.append(record)
        return record


__all__ = ["FakeScheduler", "FakeTask", "InvalidSubmission"]
