"""Ways to make a tco task wait on purpose on the real dev cluster, for the assistant's why_pending tests.

Each cause is a function ``(CauseContext) -> Made`` registered in ``CAUSES``
with ``@cause("name")``. It submits what it needs (tco campaigns through the
launch service, plain jobs with qsub), waits until the scheduler has seen
it, and returns the tco task that now waits, the reason text tco must give
(computed here from the cluster's own configuration, not from tco's code),
a check of the facts, and every job it submitted (deleted afterwards).
A new cause (a closed calendar, a future advance reservation) is one more
decorated function; tests/integration/test_assistant_cluster.py runs every
cause in ``CAUSES``.
"""
from __future__ import annotations

import re
import subprocess
import uuid
from decimal import Decimal
from dataclasses import dataclass, field
from typing import Callable

from django.conf import settings
from django.utils import timezone

from dashboards.core.clusters import cluster_get_default, scheduler_for
from dashboards.ingest.cluster_status import cluster_status_refresh
from dashboards.ingest.poll import apply_qstat_poll
from dashboards.launch.service import LaunchRequest, launch
from dashboards.models import AgentDefinition, Budget, Campaign, Task, Team
from dashboards.launch.submit import campaign_submit
from tests.helpers import wait_until
from tests.support.cluster import qstat_jobs, SGE_ENV


@dataclass
class CauseContext:
    """What a cause may use: ``launcher`` (a user who may launch on ``team``), ``team``,
    ``jobs``, where it appends every job number it submits as soon as it has it, ``reservations``
    (the advance reservation ids it books; qrdel afterwards) and ``undo``, where it appends what
    restores the cluster after the test (called last first, always)."""

    launcher: object
    team: Team
    jobs: list[int] = field(default_factory=list)
    undo: list[Callable[[], None]] = field(default_factory=list)
    #: advance reservations a cause booked (qrdel afterwards)
    reservations: list[int] = field(default_factory=list)


@dataclass
class Made:
    """A task made to wait: ``expected`` must be among tco's reason texts; ``check_facts(facts)``
    asserts on the why_pending facts."""

    task: Task
    expected: list[str]
    check_facts: Callable[[dict], None] = lambda facts: None


CAUSES: dict[str, Callable[[CauseContext], Made]] = {}


def cause(name: str):
    def register(fn: Callable[[CauseContext], Made]) -> Callable[[CauseContext], Made]:
        CAUSES[name] = fn
        return fn
    return register


# --------------------------------------------------------------------------- helpers for causes

def run(argv: list[str]) -> str:
    """A Grid Engine command as the test account; its stdout (raises with stderr on failure)."""
    out = subprocess.run(argv, capture_output=True, text=True, env={**SGE_ENV, "TZ": "UTC"}, timeout=60)
    assert out.returncode == 0, f"{argv}: {out.stderr}"
    return out.stdout


def global_capacity(resource: str) -> int:
    """``complex_values`` of the global host for ``resource`` (``qconf -se global``)."""
    text = run(["qconf", "-se", "global"])
    match = re.search(rf"\b{re.escape(resource)}=(\d+)", text)
    assert match, f"no {resource} on the global host:\n{text}"
    return int(match.group(1))


def global_free(resource: str) -> float:
    """What is left of a global consumable now: the ``global`` host's ``gc:RESOURCE=N`` in ``qhost -F``."""
    text = run(["qhost", "-F", resource])
    match = re.search(rf"^global\s.*?\n\s+Host Resource\(s\):\s+gc:{re.escape(resource)}=([\d.]+)", text, re.M)
    assert match, f"no global {resource} in qhost -F:\n{text}"
    return float(match.group(1))


def qsub_sleep(*options: str, name: str, seconds: int = 600) -> int:
    """A plain ``sleep`` job (not tco's) with extra qsub ``options``; its job number."""
    out = run(["qsub", "-terse", "-b", "y", "-o", "/dev/null", "-e", "/dev/null", "-N", name, *options,
               "/bin/sleep", str(seconds)])
    return int(out.strip().split(".")[0])


