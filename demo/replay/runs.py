"""The replay's three runs (demo/replay/__init__.py): two teams, a sweep with review agents, the bill.
"""
from __future__ import annotations

import datetime as dt
import time
import urllib.request
from pathlib import Path
from typing import Callable, Sequence

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from dashboards.billing import bills, periods
from dashboards.core import enqueue
from dashboards.core.clusters import cluster_get_default
from dashboards.launch.service import LaunchRequest, launch, urgent_launch
from dashboards.launch.spool import team_sweeps_dir
from dashboards.models import (
    AccountingRecord,
    AgentDefinition,
    ModelEndpoint,
    Task,
    Team,
)
from demo.replay.figures import (
    launch_figures,
    running_over_time,
    stage_medians,
    urgent_wait,
)
from demo.replay.options import (
    CRASH_REASONS,
    WORK_MEDIAN_S,
    ReplayError,
    ReplayOptions,
    median,
    work_durations,
)
from demo.replay.waiting import Ingest, finished, submitted
from demo.sweep import review_agreement, sweep_review_launch, sweep_submit
from demo.watch.live import LiveWatch
from demo.watch.samplers import service_pids
from schedulers.gridengine.commands import run_command

__all__ = ["run_teams", "run_sweep", "stand_in_answers", "qacct_wallclock", "bill_check"]


def run_teams(*, user: AbstractBaseUser, opts: ReplayOptions, ingest: Ingest, log: Callable[[str], None]) -> dict:
    """Run 1 (module doc). Returns the campaigns, launch figures, stage medians, running counts,
    the urgent agent's figures and, with ``opts.live``, the live lag and load (``"live"``)."""
    watch = _live_watch(opts, ingest, log) if opts.live else None
    try:
        return _run_teams(user=user, opts=opts, ingest=ingest, log=log, watch=watch)
    finally:
        ingest.poll_qstat = True
        if watch:
            watch.stop()   # already stopped when the run went well


