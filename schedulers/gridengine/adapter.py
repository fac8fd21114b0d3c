"""The Grid Engine adapter: :class:`GridEngine`, flavour ``sge8`` (Son of Grid Engine 8.1.9).

Status comes from the client commands (:mod:`.commands`) read by one parser
per output (:mod:`.parsers`); submission goes through DRMAA (:mod:`.drmaa`)
with a native specification built only from validated fields
(:mod:`.native_spec`); accounting is read from the cell's accounting file
(:mod:`.parsers.accounting`).
"""
from __future__ import annotations

import os
from typing import Iterable, Sequence

from schedulers.base import (
    AccountingBatch,
    AccountingCursor,
    AccountingMissing,
    ArrayJobSpec,
    QstatTask,
    SchedulerAdapter,
    SchedulerCommandError,
)

from . import drmaa
from .commands import DEFAULT_SGE_CELL, DEFAULT_SGE_ROOT, control_argv, qmod_cleared, run_command
from .native_spec import DEFAULT_MAX_TASKS, job_id_arguments, native_specification
from .parsers.accounting import read_accounting
from .parsers.qconf import parse_complex_values
from .parsers.qhost import parse_qhost
from .parsers.qquota import parse_qquota
from .parsers.qstat import parse_qstat
from .parsers.qstat_j import parse_job_detail
from .parsers.queue_summary import parse_cluster_queue_summary
from .parsers.sharetree import parse_share_mon

# (sge_root, sge_cell) -> {job_number: project or None}, filled from qstat -ext.
_PROJECTS: dict[tuple[str, str], dict[int, str | None]] = {}


class GridEngine(SchedulerAdapter):
    """The adapter for one Grid Engine cell (flavour ``sge8``: Son of Grid Engine 8.1.9).

    ``queues``, ``projects`` and ``resources`` are the allow-lists a
    submission is checked against (names of cluster queues, projects and
    requestable complexes). ``sge_root``/``sge_cell`` select the cell for
    commands; DRMAA uses the process environment (one session per process,
    so one cell per submitting process). ``timeout`` is seconds per command.
    ``accounting_path`` is the cell's accounting file (default
    ``$SGE_ROOT/$SGE_CELL/common/accounting``).

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

    flavour = "sge8"

    def __init__(self, *, queues: Iterable[str] = (), projects: Iterable[str] = (),
                 resources: Iterable[str] = (), sge_root: str | None = None,
                 sge_cell: str | None = None, timeout: float = 10.0,
                 max_tasks: int = DEFAULT_MAX_TASKS, notify: bool = False,
                 accounting_path: str | None = None) -> None:
        self.queues = frozenset(queues)
        self.projects = frozenset(projects)
        self.resources = frozenset(resources)
        self.sge_root = sge_root or os.environ.get("SGE_ROOT") or DEFAULT_SGE_ROOT
        self.sge_cell = sge_cell or os.environ.get("SGE_CELL") or DEFAULT_SGE_CELL
        self.timeout = timeout
        self.max_tasks = max_tasks
        self.notify = notify
        self.accounting_path = accounting_path or os.path.join(self.sge_root, self.sge_cell, "common",
                                                               "accounting")

    # ---- commands
    def _run(self, argv: list[str], timeout: float | None = None) -> bytes:
        return run_command(argv, timeout=timeout or self.timeout,
                           env_extra={"SGE_ROOT": self.sge_root, "SGE_CELL": self.sge_cell})

    def list_tasks(self) -> list[QstatTask]:
        """Every job's tasks, all users: ``qstat -xml -u '*'`` (qstat(1)).

        Raises SchedulerUnavailable, SchedulerCommandError, SchedulerParseError.
        """
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

    def queue_summary(self) -> list[dict]:
        """Cluster queue summary, ``qstat -g c -xml``, parsed by ``parse_cluster_queue_summary``."""
        return parse_cluster_queue_summary(self._run(["qstat", "-g", "c", "-xml"]))

    def hosts(self) -> list[dict]:
        """Exec hosts with resources, ``qhost -F -xml``, parsed by ``parse_qhost``."""
        return parse_qhost(self._run(["qhost", "-F", "-xml"]))

    def quotas(self) -> list[dict]:
        """Resource quota usage, ``qquota -u '*' -xml``, parsed by ``parse_qquota``."""
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
        candidates = [os.path.join(self.sge_root, "utilbin", "lx-amd64", "sge_share_mon"),
                      "/usr/lib/gridengine/sge_share_mon"]
        binary = next((c for c in candidates if os.access(c, os.X_OK)), candidates[-1])
        return parse_share_mon(self._run([binary, "-c", "1", "-n"]))

    def job_detail(self, job_number: int, *, timeout: float | None = None) -> dict:
        """One job, ``qstat -j N -xml``, parsed by ``parse_job_detail``.

        ``timeout`` (seconds) bounds this call only. Raises InvalidSubmission
        for a bad job number; UnknownJob (or SchedulerCommandError) when the
        job does not exist.
        """
        (job_id,) = job_id_arguments(job_number)
        return parse_job_detail(self._run(["qstat", "-j", job_id, "-xml"], timeout=timeout))

    def accounting_since(self, cursor: AccountingCursor | None, max_bytes: int) -> AccountingBatch:
        """Records of :attr:`accounting_path` after ``cursor`` (``parsers.accounting.read_accounting``).

        Raises AccountingMissing when the file does not exist or cannot be read.
        """
        try:
            return read_accounting(self.accounting_path, cursor, max_bytes=max_bytes)
        except FileNotFoundError as exc:
            raise AccountingMissing(f"accounting file {self.accounting_path} does not exist",
                                    path=self.accounting_path) from exc
        except PermissionError as exc:
            raise AccountingMissing(f"accounting file {self.accounting_path} is not readable: {exc}",
                                    path=self.accounting_path) from exc

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
        environment = dict(spec.environment)
        return drmaa.run_bulk(
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
