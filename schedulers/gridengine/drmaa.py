"""The DRMAA session of this process (drmaa 0.7.9 over Grid Engine's libdrmaa).

DRMAA allows one session per process. It is opened lazily on the first
submission, or explicitly with :func:`open_session` from Celery's
``worker_process_init`` signal (never at import time, and never in a parent
that forks afterwards: a forked child inherits a session it cannot use).
It is closed at interpreter exit.

The library is the flavour's (:mod:`.flavours`): ``DRMAA_LIBRARY_PATH`` when
the environment sets it, else ``$SGE_ROOT/lib/<arch>/libdrmaa.so.1.0`` or
Debian's ``/usr/lib/gridengine-drmaa/lib/libdrmaa.so.1.0`` (sge8),
``$SGE_ROOT/lib/<arch>/libdrmaa.so`` (ocs9); python-drmaa reads the variable
at import. Debian's SGE 8 libdrmaa links jemalloc, whose initial-exec TLS
cannot be loaded late ("cannot allocate memory in static TLS block"): such a
process needs ``LD_PRELOAD=/usr/lib/x86_64-linux-gnu/libjemalloc.so.2`` in
the environment *that starts Python* (systemd unit, supervisor, the shell
that runs celery). OCS 9's libdrmaa needs no preload.

Closing. ``drmaa_exit`` unregisters the session's JAPI event client at the
qmaster. OCS 9's qmaster refuses that from a user who is not a manager, and
the library then waits for the next event delivery, every
``SGE_JAPI_EDTIME`` seconds (30 by default; read from the environment when
the session opens): a process that opened a session took about 31 s to stop.
So (1) a session is opened once per process and never closed per call;
(2) :func:`open_session` sets ``SGE_JAPI_EDTIME`` to
:data:`JAPI_EDTIME_S` when the environment does not set it (an event
delivery interval of 5 s instead of 30: a little more event traffic for
tco's one session per submitting process), and ``SGE_JAPI_FLUSH_DELAY_RATE``
to :data:`JAPI_FLUSH_DELAY_S` (libdrmaa refuses a flush delay longer than
the delivery interval); (3) :func:`close_session` runs
``drmaa_exit`` in a helper thread and waits at most ``timeout`` seconds
(default :data:`CLOSE_TIMEOUT_S`); if the qmaster has not let go by then, the
process stops anyway and the qmaster drops the event client when it times
out. Jobs are never lost by that: tco does not wait for jobs through DRMAA.

Sources: drmaa_attributes(3), drmaa_jobtemplate(3), drmaa_submit(3) of SGE
8.1.9; ``japi_implementation_thread`` in source/libs/japi/japi.c(c) of SGE and
OCS (``SGE_JAPI_EDTIME``).
"""
from __future__ import annotations

import atexit
import logging
import os
import re
import threading
from typing import Any, Sequence

from schedulers.base import (ArrayJobSpec, SchedulerCommandError, SchedulerError, SchedulerParseError,
                             SchedulerUnavailable)

from .commands import DEFAULT_SGE_CELL, DEFAULT_SGE_ROOT
from .flavours import DEBIAN_DRMAA_LIBRARY, JEMALLOC_PRELOAD, defaults_for, detect_flavour

log = logging.getLogger(__name__)

DEFAULT_DRMAA_LIBRARY_PATH = DEBIAN_DRMAA_LIBRARY
#: ``SGE_JAPI_EDTIME`` (seconds) set when the environment has none (see above), and
#: ``SGE_JAPI_FLUSH_DELAY_RATE`` with it: libdrmaa's default flush delay (6 s) may not
#: exceed the delivery time ("event flush delay may not be greater than event
#: delivery time", seen on SGE 8.1.9 with an edtime of 5).
JAPI_EDTIME_S = 5
JAPI_FLUSH_DELAY_S = 1
#: How long :func:`close_session` waits for ``drmaa_exit`` (seconds).
CLOSE_TIMEOUT_S = 0.5

_lock = threading.RLock()
_session: Any = None
_session_pid: int | None = None
_atexit_registered = False


def library_path(flavour: str = "sge8", sge_root: str | None = None) -> str:
    """The libdrmaa this process loads: ``DRMAA_LIBRARY_PATH`` if set, else the flavour's."""
    return os.environ.get("DRMAA_LIBRARY_PATH") or defaults_for(flavour).drmaa_library(
        sge_root or os.environ.get("SGE_ROOT") or DEFAULT_SGE_ROOT)