def _run_teams(*, user: AbstractBaseUser, opts: ReplayOptions, ingest: Ingest, log: Callable[[str], None],
               watch: LiveWatch | None) -> dict:
    teams = [Team.objects.get(project="research"), Team.objects.get(project="engineering")]
    agent = AgentDefinition.objects.get(name="demo-agent", version=1)
    work = work_durations(opts.agents, scale=opts.work_scale, seed=opts.seed)
    halves = [work[: opts.agents // 2], work[opts.agents // 2:]]
    ingest.poll_qstat = watch is None   # measured: the product's own poll, not this loop's
    # The launch form's web process has its broker producer warm from its start (tco_web/asgi.py);
    # this process launches as that one, not as a cold process paying kombu's first send (0.3 s).
    enqueue.warm()
    called_at = timezone.now()
    campaigns = []
    for team, durations in zip(teams, halves):
        inputs = [{"task": n, "duration_s": d} for n, d in enumerate(durations, start=1)]
        campaigns.append(launch(user=user, request=LaunchRequest(
            team=team, agent_definition=agent, inputs=inputs, name=f"replay-{team.project}")).campaign)
    if watch and not opts.submit_here:
        watch.follow(campaigns)   # the admin's pages open while the submit worker submits
    campaigns = submitted(campaigns, submit_here=opts.submit_here)
    if watch and opts.submit_here:
        watch.follow(campaigns)
    log(f"run 1: campaigns {[c.pk for c in campaigns]} submitted as jobs {[c.job_number for c in campaigns]}")

    # The urgent agent: once the first wave runs (an agent has started and half a work median
    # has passed), while the others queue.
    ids = [c.pk for c in campaigns]
    half = WORK_MEDIAN_S * opts.work_scale / 2
    ingest.until(lambda: Task.objects.filter(campaign_id__in=ids, agent_started_at__isnull=False).exists(),
                 timeout_s=opts.timeout_s, poll_s=opts.poll_s / 4, what="the first agent of run 1")
    first = Task.objects.filter(campaign_id__in=ids, agent_started_at__isnull=False) \
        .order_by("agent_started_at").values_list("agent_started_at", flat=True).first()
    time.sleep(max(0.0, first.timestamp() + half - time.time()))
    ingest.step()
    queued = Task.objects.filter(campaign_id__in=ids, state="pending").count()
    urgent_called = timezone.now()
    urgent = urgent_launch(user=user, team=teams[0], agent_definition=agent, name="replay-urgent",
                           input={"task": 1, "duration_s": round(WORK_MEDIAN_S * opts.work_scale, 1)}).campaign
    urgent = submitted([urgent], submit_here=opts.submit_here)[0]
    log(f"run 1: urgent agent (campaign {urgent.pk}, job {urgent.job_number}) launched with {queued} tasks queued")
    if watch:
        watch.follow([urgent])
    try:
        ingest.until(finished([*ids, urgent.pk], since=called_at), timeout_s=opts.timeout_s, poll_s=opts.poll_s,
                     what="run 1's agents and their accounting")
    finally:
        ingest.poll_qstat = True
        if watch:
            watch.stop()
    tasks = list(Task.objects.filter(campaign_id__in=ids))
    utask = Task.objects.get(campaign=urgent)
    return {
        "campaigns": campaigns, "urgent": urgent, "called_at": called_at,
        "launch": launch_figures(campaigns, called_at), "stages": stage_medians(tasks),
        "work_median_input_s": median(work),
        "running": running_over_time([*tasks, utask], step_s=max(1.0, round(WORK_MEDIAN_S * opts.work_scale / 2))),
        "urgent_queued_behind": queued,
        **urgent_wait(urgent, utask),
        "urgent_from_call_s": (utask.task_started_at - urgent_called).total_seconds(),
        "urgent_submit_s": urgent.submit_seconds,
        "live": watch.results() if watch else None,
    }


def _live_watch(opts: ReplayOptions, ingest: Ingest, log: Callable[[str], None]) -> LiveWatch:
    """Items 4 and 5: the qstat sampler, the admin's and ``opts.watchers`` clients' queue sockets and
    the load sampler, started (demo/watch/). Raises ReplayError when the web server does not answer."""
    import os

    from django.contrib.auth import get_user_model

    base = opts.web_url or f"http://127.0.0.1:{os.environ.get('TCO_PORT', '8000')}"
    admin = get_user_model().objects.filter(is_superuser=True, is_active=True).order_by("pk").first()
    if admin is None:
        raise ReplayError("no active admin to watch the run as (run manage.py tco_bootstrap first)")
    pids = opts.pids if opts.pids is not None else service_pids(Path(settings.STATE_DIR))
    watch = LiveWatch(base_url=base, watchers=opts.watchers, list_tasks=ingest.scheduler.list_tasks, admin=admin,
                      qstat_period_s=opts.qstat_sample_s, pids=pids, log=log)
    try:
        watch.start()
    except OSError as exc:
        raise ReplayError(f"the web server does not answer on {base} ({exc}): start it (make demo / scripts/services "
                          "start), name it with --web-url, or pass --no-live") from exc
    log(f"run 1: watching from qstat (every {opts.qstat_sample_s} s) and {1 + opts.watchers} browser client(s) "
        f"on {base}; memory of {sorted(pids) or 'no processes'}")
    return watch


def stand_in_answers(endpoint: ModelEndpoint, timeout: float = 5.0) -> bool:
    """True when the stand-in model answers on the endpoint (its ``/_stand_in/served`` page)."""
    try:
        with urllib.request.urlopen(f"{endpoint.scheme}://{endpoint.host}:{endpoint.port}/_stand_in/served",
                                    timeout=timeout) as resp:
            return resp.status == 200
    except OSError:
        return False


def run_sweep(*, user: AbstractBaseUser, opts: ReplayOptions, ingest: Ingest, out_dir: Path,
              log: Callable[[str], None]) -> dict:
    """Run 2 (module doc). Returns launch figures, stage medians of the review agents, the wait on
    the predecessor apart from the queue wait, agreement and crashed runs found."""
    team = Team.objects.get(project="engineering")
    endpoint = ModelEndpoint.objects.filter(name=opts.endpoint, active=True).first()
    if endpoint is None:
        raise ReplayError(f"model endpoint {opts.endpoint!r} is not registered (manage.py tco_bootstrap)")
    if not stand_in_answers(endpoint):
        raise ReplayError(f"the stand-in model does not answer at {endpoint.base_url} (make demo starts it; "
                          "or manage.py tco_sweep_review --start-model)")
    # Under the team's <state dir>/sweeps/<project>/: its demo ceiling lets its review agents read there.
    runs = team_sweeps_dir(team.project) / f"replay-{out_dir.name}"
    sweep_called = timezone.now()
    sweep_job, _ = sweep_submit(team=team, count=opts.sweep, out_dir=runs, name="replay", scheduler=ingest.scheduler)
    called_at = timezone.now()
    campaign = sweep_review_launch(user=user, team=team, sweep_job=sweep_job, runs_dir=runs, count=opts.sweep,
                                   endpoint=endpoint.name, name="replay-review")
    campaign = submitted([campaign], submit_here=opts.submit_here)[0]
    log(f"run 2: sweep job {sweep_job} on classic.q, review campaign {campaign.pk} job {campaign.job_number}")
    ingest.until(finished([campaign.pk], [sweep_job], since=sweep_called), timeout_s=opts.timeout_s,
                 poll_s=opts.poll_s, what="run 2's sweep, reviews and accounting")

    tasks = list(Task.objects.filter(campaign=campaign).order_by("task_number"))
    records = AccountingRecord.objects.filter(job_number=sweep_job,
                                              submission_us__gte=int(sweep_called.timestamp() - 1) * 1_000_000)
    sweep_end = {r.task_number: r.ended_at for r in records}
    sweep_exit = {r.task_number: r.exit_status for r in records}
    on_predecessor, after_hold = [], []
    for t in tasks:
        end = sweep_end.get(t.task_number)
        if end is None or t.submitted_at is None or t.task_started_at is None:
            continue
        released = max(t.submitted_at, end)
        on_predecessor.append((released - t.submitted_at).total_seconds())
        after_hold.append((t.task_started_at - released).total_seconds())
    result = review_agreement(campaign=campaign, runs_dir=runs)
    crashed = [r for r in result["rows"] if r["reason"] in CRASH_REASONS]
    return {
        "campaign": campaign, "sweep_job": sweep_job, "launch": launch_figures([campaign], called_at),
        "stages": stage_medians(tasks), "predecessor_wait_s": median(on_predecessor),
        "queue_after_hold_s": median(after_hold), "agreement": result,
        "crashed": len(crashed), "crashed_found": sum(1 for r in crashed if r["agent"] == "bad"),
        "crashed_by_reason": {reason: (sum(1 for r in crashed if r["reason"] == reason and r["agent"] == "bad"),
                                       sum(1 for r in crashed if r["reason"] == reason))
                              for reason in CRASH_REASONS},
        "sweep_failed": sum(1 for v in sweep_exit.values() if v), "runs_dir": runs,
    }


def qacct_wallclock(project: str, begin: dt.datetime, end: dt.datetime, accounting_path: str) -> float:
    """WALLCLOCK of ``qacct -f FILE -P PROJECT -b BEGIN -e END`` (run by the scheduler layer's
    :func:`run_command`, fixed argv, TZ=UTC; ``begin``/``end`` UTC instants, end included as
    qacct does); 0 when qacct lists nothing. Raises SchedulerError."""
    utc = dt.timezone.utc
    out = run_command(["qacct", "-f", accounting_path, "-P", project, "-b", periods.qacct_time(begin, utc),
                       "-e", periods.qacct_time(end, utc)], timeout=120).decode(errors="replace")
    for line in out.splitlines():
        parts = line.split()
        if parts and parts[0] == project:
            return float(parts[1])
    return 0.0


def bill_check(*, since: dt.datetime, teams: Sequence[Team]) -> dict:
    """Run 3: tco's bill per team for the days from ``since`` to now (the cluster's time zone)
    beside ``qacct -P`` over the same instants. Returns ``{"first", "last", "rows": [{"team",
    "project", "bill_wallclock_s", "qacct_wallclock_s", "equal", "tokens", "cost_usd"}]}``."""
    cluster = cluster_get_default()
    tz = periods.cluster_zone(cluster)
    first, last = since.astimezone(tz).date(), timezone.now().astimezone(tz).date()
    result = bills.bill(teams=teams, period="day", first=first, last=last, group_by="team", clusters=[cluster])
    begin = periods.period_bounds(first, "day", tz)[0]
    end = periods.period_bounds(last, "day", tz)[1] - dt.timedelta(seconds=1)
    rows = []
    for team in teams:
        mine = [r for r in result["rows"] if r["project"] == team.project]
        wall = sum(r["wallclock_s"] for r in mine)   # tco's and not-tco usage: qacct -P counts both
        theirs = qacct_wallclock(team.project, begin, end, cluster.accounting_path)
        rows.append({"team": team.name, "project": team.project, "bill_wallclock_s": wall,
                     "qacct_wallclock_s": theirs, "equal": round(wall) == round(theirs),
                     "tokens": sum(r["total_tokens"] for r in mine if r["launched_by_tco"]),
                     "cost_usd": sum((r["cost_usd"] for r in mine if r["launched_by_tco"]), start=0)})
    return {"first": first, "last": last, "time_zone": str(tz), "rows": rows}
