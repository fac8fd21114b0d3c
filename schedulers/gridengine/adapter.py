"""The Grid Engine adapter: :class:`GridEngine`, flavour ``sge8`` (Son of Grid Engine 8.1.9).

Status comes from the client commands (:mod:`.commands`) read by one parser
per output (:mod:`.parsers`); submission goes through DRMAA (:mod:`.drmaa`)
with a native specification built only from validated fields
(:mod:`.native_spec`); accounting is read from the cell's accounting file
(:mod:`.parsers.accounting`).
"""
from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from typing import Iterable, Sequence

from schedulers.accounting_cursor import fingerprint, plan_read
from schedulers.base import (
    AccountingBatch,
    AccountingCursor,
    AccountingMissing,
    ArrayJobSpec,
    QstatTask,
    ReservationSpec,
    SchedulerAdapter,
    SchedulerCommandError,
    SchedulerError,
    UnknownJob,
)

from . import drmaa
from .commands import (DEFAULT_SGE_CELL, DEFAULT_SGE_ROOT, control_argv, qmod_cleared, reservation_id_argument,
                       reservation_id_from, reservation_submit_argv, run_command)
from .flavours import defaults_for, version_tuple
from .native_spec import DEFAULT_MAX_TASKS, job_id_arguments, native_specification
from .parsers.accounting import read_accounting
from .parsers.ocs_json import parse_qhost_json, parse_qquota_json, parse_qstat_json, parse_queue_summary_json
from .parsers.qconf import parse_complex_values
from .parsers.qhost import parse_qhost
from .parsers.qquota import parse_qquota
from .parsers.qrstat import parse_qrstat
from .parsers.qstat import parse_qstat
from .parsers.qstat_j import parse_job_detail
from .parsers.queue_summary import parse_cluster_queue_summary
from .parsers.sharetree import parse_share_mon

#: The thread that reads the accounting file ahead of the ingest (GridEngine.accounting_since).
_READ_AHEAD = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tco-accounting-ahead")

# (sge_root, sge_cell) -> {job_number: project or None}, filled from qstat -ext.
_PROJECTS: dict[tuple[str, str], dict[int, str | None]] = {}