def launch_campaign(ctx: CauseContext, name: str, count: int = 1, **fields) -> Campaign:
    """A demo-agent campaign of ``count`` tasks, submitted; its job number noted in ``ctx.jobs``."""
    agent = AgentDefinition.objects.get(name="demo-agent")
    outcome = launch(user=ctx.launcher, request=LaunchRequest(
        team=ctx.team, agent_definition=agent, name=f"{name}-{uuid.uuid4().hex[:6]}",
        inputs=[{"task": n, "duration_s": 1.0} for n in range(1, count + 1)], **fields))
    campaign = campaign_submit(campaign_id=outcome.campaign.pk)
    if campaign.job_number:
        ctx.jobs.append(campaign.job_number)
    assert campaign.status == "submitted", campaign.submit_error
    return campaign


def poll() -> None:
    """What the worker's beat does: tco's tasks from qstat, and the cluster's status (consumables, quotas)."""
    cluster = cluster_get_default()
    apply_qstat_poll(cluster, scheduler_for(cluster).list_tasks(), observed_at=timezone.now())
    cluster_status_refresh(cluster=cluster)


def scheduler_said(job: int, text: str) -> bool:
    """Whether ``qstat -j JOB`` (the scheduler's messages, schedd_job_info) contains ``text``."""
    out = subprocess.run(["qstat", "-j", str(job)], capture_output=True, text=True, env=SGE_ENV, timeout=30)
    return text in out.stdout


def waiting_task(campaign: Campaign, *states: str) -> Task:
    """Task 1 of ``campaign`` once tco's poll shows it in one of ``states``."""
    def found():
        poll()
        return Task.objects.filter(campaign=campaign, task_number=1, state__in=states, active=True).first()
    try:
        return wait_until(found, 60, f"task 1 of {campaign.name} {'/'.join(states)} in tco", 1.0)
    except AssertionError as exc:
        seen = list(Task.objects.filter(campaign=campaign).values_list("task_number", "state", "state_code"))
        raise AssertionError(f"{exc}; tco has {seen}, qstat says "
                             f"{qstat_jobs().get(campaign.job_number)}") from None


# --------------------------------------------------------------------------- the causes

@cause("seats exhausted")
def seats_exhausted(ctx: CauseContext) -> Made:
    """A plain job takes every model API seat still free (the global consumable anthropic_api); a tco
    task asking for one seat waits."""
    capacity = global_capacity("anthropic_api")
    free = int(global_free("anthropic_api"))  # jobs left by others may hold some: take what is left
    if free > 0:
        blocker = qsub_sleep("-q", "agent.q", "-P", ctx.team.project, "-l", f"anthropic_api={free}",
                             name="seat-blocker")
        ctx.jobs.append(blocker)
        wait_until(lambda: "r" in qstat_jobs().get(blocker, {}).get("states", ""), 60,
                   "the seat blocker running", 0.5)
    assert global_free("anthropic_api") == 0
    campaign = launch_campaign(ctx, "seatless", seats_per_task=1)
    wait_until(lambda: scheduler_said(campaign.job_number, "anthropic_api=0"), 60,
               "the scheduler saying no seat is left", 0.5)
    task = waiting_task(campaign, "pending")

    def check(facts: dict) -> None:
        [seats] = [c for c in facts["consumables"] if c["resource"] == "anthropic_api"]
        assert float(seats["requested"]) == 1 and seats["capacity"] == capacity, seats
        assert seats["used"] == capacity and seats["free"] == 0, seats
        assert any("anthropic_api" in m for m in facts["scheduler_messages"])

    return Made(task=task, check_facts=check,
                expected=[f"waiting for a model API seat: the job asks 1 (-l anthropic_api=1); {capacity} of {capacity} "
                          f"in use, 0 free (consumable anthropic_api, global)"])


