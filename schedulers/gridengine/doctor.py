"""End-to-end checks of a configured Grid Engine cell, as a site admin would make them.

:func:`run_checks` answers, for one cell: are the clients found and answering
(and which flavour they are), is the accounting file there, switched on and
not shrinking, does the flavour's libdrmaa load, is the submit account an
operator, does the scheduler record job information (``schedd_job_info``),
is the spool directory writable. Each check is a :class:`Check` with a name,
a verdict (``ok``, ``warn``, ``fail``), what was found, and the fix when it
is not ok. ``manage.py tco_doctor`` prints them for the configured cluster.

Commands used (all read-only): ``qstat -help`` (version banner), ``qstat -g c
-xml`` (qmaster answering), ``qconf -sconf global`` (sge_conf(5)
``reporting_params accounting=true``), ``qconf -so``/``qconf -sm``
(operators, managers), ``qconf -ssconf`` (sched_conf(5) ``schedd_job_info``).
"""
from __future__ import annotations

import dataclasses
import os
import pwd
import stat
import subprocess
import sys
import tempfile
from typing import Callable

from schedulers.base import SchedulerError

from . import flavours
from .commands import run_command
from .parsers.qconf import parse_qconf_attributes
from .parsers.queue_summary import parse_cluster_queue_summary

OK, WARN, FAIL = "ok", "warn", "fail"


@dataclasses.dataclass
class Check:
    """One check's result. ``fix`` says what to do when ``status`` is not ``ok``."""

    name: str
    status: str
    detail: str
    fix: str = ""

    @property
    def failed(self) -> bool:
        return self.status == FAIL


@dataclasses.dataclass
class Cell:
    """What is checked: the cell, the flavour tco was told (or found), the files and the account."""

    sge_root: str
    sge_cell: str
    flavour: str
    accounting_path: str
    submit_user: str
    spool_dir: str
    checkpoint_offset: int = 0  # where tco's ingest stopped in the accounting file (bytes)


def _run(cell: Cell, run: Callable[..., bytes], argv: list[str]) -> bytes:
    return run(argv, timeout=15.0, env_extra={"SGE_ROOT": cell.sge_root, "SGE_CELL": cell.sge_cell})


def check_cell_directory(cell: Cell) -> Check:
    common = os.path.join(cell.sge_root, cell.sge_cell, "common")
    if os.path.isfile(os.path.join(common, "act_qmaster")):
        return Check("cell", OK, f"{common}/act_qmaster found")
    return Check("cell", FAIL, f"{common}/act_qmaster not found: SGE_ROOT={cell.sge_root} SGE_CELL={cell.sge_cell} "
                 "is not a Grid Engine cell",
                 "set SGE_ROOT and SGE_CELL (the cluster's sge_root/sge_cell) to the cell the qmaster was "
                 "installed in: the directory whose <cell>/common/act_qmaster names the qmaster host")


def check_clients(cell: Cell, run: Callable[..., bytes]) -> Check:
    try:
        banner = _run(cell, run, ["qstat", "-help"]).decode("utf-8", "replace").strip().splitlines()[0]
    except (SchedulerError, IndexError) as exc:
        fix = "install the Grid Engine clients and put $SGE_ROOT/bin/<arch> on the PATH of tco's processes"
        if "sge_root" in str(exc).lower() or "cell directory" in str(exc).lower():
            fix = "set SGE_ROOT/SGE_CELL to the installed cell (see the cell check)"
        return Check("clients", FAIL, f"qstat -help: {exc}", fix)
    found = flavours.flavour_of_banner(banner)
    if found is None:
        return Check("clients", WARN, f"qstat -help: {banner!r} is not a version tco was tried on",
                     "tco was tried on SGE 8.1.9 and OCS 9.1.4/9.2; set the cluster's flavour by hand")
    if found != cell.flavour:
        return Check("clients", FAIL, f"the clients are {banner} ({found}), the cluster says {cell.flavour}",
                     f"set the cluster's flavour to {found} (TCO_SCHEDULER_FLAVOUR={found}, or the cluster record)")
    try:
        queues = parse_cluster_queue_summary(_run(cell, run, ["qstat", "-g", "c", "-xml"]))
    except SchedulerError as exc:
        return Check("clients", FAIL, f"{banner}, but the qmaster does not answer: {exc}",
                     "start the qmaster (or fix act_qmaster / the ports in settings.sh) and check the "
                     "network between this host and the qmaster")
    return Check("clients", OK, f"{banner} ({found}); qmaster answers: {len(queues)} cluster queue(s)")