class GridEngine(SchedulerAdapter):
    """The adapter for one Grid Engine cell (flavour ``sge8``: Son of Grid Engine 8.1.9).

    ``queues``, ``projects`` and ``resources`` are the allow-lists a
    submission is checked against (names of cluster queues, projects and
    requestable complexes). ``sge_root``/``sge_cell`` select the cell for
    commands; DRMAA uses the process environment (one session per process,
    so one cell per submitting process). ``timeout`` is seconds per command.
    ``accounting_path`` is the cell's accounting file (default: the
    flavour's, :mod:`.flavours`; ``$SGE_ROOT/$SGE_CELL/common/accounting``
    for sge8). Status commands are read as XML (``-xml``); a subclass that
    sets :attr:`json_outputs` reads ``-fmt json`` instead, falling back to XML.

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
                 accounting_path: str | None = None, qmaster_port: int | None = None,
                 execd_port: int | None = None) -> None:
        self.queues = frozenset(queues)
        self.projects = frozenset(projects)
        self.resources = frozenset(resources)
        self.sge_root = sge_root or os.environ.get("SGE_ROOT") or DEFAULT_SGE_ROOT
        self.sge_cell = sge_cell or os.environ.get("SGE_CELL") or DEFAULT_SGE_CELL
        self.timeout = timeout
        self.max_tasks = max_tasks
        self.notify = notify
        self.defaults = defaults_for(self.flavour)
        self.accounting_path = accounting_path or self.defaults.accounting_path(self.sge_root, self.sge_cell)
        # A cell on other ports than /etc/services says (a second cell on one machine): its clients
        # and libdrmaa need them in the environment, as the cell's settings.sh sets them.
        self.ports = {name: str(port) for name, port in (("SGE_QMASTER_PORT", qmaster_port),
                                                          ("SGE_EXECD_PORT", execd_port)) if port}

    @property
    def cell_environment(self) -> dict[str, str]:
        """The variables that select this adapter's cell for Grid Engine's clients."""
        return {"SGE_ROOT": self.sge_root, "SGE_CELL": self.sge_cell, **self.ports}

    def json_outputs(self) -> bool:
        """Whether the status commands are asked for ``-fmt json`` (never on SGE 8)."""
        return False

    def _status(self, xml_argv: list[str], xml_parser, json_argv: list[str] | None = None, json_parser=None):
        """Run a status command as JSON when :meth:`json_outputs` (and the command
        has a JSON reader), else as XML; a JSON call the clients refuse falls back to XML."""
        if json_argv is not None and self.json_outputs():
            try:
                return json_parser(self._run(json_argv))
            except SchedulerCommandError:
                pass
        return xml_parser(self._run(xml_argv))

    # ---- commands
    def _run(self, argv: list[str], timeout: float | None = None) -> bytes:
        return run_command(argv, timeout=timeout or self.timeout, env_extra=self.cell_environment)

    def list_tasks(self) -> list[QstatTask]:
        """Every job's tasks, all users: ``qstat -xml -u '*'`` (qstat(1)).

        Raises SchedulerUnavailable, SchedulerCommandError, SchedulerParseError.
        """
        tasks = self._status(["qstat", "-xml", "-u", "*"], parse_qstat,
                             ["qstat", "-fmt", "json", "-u", "*"], parse_qstat_json)
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
            for t in self._status(["qstat", "-xml", "-ext", "-u", "*"], parse_qstat,
                                  ["qstat", "-fmt", "json", "-ext", "-u", "*"], parse_qstat_json):
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
        return self._status(["qstat", "-g", "c", "-xml"], parse_cluster_queue_summary,
                            ["qstat", "-g", "c", "-fmt", "json"], parse_queue_summary_json)

    def hosts(self) -> list[dict]:
        """Exec hosts with resources, ``qhost -F -xml``, parsed by ``parse_qhost``."""
        return self._status(["qhost", "-F", "-xml"], parse_qhost, ["qhost", "-F", "-fmt", "json"], parse_qhost_json)

    def queue_instances(self) -> list[dict]:
        """Queue instances with their states and reasons, ``qstat -f -explain aAcE -xml``,
        parsed by ``schedulers.hosts.parse_queue_instances`` (one command whatever the number of hosts).

        Raises SchedulerUnavailable, SchedulerCommandError, SchedulerParseError.
        """
        from schedulers.hosts import QSTAT_F_ARGV, parse_queue_instances
        return parse_queue_instances(self._run(list(QSTAT_F_ARGV)))

    def queue_calendars(self) -> dict[str, dict]:
        """Each cluster queue's calendar (queue_conf(5) ``calendar``, calendar_conf(5)):
        ``{queue: {"calendar", "calendar_year", "calendar_week"}}`` for queues that name one,
        from ``qconf -sq '*'`` and ``qconf -scal NAME`` (``schedulers.calendars.read_queue_calendars``).

        Raises SchedulerUnavailable, SchedulerCommandError.
        """
        from schedulers.calendars import read_queue_calendars
        return read_queue_calendars(self._run)

    def quotas(self) -> list[dict]:
        """Resource quota usage, ``qquota -u '*' -xml``, parsed by ``parse_qquota``."""
        return self._status(["qquota", "-u", "*", "-xml"], parse_qquota,
                            ["qquota", "-u", "*", "-fmt", "json"], parse_qquota_json)

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
        for a bad job number; UnknownJob when the job does not exist (SGE 8.1.9
        and OCS 9.1 print ``<unknown_jobs>`` and exit 0; OCS 9.2 prints nothing,
        ``Following jobs do not exist: N`` on stderr, and exits 1).
        """
        (job_id,) = job_id_arguments(job_number)
        try:
            data = self._run(["qstat", "-j", job_id, "-xml"], timeout=timeout)
        except SchedulerCommandError as exc:
            if "do not exist" in exc.stderr:
                raise UnknownJob(f"qstat -j: unknown job {job_id}", job_ids=[job_id]) from exc
            raise
        return parse_job_detail(data)

    def accounting_since(self, cursor: AccountingCursor | None, max_bytes: int) -> AccountingBatch:
        """Records of :attr:`accounting_path` after ``cursor`` (:meth:`_accounting_since`).

        While the caller stores a batch that was not the file's end, the next one is read and
        parsed ahead in a thread (the parse, Python's work, overlaps the database's, which releases
        the interpreter while it waits): a call for the cursor that batch ended at gets it at
        once. A read ahead that no call asks for (the caller stopped, or read from elsewhere) is
        dropped; it is the read that call would have made, only earlier.
        """
        ahead, self._ahead = getattr(self, "_ahead", None), None
        if ahead is not None and ahead[0] == (cursor, max_bytes):
            batch = ahead[1].result()
        else:
            batch = self._accounting_since(cursor, max_bytes)
        if batch.records or batch.quarantined or batch.skipped:
            self._ahead = ((batch.cursor, max_bytes), _READ_AHEAD.submit(self._accounting_since, batch.cursor,
                                                                         max_bytes))
        return batch

    def _accounting_since(self, cursor: AccountingCursor | None, max_bytes: int) -> AccountingBatch:
        """Records of :attr:`accounting_path` after ``cursor`` (``parsers.accounting.read_accounting``).

        Where to read is planned by ``schedulers.accounting_cursor.plan_read``:
        after a rotation the rest of the rotated file first (found by its
        inode), then the new file from 0 (``reset='rotated'``); a file
        truncated, or truncated and regrown past the offset (its first bytes
        no longer match the cursor's fingerprint), again from 0
        (``reset='truncated'``). The returned cursor carries the fingerprint
        of what was consumed. Raises AccountingMissing when the file does not
        exist (and no rotated copy is left to read) or cannot be read.
        """
        try:
            for _ in range(3):
                plan = plan_read(self.accounting_path, cursor.inode if cursor else 0,
                                 cursor.offset if cursor else 0, cursor.fingerprint if cursor else "")
                batch = read_accounting(plan.path, plan.cursor, max_bytes=max_bytes)
                if plan.cursor is None or not batch.reset:
                    break
                # The file was swapped between the plan and the read: plan again.
            else:
                return AccountingBatch(records=[], quarantined=[], skipped=0, deferred_bytes=0,
                                       cursor=cursor, reset=None)
            batch.reset = plan.reset
            batch.cursor = AccountingCursor(
                inode=batch.cursor.inode, offset=batch.cursor.offset,
                fingerprint=fingerprint(plan.path, batch.cursor.offset, inode=batch.cursor.inode))
            return batch
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

    # ---- advance reservations
    def reservations(self) -> list[dict]:
        """Every user's advance reservations, detailed: ``qrstat -u '*' -xml`` for the ids,
        then one ``qrstat -ar ID,... -xml`` (qrstat(1)), parsed by ``parse_qrstat``.

        A reservation that ends between the two calls is left out. Raises
        SchedulerUnavailable, SchedulerCommandError, SchedulerParseError.
        """
        summary = parse_qrstat(self._run(["qrstat", "-u", "*", "-xml"]))
        if not summary:
            return []
        ids = ",".join(str(r["id"]) for r in summary)
        try:
            detailed = {r["id"]: r for r in parse_qrstat(self._run(["qrstat", "-ar", ids, "-xml"]))}
        except SchedulerCommandError:
            detailed = {}  # one ended in between (qrstat exits 1): the summary still answers
        return sorted((detailed.get(r["id"], r) for r in summary), key=lambda r: r["id"])

    def reservation_submit(self, spec: ReservationSpec) -> int:
        """Book ``spec`` with ``qrsub`` (argv from ``commands.reservation_submit_argv``,
        checked against this adapter's queue and resource allow-lists); return its id.

        Raises InvalidSubmission (nothing run), SchedulerCommandError (refused:
        "no suitable queues", not in arusers …), SchedulerUnavailable.
        """
        argv = reservation_submit_argv(spec, queues=self.queues, resources=self.resources)
        return reservation_id_from(self._run(argv))

    def reservation_delete(self, reservation_id: int) -> None:
        """``qrdel ID`` (qrdel(1)). Raises InvalidSubmission, SchedulerCommandError, SchedulerUnavailable."""
        self._run(["qrdel", reservation_id_argument(reservation_id)])

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
        return drmaa.run_bulk(spec, native, sge_root=self.sge_root, sge_cell=self.sge_cell, flavour=self.flavour,
                              ports=self.ports)


