"""Why a task failed, in words, and whose failure it was (issue 23, finding 12).

A task's end comes from its accounting record (``failed``, ``exit_status``,
the execution host; accounting(5)) or, without one, from tco (``lost``). The
``failed`` code says where Grid Engine's shepherd stopped: codes that mean
the host, the shepherd or the scheduler failed the task are *infrastructure*
failures, which a campaign retries in one action (``launch.service.
campaign_retry(infrastructure_only=True)``); an exit status the agent chose
is the agent's; a limit the qmaster enforced is the task's; a deletion is
someone's decision. An execution host that crashed (its execd, shepherds and
agents killed) writes, when it comes back, one record per task it ran with
``failed`` 19, "before writing exit_status": "execution host sge-exec1 was
lost: the job's shepherd died before it wrote the exit status".
"""
from __future__ import annotations

import dataclasses

#: ``failed`` code -> what Grid Engine's shepherd was doing (accounting(5), sge_shepherd; SGE 8 and OCS 9).
FAILED_CODES: dict[int, str] = {
    1: "assumedly before the job started", 3: "before writing the job's configuration", 4: "before writing its PID",
    5: "reading the job's configuration", 6: "setting the processor set", 7: "before the prolog",
    8: "in the prolog", 9: "before starting the parallel environment", 10: "starting the parallel environment",
    11: "before starting the job", 12: "before stopping the parallel environment",
    13: "stopping the parallel environment", 14: "before the epilog", 15: "in the epilog",
    16: "releasing the processor set", 17: "through a signal", 18: "the shepherd returned an error",
    19: "before writing exit_status", 20: "finding an unexpected error file", 21: "recognizing the job",
    24: "migrating (checkpointing)", 25: "rescheduling", 26: "opening the output file",
    27: "finding the requested shell", 28: "changing to the working directory", 29: "setting up AFS",
    30: "an application error", 31: "reading the sgepasswd file", 32: "finding the user in the password file",
    33: "a wrong password", 34: "talking to the helper service", 35: "before the job in the helper service",
    36: "checking the configured daemons", 37: "the qmaster enforced a limit (h_rt, h_cpu or h_vmem)",
    38: "adding a supplementary group", 100: "assumedly after the job (killed or deleted)",
}
#: The host, its shepherd or the scheduler failed the task, not the agent: a retry may well succeed.
INFRASTRUCTURE_CODES = frozenset(set(range(1, 17)) | set(range(18, 30)) | set(range(31, 37)) | {38})
#: ``failed`` 19: the shepherd never wrote the job's exit status (it died with its host).
HOST_LOST_CODE = 19
#: The runner's own exit status for an internal error (execution/runner/config.py ``EXIT_INTERNAL``): with
#: no runner record, it could not write one (a full or unwritable spool, a runner bug).
RUNNER_INTERNAL_EXIT = 70

INFRASTRUCTURE = "infrastructure"
AGENT = "agent"
LIMIT = "limit"
ENDED = "ended"  # killed, deleted or stopped by a signal: someone's decision, not a fault


@dataclasses.dataclass(frozen=True)
class Failure:
    """Why a task did not end well: ``kind`` (``infrastructure``, ``agent``, ``limit``, ``ended``)
    and ``text`` in words, naming the host and the accounting code where there is one."""

    kind: str
    text: str

    @property
    def infrastructure(self) -> bool:
        return self.kind == INFRASTRUCTURE


def failure_of(*, state: str, failed_code: int | None, exit_status: int | None, host: str = "",
               runner: dict | None = None) -> Failure | None:
    """Why a task in ``state`` ended badly, from its accounting record's ``failed_code`` and
    ``exit_status``, its execution ``host`` and its ``runner`` record (a sandbox limit that stopped
    the agent: ``core.sandbox_limits.limit_reached``); None for a task that did not fail (or has not
    ended). A ``lost`` task (no accounting record came) is an infrastructure failure too."""
    from dashboards.core.sandbox_limits import limit_reached

    where = f" on {host}" if host else ""
    if state == "lost":
        return Failure(INFRASTRUCTURE, f"lost{where}: it left the queue and no accounting record came")
    if state != "failed":
        return None
    if failed_code == HOST_LOST_CODE:
        return Failure(INFRASTRUCTURE, f"execution host {host or '?'} was lost: the job's shepherd died before "
                                       f"it wrote the exit status (accounting: failed {failed_code}, before "
                                       "writing exit_status)")
    if failed_code in INFRASTRUCTURE_CODES:
        return Failure(INFRASTRUCTURE, f"the scheduler failed the task{where} {FAILED_CODES.get(failed_code, '')} "
                                       f"(accounting: failed {failed_code})")
    if runner is None and failed_code == 0 and exit_status == RUNNER_INTERNAL_EXIT:
        return Failure(INFRASTRUCTURE, f"tco's runner failed{where} before it could write its record (exit status "
                                       f"{exit_status}: an internal error, such as a full or unwritable spool; the "
                                       "job's stderr says which)")
    reached = limit_reached(runner)
    if reached is not None:
        return Failure(LIMIT, f"{reached}{where} (the sandbox stopped the agent; exit status {exit_status})")
    if failed_code == 37:
        return Failure(LIMIT, f"{FAILED_CODES[37]}{where} (accounting: failed 37)")
    if failed_code:
        return Failure(ENDED, f"ended {FAILED_CODES.get(failed_code, f'with failed code {failed_code}')}{where} "
                              f"(accounting: failed {failed_code}, exit status {exit_status})")
    return Failure(AGENT, f"the agent exited with status {exit_status}{where}")


def infrastructure_failed(campaign) -> int:
    """How many tasks of ``campaign`` the infrastructure failed (:func:`infrastructure_filter`)."""
    from dashboards.models import Task

    return Task.objects.filter(campaign=campaign).filter(infrastructure_filter()).count()


def infrastructure_filter():
    """A ``Task`` filter (Q) for the tasks whose failure is the infrastructure's: lost, failed with an
    infrastructure code, or failed by tco's runner without a record (what :func:`failure_of` calls
    ``infrastructure``)."""
    from django.db.models import Q

    return (Q(state="lost") | Q(state="failed", failed_code__in=sorted(INFRASTRUCTURE_CODES))
            | Q(state="failed", failed_code=0, exit_status=RUNNER_INTERNAL_EXIT, runner_record__isnull=True))