def check_accounting(cell: Cell, run: Callable[..., bytes]) -> Check:
    defaults = flavours.defaults_for(cell.flavour)
    path = cell.accounting_path
    expected = defaults.accounting_path(cell.sge_root, cell.sge_cell)
    switched_off = ""
    try:
        params = parse_qconf_attributes(_run(cell, run, ["qconf", "-sconf", "global"])).get("reporting_params", "")
        if "accounting=false" in params.split():
            switched_off = params
    except SchedulerError:
        pass
    if switched_off:
        return Check("accounting", FAIL, f"reporting_params {switched_off}: the qmaster writes no accounting",
                     "qconf -mconf global: set reporting_params accounting=true")
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        hint = f" (a {cell.flavour} cell writes {expected})" if path != expected else ""
        return Check("accounting", FAIL, f"{path} does not exist{hint}",
                     f"point the cluster's accounting file at the cell's ({expected}; TCO_ACCOUNTING_FILE), "
                     "or make it visible on this host (the qmaster writes it; no job may have finished yet)")
    except OSError as exc:
        return Check("accounting", FAIL, f"{path}: {exc}",
                     "let tco's account read the accounting file (its directory and the file)")
    if not os.access(path, os.R_OK):
        return Check("accounting", FAIL, f"{path} is not readable by this account",
                     "let tco's account read the accounting file")
    if size < cell.checkpoint_offset:
        return Check("accounting", WARN, f"{path} is {size} bytes, shorter than where tco stopped "
                     f"({cell.checkpoint_offset}): it was rotated or truncated",
                     "nothing to do if it was rotated on purpose: the next ingest reads the new file from its start")
    fmt = defaults.accounting_format
    return Check("accounting", OK, f"{path}: {size} bytes ({fmt} records), {size - cell.checkpoint_offset} "
                 "not read yet")


def check_drmaa(cell: Cell) -> Check:
    """Load the flavour's libdrmaa in a child process (a failed load must not touch this one)."""
    defaults = flavours.defaults_for(cell.flavour)
    library = os.environ.get("DRMAA_LIBRARY_PATH") or defaults.drmaa_library(cell.sge_root)
    env = dict(os.environ, DRMAA_LIBRARY_PATH=library, SGE_ROOT=cell.sge_root, SGE_CELL=cell.sge_cell)
    if defaults.jemalloc_preload and os.path.exists(defaults.jemalloc_preload):
        env.setdefault("LD_PRELOAD", defaults.jemalloc_preload)
    try:
        proc = subprocess.run([sys.executable, "-c", "import drmaa; print(drmaa.Session().version)"],
                              env=env, capture_output=True, text=True, timeout=30, check=False)
    except subprocess.TimeoutExpired:
        return Check("drmaa", FAIL, f"loading {library} did not finish within 30 s", "")
    if proc.returncode == 0:
        return Check("drmaa", OK, f"{library} loads (DRMAA {proc.stdout.strip()})")
    error = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
    fix = f"install the {cell.flavour} libdrmaa or set DRMAA_LIBRARY_PATH to it"
    if "static TLS" in error:
        fix = (f"start tco's processes with LD_PRELOAD={defaults.jemalloc_preload} (Debian's SGE 8 libdrmaa "
               "links jemalloc)")
    return Check("drmaa", FAIL, f"{library}: {error}", fix)


