"""The seed replay (issue 15): the source article's runs through tco, its table beside ours.

The article (shared/seeds/001, "A real run: 410 agents, 96 slots") reports
three runs on a GCS cluster; :func:`replay` runs them through tco's own launch
service (:func:`dashboards.launch.service.launch`, the launch form's path), the submit
worker (or, with ``submit_here``, :func:`dashboards.launch.submit.campaign_submit`
in this process), the runner and its sandboxes on the configured cluster:

1. **Two teams, one cluster**: research and engineering launch ``agents``
   demo agents together (half each); their work is drawn from a log-normal
   distribution with the article's median agent work (21.9 s x
   ``work_scale``); agent.q's RQS and the model-seat consumable let 96 run at
   a time and the share tree decides who goes next. One urgent agent
   (``urgent_launch``) is launched once the first wave runs and the rest queue.
2. **A classic job with agents on its outcome**: the demo sweep
   (:func:`demo.sweep.sweep_submit`) on classic.q and one review agent per run
   chained with ``-hold_jid_ad`` (:func:`demo.sweep.sweep_review_launch`),
   talking to the scripted stand-in model through the metering proxy.
3. **The bill**: wall clock per team from :func:`dashboards.billing.bills.bill`
   beside ``qacct -P`` for the same period; tokens and dollars from metering.

Every figure comes from timestamps of the run: the runner records' stages
(``Task.task_started_at`` .. ``teardown_done_at``), the scheduler's submission
time (qstat), the campaign's ``launched_at``/``submitted_at`` (the launch
service and the DRMAA call) and the accounting records. The wall-clock
instant read just before each launch call is the one figure taken here.
While it waits, the replay runs its own ingest loop (qstat poll, runner
records, accounting), which is safe beside the workers' (issue 15 item 6).

With ``live`` (the default), run 1 is also watched from qstat and from
WebSocket clients of the live pages, an admin's and ``watchers`` users' of
both teams (:mod:`demo.watch`; issue 15 items 4 and 5): the lag from a change
in qstat to the browser, every client's changes against what it may see, and
the memory and page times of the web server and workers, printed as their own
section after run 1. Meanwhile the loop leaves the qstat poll to the workers.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import math
import random
import statistics
import time
import urllib.request
from pathlib import Path
from typing import Any, Callable, Sequence

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.utils import timezone

from dashboards.billing import bills
from dashboards.billing import periods
from dashboards.core.clusters import cluster_get_default, scheduler_for
from dashboards.ingest.poll import apply_qstat_poll
from dashboards.ingest.accounting import ingest_accounting
from dashboards.ingest.runner_records import ingest_runner_records
from dashboards.launch.service import LaunchRequest, launch, urgent_launch
from dashboards.models import AccountingRecord, AgentDefinition, Campaign, ModelEndpoint, Task, Team
from dashboards.launch.submit import campaign_submit
from dashboards.launch.spool import team_sweeps_dir
from dashboards.core.stages import task_stages
from demo.reference_checker import SCRIPTED_CAVEAT
from demo.sweep import review_agreement, sweep_review_launch, sweep_submit
from demo.watch import LAG_GOAL_S, LiveWatch, live_figures, render_live, service_pids
from schedulers.gridengine.commands import run_command

#: The article's figures (its stage table is the medians of the 256 review agents; seconds).
ARTICLE = {
    "submit": 0.04,
    "integration_overhead": 2.0,   # "under 2"
    "sandbox_start": 13.0,
    "agent_work": 21.9,
    "queue_wait": 38.7,
    "all_in_scheduler_s": 5.2,     # 256 sandboxes, command-line qsub
    "first_running_s": 13.4,
    "submissions_per_min": 2950.0,
    "urgent_wait_s": 0.0,
    "review_agreement": 0.93,
}
#: The issue's goals: (figure, comparison, bound) checked by :func:`goals`.
GOAL_FACTOR = 10.0
URGENT_GOAL_S = 2.0
#: Spread of the demo agents' work: ln(work) ~ N(ln(median), WORK_SIGMA), clipped to [0.5, 2] x median.
WORK_SIGMA = 0.25
WORK_MEDIAN_S = ARTICLE["agent_work"]
#: The reference checker's reasons that mean a crashed run: the log says so, or just stops (an abort).
CRASH_REASONS = ("crashed", "no_summary")


#: Why a stage goal can be missed on the dev cluster (shown with a missed goal).
WHY = {
    "sandbox_start": "bubblewrap's start (namespaces, mounts of the policy) on a host whose cores the "
                     "running agents share",
    "integration_overhead": "the runner's own steps around the sandbox (its interpreter's start, the metering "
                            "proxy, output collection, the runner record) on 2 cores shared by up to 96 running "
                            "agents and their sandboxes",
}


class ReplayError(Exception):
    """The replay cannot go on (a missing team, agent, endpoint or worker; a timeout)."""


@dataclasses.dataclass
class ReplayOptions:
    """What to replay. ``agents``: tasks of run 1 (split between the teams); ``sweep``: sweep runs
    and review agents of run 2 (0 skips it); ``work_scale``: factor on the agents' work median;
    ``submit_here``: submit in this process instead of waiting for the submit worker;
    ``timeout_s``: the longest the replay waits for a run; ``poll_s``: ingest loop period."""

    agents: int = 410
    sweep: int = 256
    work_scale: float = 1.0
    submit_here: bool = False
    timeout_s: float = 1800.0
    poll_s: float = 1.0
    endpoint: str = "demo-stand-in"
    user: str = "admin"
    out_dir: Path | None = None
    seed: int = 410
    #: Items 4 and 5 (demo/watch.py): ``live`` watches run 1 from qstat and from the browser (an
    #: admin's sockets); ``watchers`` more clients of both teams; the web server at ``web_url``
    #: (default ``http://127.0.0.1:$TCO_PORT``); ``pids``: processes whose memory is sampled
    #: (default: scripts/services' pid files); ``qstat_sample_s``: the sampler's period.
    live: bool = True
    watchers: int = 50
    web_url: str | None = None
    pids: dict[str, int] | None = None
    qstat_sample_s: float = 0.25


def work_durations(count: int, *, scale: float = 1.0, seed: int = 410) -> list[float]:
    """``count`` agent work times in seconds: log-normal with median ``WORK_MEDIAN_S * scale`` and
    sigma ``WORK_SIGMA`` (of the logarithm), clipped to half and twice the median, 0.1 s resolution;
    seeded, so a replay is repeatable."""
    rng = random.Random(seed)
    median = WORK_MEDIAN_S * scale
    out = []
    for _ in range(count):
        value = median * math.exp(rng.gauss(0.0, WORK_SIGMA))
        out.append(round(min(max(value, median / 2), median * 2), 1))
    return out


def median(values: Sequence[float | None]) -> float | None:
    """The median of the values that are not None (None when there are none)."""
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


# --------------------------------------------------------------------------- waiting

class Ingest:
    """tco's ingest steps, run in a loop by the replay: qstat poll, runner records, accounting.

    ``poll_qstat`` False leaves the qstat poll to the workers' (while the replay measures the live
    lag, its own poll would push changes the product's poll had not yet seen)."""

    def __init__(self, cluster, *, poll_qstat: bool = True):
        self.cluster = cluster
        self.scheduler = scheduler_for(cluster)
        self.poll_qstat = poll_qstat

    def step(self) -> None:
        if self.poll_qstat:
            observed = timezone.now()
            apply_qstat_poll(self.cluster, self.scheduler.list_tasks(), observed_at=observed)
        ingest_runner_records(self.cluster)
        ingest_accounting(self.cluster)

    def until(self, done: Callable[[], bool], *, timeout_s: float, poll_s: float, what: str) -> None:
        """Step until ``done()``; raises ReplayError after ``timeout_s`` seconds."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.step()
            if done():
                return
            if time.monotonic() >= deadline:
                raise ReplayError(f"timed out after {timeout_s:.0f} s waiting for {what}")
            time.sleep(poll_s)


def _submitted(campaigns: Sequence[Campaign], *, submit_here: bool, wait_s: float = 60.0) -> list[Campaign]:
    """Submit the campaigns here, or wait for the submit worker to; returns them reloaded.
    Raises ReplayError when the worker has not submitted them within ``wait_s`` seconds."""
    if submit_here:
        here = [campaign_submit(campaign_id=c.pk) for c in campaigns]
        if all(c.job_number for c in here):
            return here
        # The submit worker (make demo runs one) claimed some first: it submits them; wait for it.
    deadline = time.monotonic() + wait_s
    while True:
        fresh = [Campaign.objects.get(pk=c.pk) for c in campaigns]
        if all(c.job_number for c in fresh):
            return fresh
        if time.monotonic() >= deadline:
            raise ReplayError(f"the submit worker did not submit campaign(s) "
                              f"{[c.pk for c in fresh if not c.job_number]} within {wait_s:.0f} s: is it running "
                              "(make demo / scripts/services start)? Or pass --submit-here.")
        time.sleep(0.02)


def _finished(campaign_ids: Sequence[int], jobs: Sequence[int] = (), *,
              since: dt.datetime) -> Callable[[], bool]:
    """True once every task of the campaigns has its runner record and every task (and every
    task of the extra ``jobs``) its accounting record submitted after ``since`` (a job number
    the qmaster gave before, in an earlier life of the cluster, is not counted)."""
    after = int(since.timestamp() - 1) * 1_000_000

    def done() -> bool:
        tasks = Task.objects.filter(campaign_id__in=campaign_ids)
        if tasks.filter(teardown_done_at__isnull=True).exists():
            return False
        wanted = {(c.job_number, c.task_count) for c in Campaign.objects.filter(pk__in=campaign_ids)}
        wanted |= {(j, Task.objects.filter(job_number=j).count()) for j in jobs}
        return all(AccountingRecord.objects.filter(job_number=j, submission_us__gte=after)
                   .values("task_number").distinct().count() >= n
                   for j, n in wanted)
    return done


# --------------------------------------------------------------------------- run 1

def stage_medians(tasks: Sequence[Task]) -> dict[str, float | None]:
    """Medians (seconds) of :func:`dashboards.core.stages.task_stages` over ``tasks``."""
    per_task = [task_stages(t) for t in tasks]
    return {key: median([s[key] for s in per_task])
            for key in ("queue_wait", "sandbox_start", "agent_work", "integration_overhead")}


def urgent_wait(campaign: Campaign, task: Task) -> dict[str, float | None]:
    """The urgent agent's queue wait (seconds): ``urgent_wait_s`` from the return of its DRMAA call
    (``Campaign.submitted_at``, microseconds; the job was in the qmaster by then, so this is the
    wait to within the call's return latency) to its runner's first timestamp, never negative;
    ``urgent_wait_bound_s`` from the scheduler's own submission time, which qstat and accounting
    give in whole seconds (up to a second before the real instant), so an upper bound. Measured
    on the dev cluster: 1.178 s from the DRMAA return where the whole-second time gave 2.132 s."""
    bound = task_stages(task)["queue_wait"]
    if campaign.submitted_at is None or task.task_started_at is None:
        return {"urgent_wait_s": bound, "urgent_wait_bound_s": bound}
    wait = max(0.0, (task.task_started_at - campaign.submitted_at).total_seconds())
    return {"urgent_wait_s": wait if bound is None else min(wait, bound), "urgent_wait_bound_s": bound}


def launch_figures(campaigns: Sequence[Campaign], called_at: dt.datetime) -> dict[str, Any]:
    """From the launch call (``called_at``) to the scheduler and the first agent: ``submit_s``
    (median of the campaigns' launch accepted -> DRMAA returned), ``all_in_scheduler_s`` (launch
    call -> the last campaign's DRMAA call returned: an array job's tasks enter together),
    ``first_running_s`` (-> the first ``agent_started_at``), ``submissions_per_min``."""
    submitted = [c.submitted_at for c in campaigns]
    tasks = sum(c.task_count for c in campaigns)
    all_in = (max(submitted) - called_at).total_seconds()
    first = Task.objects.filter(campaign__in=campaigns, agent_started_at__isnull=False) \
        .order_by("agent_started_at").values_list("agent_started_at", flat=True).first()
    return {"submit_s": median([c.submit_seconds for c in campaigns]), "all_in_scheduler_s": all_in,
            "first_running_s": (first - called_at).total_seconds() if first else None,
            "submissions_per_min": tasks / all_in * 60.0 if all_in > 0 else None, "tasks": tasks}


def running_over_time(tasks: Sequence[Task], *, step_s: float) -> dict[str, Any]:
    """Running count per project over time from the runner records (a task runs from
    ``task_started_at`` to ``teardown_done_at``), sampled every ``step_s`` seconds from the first
    start. Returns ``{"t": [s], "projects": {project: [count]}, "peak": {project: n}, "peak_total"}``."""
    spans = [(t.project, t.task_started_at.timestamp(), t.teardown_done_at.timestamp())
             for t in tasks if t.task_started_at and t.teardown_done_at]
    if not spans:
        return {"t": [], "projects": {}, "peak": {}, "peak_total": 0}
    origin, end = min(s[1] for s in spans), max(s[2] for s in spans)
    projects = sorted({s[0] for s in spans})
    times = [i * step_s for i in range(int((end - origin) / step_s) + 2)]
    counts = {p: [sum(1 for q, a, b in spans if q == p and a <= origin + x < b) for x in times] for p in projects}
    # The true peak (at any start instant, not only at the samples).
    peak_total = max(sum(1 for _, a, b in spans if a <= start < b) for _, start, _ in spans)
    return {"t": times, "projects": counts, "peak": {p: max(c) for p, c in counts.items()}, "peak_total": peak_total}


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
    called_at = timezone.now()
    campaigns = []
    for team, durations in zip(teams, halves):
        inputs = [{"task": n, "duration_s": d} for n, d in enumerate(durations, start=1)]
        campaigns.append(launch(user=user, request=LaunchRequest(
            team=team, agent_definition=agent, inputs=inputs, name=f"replay-{team.project}")).campaign)
    if watch and not opts.submit_here:
        watch.follow(campaigns)   # the admin's pages open while the submit worker submits
    campaigns = _submitted(campaigns, submit_here=opts.submit_here)
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
    urgent = _submitted([urgent], submit_here=opts.submit_here)[0]
    log(f"run 1: urgent agent (campaign {urgent.pk}, job {urgent.job_number}) launched with {queued} tasks queued")
    if watch:
        watch.follow([urgent])
    try:
        ingest.until(_finished([*ids, urgent.pk], since=called_at), timeout_s=opts.timeout_s, poll_s=opts.poll_s,
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
    the load sampler, started (demo/watch.py). Raises ReplayError when the web server does not answer."""
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


# --------------------------------------------------------------------------- run 2

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
    campaign = _submitted([campaign], submit_here=opts.submit_here)[0]
    log(f"run 2: sweep job {sweep_job} on classic.q, review campaign {campaign.pk} job {campaign.job_number}")
    ingest.until(_finished([campaign.pk], [sweep_job], since=sweep_called), timeout_s=opts.timeout_s,
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


# --------------------------------------------------------------------------- run 3

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


# --------------------------------------------------------------------------- the report

def _fmt(value: float | None, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}f}"


def _ratio(article: float, ours: float | None) -> str:
    """How many times better (smaller) ours is: article / ours."""
    if ours is None:
        return "n/a"
    if ours <= 0:
        return "inf" if article > 0 else "="
    return f"{article / ours:.1f}x"


def goals(teams: dict | None, sweep: dict | None) -> list[str]:
    """The issue's goals, each ``met`` or ``MISSED`` with by how much and why."""
    out = []
    for key, label in (("sandbox_start", "sandbox start"), ("integration_overhead", "integration overhead")):
        bound = ARTICLE[key] / GOAL_FACTOR
        for name, run in (("two teams", teams), ("review agents", sweep)):
            ours = run and run["stages"][key]
            if ours is None:
                continue
            if ours <= bound:
                out.append(f"met: {label} ({name}) {ours:.3f} s <= {bound:.2f} s (10x better than the article)")
            else:
                out.append(f"MISSED: {label} ({name}) {ours:.3f} s > {bound:.2f} s, by {ours - bound:.3f} s; "
                           f"why: {WHY[key]}")
    bound = ARTICLE["all_in_scheduler_s"] / GOAL_FACTOR
    for name, run in (("two teams", teams), ("review agents", sweep)):
        if run:
            ours = run["launch"]["all_in_scheduler_s"]
            if ours <= bound:
                out.append(f"met: all {run['launch']['tasks']} tasks ({name}) in the scheduler {ours:.3f} s after "
                           f"the launch call <= {bound:.2f} s")
            else:
                out.append(f"MISSED: all {run['launch']['tasks']} tasks ({name}) in the scheduler {ours:.3f} s after "
                           f"the launch call > {bound:.2f} s, by {ours - bound:.3f} s; why: the launch service "
                           "(checks, audit, spooling every input) and the submission (the submit worker's hop, "
                           "unless --submit-here, and one DRMAA call per campaign, one after the other) add up")
    if teams:
        wait = teams["urgent_wait_s"]
        if wait is not None and wait <= URGENT_GOAL_S:
            out.append(f"met: urgent agent waited {wait:.3f} s <= {URGENT_GOAL_S:.0f} s")
        elif wait is not None:
            out.append(f"MISSED: urgent agent waited {wait:.3f} s > {URGENT_GOAL_S:.0f} s, "
                       f"by {wait - URGENT_GOAL_S:.3f} s;"
                       " why: it starts at the next slot a finishing agent frees (all 96 were busy) plus the "
                       "qmaster's scheduling interval")
    live = teams and teams.get("live")
    if live:
        f = live_figures(live)
        for label, figures in (("live lag (admin's campaign pages)", f.get("lag")),
                               (f"delivery to {f['clients']} clients", f["load"] if f["clients"] else None)):
            if figures and figures["p95"] is not None:
                p95 = figures["p95"]
                out.append(f"met: {label} p95 {p95:.3f} s <= {LAG_GOAL_S:.0f} s" if p95 <= LAG_GOAL_S else
                           f"MISSED: {label} p95 {p95:.3f} s > {LAG_GOAL_S:.0f} s, by {p95 - LAG_GOAL_S:.3f} s")
        if f["clients"]:
            bad = len(f["incomplete"]) + len(f["violations"])
            out.append(f"{'met' if not bad else 'MISSED'}: every client got every change of its team and none of "
                       f"another's ({len(f['incomplete'])} incomplete, {len(f['violations'])} saw too much)")
    return out


def render_report(*, teams: dict | None, sweep: dict | None, bill: dict | None, opts: ReplayOptions,
                  host: str) -> str:
    """The report as text, in the article's shape (module doc)."""
    lines = [f"tco seed replay on {host}, {timezone.now():%Y-%m-%d %H:%M} UTC",
             f"agents {opts.agents} (two teams), sweep {opts.sweep}, work scale {opts.work_scale}; demo agent work: "
             f"log-normal, median {WORK_MEDIAN_S * opts.work_scale:.1f} s, sigma {WORK_SIGMA} (of ln), clipped to "
             "[0.5, 2] x median", ""]
    lines.append("Stage medians (seconds): the article's 256 review agents | ours | ratio (article/ours)")
    header = f"{'stage':<40} {'article':>9} {'review agents':>14} {'ratio':>7} {'two teams':>10} {'ratio':>7}"
    lines += [header, "-" * len(header)]

    def row(label: str, key: str, teams_v: float | None, sweep_v: float | None, article: float | None = None):
        a = ARTICLE[key] if article is None else article
        lines.append(f"{label:<40} {a:>9.3f} {_fmt(sweep_v):>14} {_ratio(a, sweep_v):>7} {_fmt(teams_v):>10} "
                     f"{_ratio(a, teams_v):>7}")

    def get(run, *path):
        for p in path:
            if run is None:
                return None
            run = run[p]
        return run

    row("submitting the job (launch -> DRMAA)", "submit", get(teams, "launch", "submit_s"),
        get(sweep, "launch", "submit_s"))
    for key, label in (("integration_overhead", "everything else the integration adds"),
                       ("sandbox_start", "starting the sandbox"), ("agent_work", "the agent's own work"),
                       ("queue_wait", "waiting in the queue")):
        row(label, key, get(teams, "stages", key), get(sweep, "stages", key))
    row("launch call -> every task in the scheduler", "all_in_scheduler_s",
        get(teams, "launch", "all_in_scheduler_s"), get(sweep, "launch", "all_in_scheduler_s"))
    row("launch call -> first agent running", "first_running_s", get(teams, "launch", "first_running_s"),
        get(sweep, "launch", "first_running_s"))
    sub_t, sub_s = get(teams, "launch", "submissions_per_min"), get(sweep, "launch", "submissions_per_min")
    lines.append(f"{'submission rate (tasks/min, higher better)':<40} {ARTICLE['submissions_per_min']:>9.0f} "
                 f"{_fmt(sub_s, 0):>14} {_ratio(sub_s or 0, ARTICLE['submissions_per_min']) if sub_s else 'n/a':>7} "
                 f"{_fmt(sub_t, 0):>10} {_ratio(sub_t or 0, ARTICLE['submissions_per_min']) if sub_t else 'n/a':>7}")
    lines.append("(the article's integration overhead is 'under 2'; 2 is used. Queue wait: the scheduler's "
                 "submission time (qstat, whole seconds) -> the runner's first timestamp; for the review "
                 "agents it includes the hold on the sweep, shown apart below.)")
    if teams:
        t = teams["running"]["t"]
        step = t[1] - t[0] if len(t) > 1 else 0
        lines += ["", "Run 1: two teams, one cluster",
                  f"campaigns {[c.pk for c in teams['campaigns']]} (jobs {[c.job_number for c in teams['campaigns']]}),"
                  f" {teams['launch']['tasks']} agents, most running at once: {teams['running']['peak_total']}",
                  f"urgent agent (job {teams['urgent'].job_number}): launched with {teams['urgent_queued_behind']} "
                  f"tasks queued; waited {_fmt(teams['urgent_wait_s'])} s in the queue from its DRMAA call's return "
                  f"(article: {ARTICLE['urgent_wait_s']:.0f} s; the scheduler's whole-second submission time gives "
                  f"at most {_fmt(teams.get('urgent_wait_bound_s'))} s), {_fmt(teams['urgent_from_call_s'])} s from "
                  f"the launch call to its runner's start (launch -> DRMAA {_fmt(teams['urgent_submit_s'])} s)",
                  "running agents per team (runner records), every "
                  f"{step:.0f} s:"]
        projects = list(teams["running"]["projects"])
        lines.append(f"{'t (s)':>7} " + " ".join(f"{p:>12}" for p in projects))
        for i, t in enumerate(teams["running"]["t"]):
            lines.append(f"{t:>7.0f} " + " ".join(f"{teams['running']['projects'][p][i]:>12}" for p in projects))
        if teams.get("live"):
            lines += render_live(teams["live"])
    if sweep:
        ag = sweep["agreement"]
        shown = "n/a" if ag["agreement"] is None else f"{ag['agreement']:.0%}"
        lines += ["", "Run 2: a classic job with agents on its outcome (PLUMBING with a scripted stand-in model, "
                      "not a model's quality)",
                  f"sweep job {sweep['sweep_job']} ({opts.sweep} tasks, classic.q; {sweep['sweep_failed']} exited "
                  f"non-zero), review campaign {sweep['campaign'].pk} (job {sweep['campaign'].job_number}, "
                  "-hold_jid_ad)",
                  f"agreement with the deterministic reference: {ag['agreed']}/{ag['total']} ({shown}; article "
                  f"{ARTICLE['review_agreement']:.0%}); crashed runs found: {sweep['crashed_found']} of "
                  f"{sweep['crashed']} (" + ", ".join(f"{reason}: {found} of {n}" for reason, (found, n)
                                                      in sweep["crashed_by_reason"].items())
                  + "; the scripted stand-in calls a run bad only when its log says crashed or diverged)",
                  f"median wait on the predecessor (review submitted -> its sweep task ended, accounting): "
                  f"{_fmt(sweep['predecessor_wait_s'])} s; median queue wait after the hold was released: "
                  f"{_fmt(sweep['queue_after_hold_s'])} s",
                  ag["caveat"] or SCRIPTED_CAVEAT]
    if bill:
        lines += ["", f"Run 3: the bill, days {bill['first']}..{bill['last']} ({bill['time_zone']}); "
                      "qacct -P over the same instants",
                  f"{'team':<14} {'bill wall s':>12} {'qacct wall s':>13} {'equal':>6} {'tokens':>10} {'USD':>10}"]
        for r in bill["rows"]:
            lines.append(f"{r['team']:<14} {r['bill_wallclock_s']:>12.0f} {r['qacct_wallclock_s']:>13.0f} "
                         f"{'yes' if r['equal'] else 'NO':>6} {r['tokens']:>10} {r['cost_usd']:>10.4f}")
        lines.append("(article: engineering 29,591 s, research 16,266 s of wall clock from qacct -P)")
    lines += ["", "Goals (issue 15):", *goals(teams, sweep)]
    return "\n".join(lines) + "\n"


def write_figure(running: dict, path: Path) -> Path:
    """The running count per team over time as a Plotly figure, HTML with plotly.min.js written
    beside it (no CDN). Returns ``path``."""
    import plotly.graph_objects as go

    fig = go.Figure([go.Scatter(x=running["t"], y=counts, mode="lines", line_shape="hv", name=project)
                     for project, counts in running["projects"].items()])
    fig.update_layout(title="Running agents per team (runner records)", xaxis_title="seconds from the first start",
                      yaxis_title="running agents")
    fig.write_html(str(path), include_plotlyjs="directory", full_html=True)
    return path


def replay(*, opts: ReplayOptions, log: Callable[[str], None] = print) -> dict:
    """Run the three runs; write ``report.txt`` and ``running.html`` into ``opts.out_dir`` (default
    ``<state dir>/replay/<time>``). Returns ``{"report", "teams", "sweep", "bill", "out_dir"}``.
    Raises ReplayError (and the launch service's ActionRefused/LaunchError, SchedulerError)."""
    from django.contrib.auth import get_user_model
    import os
    import socket

    try:
        user = get_user_model().objects.get(username=opts.user)
        teams = [Team.objects.get(project="research"), Team.objects.get(project="engineering")]
    except (get_user_model().DoesNotExist, Team.DoesNotExist) as exc:
        raise ReplayError(f"{exc} (run manage.py tco_bootstrap first)") from exc
    out_dir = Path(opts.out_dir or Path(settings.STATE_DIR) / "replay" / time.strftime("%Y%m%d-%H%M%S"))
    out_dir.mkdir(parents=True, exist_ok=True)
    cluster = cluster_get_default()
    ingest = Ingest(cluster)
    since = timezone.now()
    ingest.step()   # catch up first, so the loop's steps are short while the runs go
    teams_run = run_teams(user=user, opts=opts, ingest=ingest, log=log) if opts.agents else None
    if teams_run:   # kept whatever happens to run 2
        (out_dir / "report-run1.txt").write_text(render_report(teams=teams_run, sweep=None, bill=None, opts=opts,
                                                               host=f"{socket.gethostname()} ({os.cpu_count()} cores)"))
    sweep_run = run_sweep(user=user, opts=opts, ingest=ingest, out_dir=out_dir, log=log) if opts.sweep else None
    ingest.step()
    bill = bill_check(since=since, teams=teams)
    host = f"{socket.gethostname()} ({os.cpu_count()} cores)"
    report = render_report(teams=teams_run, sweep=sweep_run, bill=bill, opts=opts, host=host)
    (out_dir / "report.txt").write_text(report)
    if teams_run:
        write_figure(teams_run["running"], out_dir / "running.html")
    return {"report": report, "teams": teams_run, "sweep": sweep_run, "bill": bill, "out_dir": out_dir}


__all__ = ["ARTICLE", "ReplayOptions", "ReplayError", "work_durations", "replay", "render_report", "bill_check",
           "qacct_wallclock", "running_over_time", "stage_medians", "launch_figures", "goals"]
