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

tco's own parts fail tasks too, and those are infrastructure failures as well:
a runner that could not write its record (exit status 70 and no record), and a
task whose metering proxy never listened (issue 23/22): the runner record has
the flag ``proxy_error`` and no ``requests_path`` (execution/runner/proxy_start.py
``ProxyStarter.requests_file``: the proxy creates that file before it listens),
so the agent's model requests were refused and it never reached its model
API. Its exit status is then the agent giving up, not the agent's own failure:
"tco's metering proxy did not start on sge-exec1: the agent never reached its
model API (infrastructure, not the agent; runner: metering proxy did not start
in time; exit status 1)". A proxy that listened and failed to stop cleanly
(``proxy_error`` with a ``requests_path``) served the agent: that failure stays
the agent's. A sandbox limit the agent ran into, a signal to the runner (a
deletion, the scheduler's stop: the proxy may have been cut short by it) and a
non-zero ``failed`` code keep their own kind; so does a task that ended
``done`` (no failure).

The waste view (``billing.waste``) shows the infrastructure's failures apart
from the team's waste (:func:`infrastructure_filter`).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from django.db import connection

from dashboards.core.sandbox_limits import LIMIT_FLAGS

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
#: ``failed`` 7, "before prolog": what an execd back from a crash writes (all-zero times) for a job whose
#: shepherd had not yet written its pid file (seen in CI, 2026-12-03: a host crashed as its tasks started).
BEFORE_PROLOG_CODE = 7
#: The runner's own exit status for an internal error (execution/runner/config.py ``EXIT_INTERNAL``): with
#: no runner record, it could not write one (a full or unwritable spool, a runner bug).
RUNNER_INTERNAL_EXIT = 70
#: The runner record's flag for a metering proxy that failed to start or stop (docs/runner.md).
PROXY_ERROR_FLAG = "proxy_error"
#: Runner record flags that make a failure someone else's than the proxy's, even when it never listened:
#: the runner was signalled (the proxy's start may have been cut short by it), or a sandbox limit stopped the
#: agent (``core.sandbox_limits.LIMIT_FLAGS``; failure_of calls those ``limit`` first).
NOT_THE_PROXYS_FLAGS = ("runner_signalled", *LIMIT_FLAGS)

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
    if proxy_never_listened(runner):
        error = runner.get("error")
        said = f"runner: {error}; " if isinstance(error, str) and error.startswith("metering proxy") else ""
        return Failure(INFRASTRUCTURE, f"tco's metering proxy did not start{where}: the agent never reached its model "
                                       f"API (infrastructure, not the agent; {said}exit status {exit_status})")
    return Failure(AGENT, f"the agent exited with status {exit_status}{where}")


#: Grid Engine's failed code for a job that died through a signal (execd's reaper; "assumedly after job"):
#: a qdel's kill, but also an h_rt kill or the kernel's OOM killer taking the job.
SIGNALLED_CODE = 100


def decided_filter():
    """A ``Task`` filter (Q) for the failed tasks whose end was someone's decision through tco, not a fault:
    killed by a signal (failed :data:`SIGNALLED_CODE`) after a delete of their job was asked of tco
    (a campaign's cancel, a triage delete: a ``ControlRequest`` with control ``delete`` on the same cluster
    and job, made before the task ended). Failed 100 alone is not enough: the OOM killer and h_rt kills
    give it too. Used by the failure-burst alert and the failures tile, which leave these out."""
    from django.db.models import Exists, OuterRef, Q

    from dashboards.models import ControlRequest

    asked = ControlRequest.objects.filter(cluster=OuterRef("cluster"), job_number=OuterRef("job_number"),
                                          control="delete", created_at__lte=OuterRef("ended_at"))
    return Q(state="failed", failed_code=SIGNALLED_CODE) & Q(Exists(asked))


def proxy_never_listened(runner) -> bool:
    """Whether a runner record (a mapping, as ``Task.runner_record`` holds it; anything else is no
    record) says the task's metering proxy never listened, with nothing else to blame for the end:
    flag ``proxy_error``, no ``requests_path`` (null or absent), and none of
    :data:`NOT_THE_PROXYS_FLAGS`. The same rule as the database filter in
    :func:`infrastructure_filter`."""
    if not isinstance(runner, Mapping):
        return False
    flags = runner.get("flags")
    flags = flags if isinstance(flags, list) else []
    return (PROXY_ERROR_FLAG in flags and runner.get("requests_path") is None
            and not any(f in flags for f in NOT_THE_PROXYS_FLAGS))


def infrastructure_failed(campaign) -> int:
    """How many tasks of ``campaign`` the infrastructure failed (:func:`infrastructure_filter`)."""
    from dashboards.models import Task

    return Task.objects.filter(campaign=campaign).filter(infrastructure_filter()).count()


def infrastructure_filter():
    """A ``Task`` filter (Q) for the tasks whose failure is the infrastructure's: lost, failed with an
    infrastructure code, failed by tco's runner without a record, or failed with a metering proxy that
    never listened (:func:`proxy_never_listened`): what :func:`failure_of` calls ``infrastructure``.
    The SQL is :func:`infrastructure_sql`'s, the waste rollups' rule, on the task table itself (a
    queryset of ``Task``, not one that reaches tasks through a join)."""
    from django.db.models import BooleanField, Q
    from django.db.models.expressions import RawSQL

    from dashboards.models import Task

    table = connection.ops.quote_name(Task._meta.db_table)
    return Q(RawSQL(infrastructure_sql(table), [], output_field=BooleanField()))


def infrastructure_sql(alias: str) -> str:
    """SQL (SQLite or PostgreSQL, as the connection is; no parameters) that is true where the task row
    ``alias`` (a table name or alias, quoted as the query needs) failed by the infrastructure, as
    :func:`failure_of` decides it; false (never NULL) elsewhere. The runner record's flags and
    ``requests_path`` are read with the database's JSON functions (``json_each``/``json_type`` on SQLite,
    ``->``/``@>`` on PostgreSQL). Used by the waste rollups (``core.rollup_sql``) and by
    :func:`infrastructure_filter`."""
    t = alias
    postgres = connection.vendor == "postgresql"

    def has_flag(flag: str) -> str:
        if postgres:
            return f"COALESCE({t}.runner_record -> 'flags', '[]'::jsonb) @> '[\"{flag}\"]'::jsonb"
        return f"EXISTS (SELECT 1 FROM json_each({t}.runner_record, '$.flags') WHERE value = '{flag}')"

    no_requests_path = (f"COALESCE({t}.runner_record -> 'requests_path', 'null'::jsonb) = 'null'::jsonb" if postgres
                        else f"COALESCE(json_type({t}.runner_record, '$.requests_path'), 'null') = 'null'")
    codes = ", ".join(str(c) for c in sorted(INFRASTRUCTURE_CODES))
    failed = f"{t}.state = 'failed'"
    proxy = " AND ".join([failed, f"COALESCE({t}.failed_code, 0) = 0", has_flag(PROXY_ERROR_FLAG), no_requests_path,
                          *(f"NOT {has_flag(f)}" for f in NOT_THE_PROXYS_FLAGS)])
    rule = (f"{t}.state = 'lost' OR ({failed} AND {t}.failed_code IN ({codes}))"
            f" OR ({failed} AND {t}.failed_code = 0 AND {t}.exit_status = {RUNNER_INTERNAL_EXIT}"
            f" AND {t}.runner_record IS NULL) OR ({proxy})")
    return f"COALESCE(({rule}), {'false' if postgres else '0'})"