def load_drmaa(flavour: str = "sge8", sge_root: str | None = None):
    """Import the ``drmaa`` package (which dlopens libdrmaa) and return it.

    ``DRMAA_LIBRARY_PATH`` defaults to :func:`library_path` of ``flavour``.
    Raises SchedulerUnavailable with the fix in the message when libdrmaa
    cannot be found or loaded (the static TLS trap above).
    """
    os.environ.setdefault("DRMAA_LIBRARY_PATH", library_path(flavour, sge_root))
    try:
        import drmaa  # noqa: PLC0415 - loading libdrmaa is deliberately lazy
    except OSError as exc:
        text = str(exc)
        if "static TLS" in text:
            raise SchedulerUnavailable(
                f"libdrmaa could not be loaded: {text}. Start this process with "
                f"LD_PRELOAD={JEMALLOC_PRELOAD} in its environment (it must be set before the "
                f"Python interpreter starts; setting it from Python is too late)."
            ) from exc
        raise SchedulerUnavailable(
            f"libdrmaa could not be loaded from DRMAA_LIBRARY_PATH="
            f"{os.environ.get('DRMAA_LIBRARY_PATH')}: {text}. Install gridengine-drmaa1.0 (SGE 8 on "
            f"Debian) or set DRMAA_LIBRARY_PATH to $SGE_ROOT/lib/<arch>/libdrmaa.so (OCS 9)."
        ) from exc
    except RuntimeError as exc:  # python-drmaa: "Could not find drmaa library"
        raise SchedulerUnavailable(f"{exc} (DRMAA_LIBRARY_PATH={os.environ.get('DRMAA_LIBRARY_PATH')})") from exc
    except ImportError as exc:
        raise SchedulerUnavailable(f"the drmaa Python package is not installed: {exc}") from exc
    return drmaa


def _process_flavour() -> str:
    """The flavour of a session opened without one (Celery's worker_process_init):
    ``TCO_SCHEDULER_FLAVOUR``, else detected from the installation, else ``sge8``."""
    configured = os.environ.get("TCO_SCHEDULER_FLAVOUR")
    if configured or os.environ.get("DRMAA_LIBRARY_PATH"):
        return configured or "sge8"
    try:
        return detect_flavour(os.environ["SGE_ROOT"], os.environ["SGE_CELL"]).flavour
    except SchedulerError:
        return "sge8"


def open_session(*, sge_root: str | None = None, sge_cell: str | None = None, flavour: str | None = None,
                 ports: dict[str, str] | None = None):
    """Open (or return) this process's DRMAA session.

    ``flavour`` (default: :func:`_process_flavour`) picks the default libdrmaa; ``SGE_JAPI_EDTIME`` defaults to
    :data:`JAPI_EDTIME_S`.

    ``sge_root``/``sge_cell`` default the process's ``SGE_ROOT``/``SGE_CELL``
    (libdrmaa reads them from the process environment), and ``ports``
    (``SGE_QMASTER_PORT``, ``SGE_EXECD_PORT``) are set there too for a cell on
    other ports than ``/etc/services`` names. Calling it again in
    the same process returns the same session; asking for a different cell
    than the open session's raises SchedulerUnavailable.

    Raises SchedulerUnavailable (library not loadable, qmaster unreachable,
    session inherited through fork).
    """
    global _session, _session_pid, _atexit_registered
    with _lock:
        pid = os.getpid()
        if _session is not None and _session_pid == pid:
            _check_cell(sge_root, sge_cell, ports)
            return _session
        if _session is not None and _session_pid != pid:
            # Forked after the parent opened a session: libdrmaa's state in
            # this copy refers to the parent's connection and cannot be used.
            raise SchedulerUnavailable(
                "a DRMAA session was opened before this process was forked; open it in each "
                "worker process (Celery: worker_process_init), not in the parent")
        if sge_root:
            os.environ["SGE_ROOT"] = sge_root
        if sge_cell:
            os.environ["SGE_CELL"] = sge_cell
        os.environ.update(ports or {})
        os.environ.setdefault("SGE_ROOT", DEFAULT_SGE_ROOT)
        os.environ.setdefault("SGE_CELL", DEFAULT_SGE_CELL)
        if "SGE_JAPI_EDTIME" not in os.environ:
            os.environ["SGE_JAPI_EDTIME"] = str(JAPI_EDTIME_S)
            os.environ.setdefault("SGE_JAPI_FLUSH_DELAY_RATE", str(JAPI_FLUSH_DELAY_S))
        drmaa = load_drmaa(flavour or _process_flavour(), os.environ["SGE_ROOT"])
        session = drmaa.Session()
        try:
            session.initialize()
        except drmaa.errors.AlreadyActiveSessionException as exc:
            raise SchedulerUnavailable(
                "libdrmaa already has an active session in this process (opened outside "
                "schedulers.gridengine.drmaa, or inherited through fork)") from exc
        except drmaa.errors.DrmaaException as exc:
            raise SchedulerUnavailable(f"DRMAA session could not be opened: {exc}") from exc
        _session, _session_pid = session, pid
        if not _atexit_registered:
            atexit.register(close_session)
            _atexit_registered = True
        log.info("DRMAA session opened (pid %s, %s)", pid, session.contact)
        return session