@cause("held predecessor")
def held_predecessor(ctx: CauseContext) -> Made:
    """A campaign submitted on hold (its team's budget says hold: qsub -h, no race with the scheduler);
    a second campaign that depends on it (-hold_jid_ad) waits."""
    Budget.objects.create(team=ctx.team, period="day", amount_usd=Decimal("1"), thresholds=[1.0], on_exceed="hold")
    try:
        first = launch_campaign(ctx, "held-first", cost_cap_usd=Decimal("5"))
    finally:
        Budget.objects.filter(team=ctx.team).delete()
    second = launch_campaign(ctx, "after-held", predecessor_job=first.job_number)
    waiting_task(first, "held")
    task = waiting_task(second, "held", "pending")  # -hold_jid_ad: a dependency hold (hqw)

    def check(facts: dict) -> None:
        deps = facts["dependencies"]
        assert deps["predecessors"] == [first.job_number], deps
        assert deps["predecessor_states"] == [{"job_number": first.job_number, "states": {"held": 1}}], deps

    return Made(task=task, check_facts=check,
                expected=[f"waiting for job {first.job_number} to finish",
                          f"job {first.job_number}, which it waits for, is held: it starts only when released (qrls)"])


@cause("closed calendar")
def closed_calendar(ctx: CauseContext) -> Made:
    """The test queue cal.q closed by its calendar tco_window for about 90 s (scripts/cluster-faults ->
    dev-cluster --calendar-window; agent.q is never touched); a campaign launched into cal.q waits."""
    from django.test import override_settings

    from tests.support.calendar_window import (CALENDAR, QUEUE, close_queue_until, open_window_end, opening_reason,
                                  remove_window)

    opens = open_window_end(90)
    ctx.undo.append(remove_window)
    close_queue_until(opens)
    with override_settings(TCO_QUEUES=[*settings.TCO_QUEUES, QUEUE]):
        campaign = launch_campaign(ctx, "after-hours", queue=QUEUE)
    wait_until(lambda: scheduler_said(campaign.job_number, f'"{QUEUE}@'), 60,
               "the scheduler saying cal.q is disabled", 0.5)
    task = waiting_task(campaign, "pending")
    assert timezone.now() < opens, "the calendar window closed before the task was seen waiting"

    def check(facts: dict) -> None:
        [row] = facts["calendars"]
        assert (row["queue"], row["calendar"], row["calendar_state"]) == (QUEUE, CALENDAR, "off"), row
        assert row["calendar_next_change"] == opens.strftime("%Y-%m-%dT%H:%M:%SZ"), row

    return Made(task=task, check_facts=check, expected=[opening_reason(opens)])


@cause("future reservation")
def future_reservation(ctx: CauseContext) -> Made:
    """The launcher books an advance reservation through tco that starts in a bit over two days
    (so the "in …" of the reason does not change while the test asks), on classic.q (agent.q takes
    only its projects' jobs and SGE 8.1.9's qrsub has no -P), then launches a campaign into it
    (-ar): its task waits for the reservation's start."""
    import datetime as dt

    from dashboards.launch.reservations import BookRequest, book

    start = (timezone.now() + dt.timedelta(hours=50, minutes=30)).replace(second=0, microsecond=0)
    booked = book(user=ctx.launcher, request=BookRequest(team=ctx.team, name=f"mcp-ar-{uuid.uuid4().hex[:6]}",
                                                         start=start, duration_s=600, queue="classic.q", seats=1))
    ctx.reservations.append(booked.ar_id)
    # The start as the scheduler holds it (qrstat -ar ID, read here), and the wait in whole hours.
    text = run(["qrstat", "-ar", str(booked.ar_id)])
    found = re.search(r"^start_time\s+(\d\d)/(\d\d)/(\d{4}) (\d\d):(\d\d)", text, re.M)
    assert found, text
    month, day, year, hour, minute = (int(g) for g in found.groups())
    when = dt.datetime(year, month, day, hour, minute, tzinfo=dt.timezone.utc)
    campaign = launch_campaign(ctx, "in-future-ar", queue="classic.q", advance_reservation=booked.ar_id)
    task = waiting_task(campaign, "pending")
    hours = int((when - timezone.now()).total_seconds() // 3600)
    expected = (f"waits for advance reservation {booked.ar_id} (team {ctx.team.project}), which starts at "
                f"{when:%Y-%m-%d %H:%M} UTC (in {hours // 24} d {hours % 24} h)")

    def check(facts: dict) -> None:
        [reservation] = facts["reservations"]
        assert reservation["id"] == booked.ar_id and reservation["team"] == ctx.team.project, reservation
        assert reservation["state"] == "waiting", reservation

    return Made(task=task, check_facts=check, expected=[expected])