def check_operator(cell: Cell, run: Callable[..., bytes]) -> Check:
    try:
        operators = _run(cell, run, ["qconf", "-so"]).decode("utf-8", "replace").split()
        managers = _run(cell, run, ["qconf", "-sm"]).decode("utf-8", "replace").split()
    except SchedulerError as exc:
        return Check("operator", FAIL, f"qconf -so/-sm: {exc}", "fix the clients check first")
    if cell.submit_user in managers:
        return Check("operator", OK, f"{cell.submit_user} is a manager (managers are operators too)")
    if cell.submit_user in operators:
        return Check("operator", OK, f"{cell.submit_user} is an operator")
    return Check("operator", FAIL,
                 f"{cell.submit_user} is neither an operator ({', '.join(operators) or 'none'}) nor a manager: "
                 "it cannot raise priorities above 0 (urgent agents), clear error states or act on other "
                 "users' jobs", f"as a manager: qconf -ao {cell.submit_user}")


def check_schedd_job_info(cell: Cell, run: Callable[..., bytes]) -> Check:
    try:
        value = parse_qconf_attributes(_run(cell, run, ["qconf", "-ssconf"])).get("schedd_job_info", "")
    except SchedulerError as exc:
        return Check("schedd_job_info", FAIL, f"qconf -ssconf: {exc}", "fix the clients check first")
    if value.lower() == "true":
        return Check("schedd_job_info", OK, "true: qstat -j says why a job waits")
    return Check("schedd_job_info", WARN,
                 f"{value or 'unset'}: qstat -j gives no reasons for waiting jobs (errors and holds are still "
                 "shown); the OCS default is false",
                 "qconf -msconf: schedd_job_info true (costs the scheduler some work on a large queue)")


def check_spool(cell: Cell) -> Check:
    """The spool directory: writable here (made 0700 when missing), and the submit account's
    alone: mode 0700 (no group or other bits), owned by ``cell.submit_user`` where that account
    exists here. Runner records, logs and request records are in it (docs/deployment.md)."""
    try:
        os.makedirs(cell.spool_dir, mode=0o700, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=cell.spool_dir, prefix=".tco-doctor-"):
            pass
        info = os.stat(cell.spool_dir)
    except OSError as exc:
        return Check("spool", FAIL, f"{cell.spool_dir}: {exc}",
                     "make TCO_SPOOL_DIR a directory tco's account can write, on the file system every "
                     "execution host mounts at the same path")
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o077:
        return Check("spool", WARN, f"{cell.spool_dir} is mode {mode:04o}: other accounts can enter it "
                     "(agents' logs, outputs and model requests are in it)", f"chmod 700 {cell.spool_dir}")
    try:
        owner_uid = pwd.getpwnam(cell.submit_user).pw_uid
    except KeyError:
        owner_uid = None  # the account is not known on this host: the owner is not checked here
    if owner_uid is not None and info.st_uid != owner_uid:
        try:
            owner = pwd.getpwuid(info.st_uid).pw_name
        except KeyError:
            owner = str(info.st_uid)
        return Check("spool", WARN, f"{cell.spool_dir} is owned by {owner}, not the submit account "
                     f"{cell.submit_user}", f"chown {cell.submit_user} {cell.spool_dir}")
    return Check("spool", OK, f"{cell.spool_dir} is writable here and mode {mode:04o}; every execution host must "
                 "mount it at the same path (checked by a job, not here)")


def run_checks(cell: Cell, *, run: Callable[..., bytes] = run_command, drmaa: bool = True) -> list[Check]:
    """Every check of ``cell``, in the order a site admin fixes them."""
    checks = [check_cell_directory(cell), check_clients(cell, run), check_accounting(cell, run)]
    if drmaa:
        checks.append(check_drmaa(cell))
    checks += [check_operator(cell, run), check_schedd_job_info(cell, run), check_spool(cell)]
    return checks