def _check_cell(sge_root: str | None, sge_cell: str | None, ports: dict[str, str] | None = None) -> None:
    for name, wanted in (("SGE_ROOT", sge_root), ("SGE_CELL", sge_cell), *(ports or {}).items()):
        if wanted and os.environ.get(name) != wanted:
            raise SchedulerUnavailable(
                f"this process's DRMAA session is bound to {name}={os.environ.get(name)}, "
                f"not {wanted}; submit to another cell from another process")


def close_session(timeout: float = CLOSE_TIMEOUT_S) -> bool:
    """Close this process's session if it opened one (idempotent; logs, never raises).

    ``drmaa_exit`` runs in a daemon thread, waited for at most ``timeout``
    seconds (see "Closing" above). Returns True when the session was closed
    (or there was none), False when the process goes on without waiting.
    """
    global _session, _session_pid
    with _lock:
        session, pid = _session, _session_pid
        _session, _session_pid = None, None
        if session is None or pid != os.getpid():
            return True

        def exit_session() -> None:
            try:
                session.exit()
            except Exception:  # noqa: BLE001 - at exit there is nobody to tell but the log
                log.warning("closing the DRMAA session failed", exc_info=True)

        closer = threading.Thread(target=exit_session, name="drmaa-exit", daemon=True)
        closer.start()
        closer.join(timeout)
        if closer.is_alive():
            log.warning("drmaa_exit did not return within %.1f s (the qmaster refuses a non-manager's "
                        "event client shutdown until SGE_JAPI_EDTIME); going on without it", timeout)
            return False
        return True


def _map_drmaa_error(drmaa, exc: Exception, what: str) -> Exception:
    errors = drmaa.errors
    if isinstance(exc, (errors.DrmCommunicationException, errors.TryLaterException,
                        errors.NoActiveSessionException, errors.DrmsExitException)):
        return SchedulerUnavailable(f"{what}: {exc}")
    return SchedulerCommandError(f"{what} refused: {exc}", argv=["drmaa", what], stderr=str(exc))


def template_attributes(spec: ArrayJobSpec, native_specification: str) -> dict[str, Any]:
    """The DRMAA job template attributes (drmaa_attributes(3)) of ``spec``, by attribute name:
    ``remoteCommand``, ``args``, ``jobName``, ``nativeSpecification`` (built and validated by the
    caller from the same spec), ``jobEnvironment``, ``workingDirectory``, and ``outputPath``/
    ``errorPath`` in DRMAA's ``[host]:path`` form (no host: any)."""
    return {
        "remoteCommand": spec.command,
        "args": list(spec.args),
        "jobName": spec.name,
        "nativeSpecification": native_specification,
        "jobEnvironment": dict(spec.environment),
        "workingDirectory": spec.working_directory,
        "outputPath": ":" + spec.output_path,
        "errorPath": ":" + spec.error_path,
    }


def run_bulk(spec: ArrayJobSpec, native_specification: str, *, sge_root: str | None = None,
             sge_cell: str | None = None, flavour: str | None = None,
             ports: dict[str, str] | None = None) -> tuple[int, list[int]]:
    """Submit ``spec`` as one array job of tasks 1..``spec.count`` (``runBulkJobs(jt, 1, count, 1)``),
    held when ``spec.hold``, with the job template of :func:`template_attributes`.

    ``spec`` and ``native_specification`` are already validated by the caller (the adapter);
    ``sge_root``/``sge_cell``/``flavour``/``ports`` choose the session (:func:`open_session`).
    Returns ``(job_number, task_numbers)`` read from ids like ``"123.1"``.

    Raises SchedulerUnavailable, SchedulerCommandError, SchedulerParseError.
    """
    with _lock:
        session = open_session(sge_root=sge_root, sge_cell=sge_cell, flavour=flavour, ports=ports)
        drmaa = load_drmaa(flavour or "sge8", sge_root)
        try:
            jt = session.createJobTemplate()
        except drmaa.errors.DrmaaException as exc:
            raise _map_drmaa_error(drmaa, exc, "createJobTemplate") from exc
        try:
            for name, value in template_attributes(spec, native_specification).items():
                setattr(jt, name, value)
            if spec.hold:
                jt.jobSubmissionState = drmaa.JobSubmissionState.HOLD_STATE
            ids = session.runBulkJobs(jt, 1, spec.count, 1)
        except drmaa.errors.DrmaaException as exc:
            raise _map_drmaa_error(drmaa, exc, "runBulkJobs") from exc
        finally:
            try:
                session.deleteJobTemplate(jt)
            except drmaa.errors.DrmaaException:
                log.warning("deleteJobTemplate failed", exc_info=True)
    return parse_job_ids(list(ids))


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