# (sge_root, sge_cell) -> whether the installed clients take ``-fmt json``.
_JSON_CLIENTS: dict[tuple[str, str], bool] = {}


class OpenClusterScheduler(GridEngine):
    """The adapter for an Open/Gridware Cluster Scheduler 9 cell (flavour ``ocs9``).

    Everything as :class:`GridEngine`, with the flavour's defaults
    (``common/accounting.jsonl``, ``libdrmaa.so``, no jemalloc preload) and
    JSON status output where the clients offer it: OCS 9.2 takes ``-fmt json``
    on qstat, qhost and qquota (its XML times are in the qmaster's zone, the
    JSON's in UTC); OCS 9.1 does not, and is read as XML. ``json`` forces the
    choice; None asks ``qstat -help`` once per cell (it lists ``-fmt``).
    """

    flavour = "ocs9"

    def __init__(self, *, json: bool | None = None, **options) -> None:
        super().__init__(**options)
        self._json = json

    def json_outputs(self) -> bool:
        """Whether the clients take ``-fmt json`` (OCS 9.2 and later); asked once per cell."""
        if self._json is None:
            cell = (self.sge_root, self.sge_cell)
            if cell not in _JSON_CLIENTS:
                try:
                    help_text = self._run(["qstat", "-help"]).decode("utf-8", "replace")
                except SchedulerError:
                    return False  # not remembered: ask again when the clients answer
                banner = help_text.strip().splitlines()[0] if help_text.strip() else ""
                version = version_tuple(banner) or (0, 0, 0)
                _JSON_CLIENTS[cell] = "-fmt" in help_text and version >= (9, 2, 0)
            self._json = _JSON_CLIENTS[cell]
        return self._json
