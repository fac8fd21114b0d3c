"""One row per task, whatever order qstat snapshots, accounting records and runner records arrive in
(issue 23, finding 11): in the seed replay's run 2, tasks 26.77 and 26.78 each got a second row (running,
then finishing, then lost) beside their done rows, and the replay waited for those rows' runner records."""
from __future__ import annotations

import dataclasses
import datetime as dt
import json
import random
from pathlib import Path

import pytest
from django.db import IntegrityError, transaction

from dashboards.core.accounts import team_ensure
from dashboards.core.clusters import cluster_get_default
from dashboards.ingest import poll
from dashboards.ingest.accounting import ingest_accounting
from dashboards.ingest.poll import apply_qstat_poll, reconcile_gone_tasks
from dashboards.ingest.runner_records import ingest_runner_records
from dashboards.models import AccountingRecord, AgentDefinition, Campaign, Cluster, Task
from schedulers.base import QstatTask

from tests.support import budget
from tests.support.accounting import colon_line, HEADER

pytestmark = pytest.mark.django_db

S = 1764417600  # the array job's submission (whole seconds, as qstat and SGE 8 accounting give it)
NAME = "tco-inst1-c1-demo"


def at(seconds: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(S, dt.timezone.utc) + dt.timedelta(seconds=seconds)


def shown(job: int, task: int, *, start: int | None, restarted: bool = False) -> QstatTask:
    """Task ``job.task`` as qstat shows it: running since ``S + start``, or pending."""
    running = start is not None
    return QstatTask(job_number=job, task_number=task, name=NAME, owner="tco", project="research",
                     state="running" if running else "pending", state_code=("R" if restarted else "") +
                     ("r" if running else "qw"), restarted=restarted, queue="agent.q" if running else None,
                     host="vm" if running else None, slots=1, submitted_at=at(0),
                     started_at=at(start) if running else None, priority=0.5)


def make_campaign(cluster: Cluster, job: int, tasks: int, *, adopted_after_s: float = 0.5) -> Campaign:
    """A campaign of ``tasks`` tasks adopted as job ``job`` (``submit.campaign_adopt``'s rows: pending, tco's
    own submission time ``adopted_after_s`` after the qmaster's)."""
    team = team_ensure(name="research", project="research")
    agent, _ = AgentDefinition.objects.get_or_create(name="a", defaults={"command": ["true"]})
    from django.contrib.auth import get_user_model

    user, _ = get_user_model().objects.get_or_create(username="launcher")
    campaign = Campaign.objects.create(name="demo", cluster=cluster, team=team, agent_definition=agent,
                                       launched_by=user, queue="agent.q", task_count=tasks, launched_at=at(-1),
                                       job_number=job, status="submitted", submitted_at=at(adopted_after_s))
    for n in range(1, tasks + 1):
        Task.objects.create(cluster=cluster, campaign=campaign, job_number=job, task_number=n, is_array=True,
                            name=NAME, owner="tco", project="research", state="pending", state_code="qw",
                            submitted_at=at(adopted_after_s), first_seen_at=at(adopted_after_s))
    return campaign


def rows_of(campaign: Campaign) -> list[tuple]:
    return list(Task.objects.filter(job_number=campaign.job_number, cluster=campaign.cluster)
                .order_by("task_number", "id").values_list("task_number", "state", "active"))


# --------------------------------------------------------------------------- the paths, one by one

def test_a_snapshot_older_than_a_tasks_end_does_not_give_it_a_second_row(tmp_path):
    """The replay's path: two pollers' qstat calls overlapped; the one that began later answered first,
    with a view from before the task ended, and was applied after the other one had seen the task gone
    and its accounting record had ended it. Ordering by qstat's start alone let it through; without
    start and answer times (a view of one instant), a task with an ended row is not taken for a new task."""
    cluster = cluster_get_default()
    campaign = make_campaign(cluster, 26, 1)
    acct = tmp_path / "accounting"
    acct.write_bytes(HEADER)
    apply_qstat_poll(cluster, [shown(26, 1, start=5)], observed_at=at(6))
    apply_qstat_poll(cluster, [], observed_at=at(10))  # gone: finishing
    acct.write_bytes(HEADER + colon_line(26, 1, start=S + 5, wall=4, submitted=S))
    ingest_accounting(cluster, path=str(acct))
    assert rows_of(campaign) == [(1, "done", False)]
    # A view from before the end (started 5 s in, running), applied after: it began after the last
    # applied poll began, so ordering by starts did not stop it.
    apply_qstat_poll(cluster, [shown(26, 1, start=5)], observed_at=at(11))
    assert rows_of(campaign) == [(1, "done", False)]


def test_overlapping_polls_are_applied_only_in_the_schedulers_order():
    """Poller A's qstat ran from 1.0 to 1.9 s (its view: the task gone), poller B's from 1.5 to 1.6 s (its
    view: the task running). A applied first; B began before A answered: its view may be older, not applied."""
    cluster = cluster_get_default()
    campaign = make_campaign(cluster, 26, 1)
    apply_qstat_poll(cluster, [shown(26, 1, start=0)], observed_at=at(0.2), answered_at=at(0.4))
    a = apply_qstat_poll(cluster, [], observed_at=at(1.0), answered_at=at(1.9))
    b = apply_qstat_poll(cluster, [shown(26, 1, start=0)], observed_at=at(1.5), answered_at=at(1.6))
    assert a.gone == 1 and b.stale and not b.any
    assert rows_of(campaign) == [(1, "finishing", True)]
    assert not apply_qstat_poll(cluster, [], observed_at=at(2.0), answered_at=at(2.1)).stale


def test_a_task_shown_again_in_a_later_attempt_takes_up_its_own_row(tmp_path):
    """A row declared lost whose task is back (its host returned), or a task shown started after its row
    ended (a rerun): the same row becomes active again, never a second one."""
    cluster = cluster_get_default()
    campaign = make_campaign(cluster, 27, 2)
    apply_qstat_poll(cluster, [shown(27, 1, start=5), shown(27, 2, start=5)], observed_at=at(6))
    apply_qstat_poll(cluster, [], observed_at=at(8))
    Task.objects.filter(job_number=27, task_number=1).update(state="lost", active=False, ended_at=at(8))
    Task.objects.filter(job_number=27, task_number=2).update(state="failed", active=False, ended_at=at(7),
                                                             failed_code=25)
    changes = apply_qstat_poll(cluster, [shown(27, 1, start=5), shown(27, 2, start=9, restarted=True)],
                               observed_at=at(10))
    assert changes.added == 0 and changes.changed == 2
    assert rows_of(campaign) == [(1, "running", True), (2, "running", True)]
    assert Task.objects.get(job_number=27, task_number=2).failed_code is None


def test_a_job_that_reused_the_number_of_an_ended_one_is_a_new_task():
    """Job numbers wrap (and an unreleased OCS repeated one): a running job shown with the number of a job
    that ended long before, with another start (qstat gives no submission time for a running task), is a
    new task, with a row of its own; the old row is left as it ended."""
    cluster = cluster_get_default()
    Task.objects.create(cluster=cluster, job_number=31, task_number=0, state="done", active=False,
                        submitted_at=at(-90000), started_at=at(-89990), ended_at=at(-89000))
    newcomer = dataclasses.replace(shown(31, 0, start=20), submitted_at=None, task_number=None)
    changes = apply_qstat_poll(cluster, [newcomer], observed_at=at(21))
    assert changes.added == 1
    assert sorted(Task.objects.filter(job_number=31).values_list("state", "active")) == [
        ("done", False), ("running", True)]


def test_a_record_with_another_submission_time_joins_its_campaigns_row(tmp_path):
    """tco notes a campaign task's submission when DRMAA returns; a record whose submission time is more
    than 5 s from it (a slow return, a rescheduled task) made a second, ended row for the same task."""
    cluster = cluster_get_default()
    campaign = make_campaign(cluster, 28, 1, adopted_after_s=9)
    acct = tmp_path / "accounting"
    acct.write_bytes(HEADER + colon_line(28, 1, start=S + 12, wall=3, submitted=S))
    ingest_accounting(cluster, path=str(acct))
    apply_qstat_poll(cluster, [], observed_at=at(20))
    assert rows_of(campaign) == [(1, "done", False)]
    assert AccountingRecord.objects.get(job_number=28).task_id == Task.objects.get(job_number=28).pk
    # Another job that reused the number (another name) is not the campaign's.
    acct.write_bytes(HEADER + colon_line(28, 1, start=S + 12, wall=3, submitted=S) +
                     colon_line(28, 1, start=S + 40, wall=3, submitted=S + 30, name="someone-else"))
    ingest_accounting(cluster, path=str(acct))
    assert rows_of(campaign) == [(1, "done", False)]
    assert AccountingRecord.objects.filter(job_number=28, task__isnull=True).count() == 1


def test_the_database_holds_one_row_per_campaign_task():
    cluster = cluster_get_default()
    campaign = make_campaign(cluster, 29, 1)
    Task.objects.filter(campaign=campaign).update(state="done", active=False)
    with pytest.raises(IntegrityError), transaction.atomic():
        Task.objects.create(cluster=cluster, campaign=campaign, job_number=29, task_number=1, state="running")
    # Jobs tco did not launch keep their rows by job and task number (a reused number is another job).
    Task.objects.create(cluster=cluster, job_number=30, task_number=1, state="done", active=False)
    Task.objects.create(cluster=cluster, job_number=30, task_number=1, state="running")


# --------------------------------------------------------------------------- any order: a property

@dataclasses.dataclass
class Truth:
    """What happened to one task on the cluster (seconds after the submission, whole seconds)."""

    task: int
    start: int
    end: int
    exit_status: int

    def view(self, moment: float) -> QstatTask | None:
        if moment >= self.end:
            return None
        return shown(0, self.task, start=self.start if moment >= self.start else None)


@dataclasses.dataclass(order=True)
class Step:
    """One thing an ingester does, at ``when`` (the order steps are applied in)."""

    when: float
    kind: str = dataclasses.field(compare=False)
    args: tuple = dataclasses.field(compare=False, default=())


def scenario(seed: int, tasks: int = 6) -> tuple[list[Truth], list[Step], float]:
    """A random history: task times, and the steps of two pollers (qstat calls of random length that may
    overlap, applied after a random lag), accounting ingests (records written 0.5-2 s after each end) and
    runner record ingests (written at each end), in the order they are applied. Returns (truth, steps,
    the last moment)."""
    rng = random.Random(seed)
    truth = []
    for n in range(1, tasks + 1):
        start = rng.randint(1, 12)
        truth.append(Truth(task=n, start=start, end=start + rng.randint(1, 10), exit_status=rng.choice((0, 0, 0, 3))))
    last = max(t.end for t in truth) + 3
    steps = []
    for poller in ("a", "b"):
        moment = rng.uniform(0, 1.5)
        while moment < last:
            length = rng.choice((0.05, 0.3, 1.0, 2.5, 4.0))
            view = rng.uniform(moment, moment + length)
            steps.append(Step(moment + length + rng.choice((0, 0, 0.5, 2.0, 4.0)), "poll",
                              (poller, moment, moment + length, view)))
            moment += length + rng.uniform(0.1, 1.5)
    for _ in range(rng.randint(3, 8)):
        steps.append(Step(rng.uniform(0, last), "accounting"))
    for _ in range(rng.randint(2, 6)):
        steps.append(Step(rng.uniform(0, last), "runner"))
    for _ in range(rng.randint(0, 3)):
        steps.append(Step(rng.uniform(0, last), "reconcile"))
    return truth, sorted(steps), last


def runner_record(campaign: Campaign, t: Truth) -> dict:
    iso = lambda s: at(s).strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # noqa: E731
    return {"version": 1, "campaign_id": campaign.pk, "task_number": t.task, "job_number": campaign.job_number,
            "stages": {"task_started_at": iso(t.start + 0.1), "agent_started_at": iso(t.start + 0.2),
                       "agent_exited_at": iso(t.end - 0.2), "teardown_done_at": iso(t.end - 0.1)},
            "exit_status": t.exit_status}


def play(seed: int, tmp_path: Path, settings, *, adopted_after_s: float) -> tuple[Campaign, list[Truth]]:
    """Apply one scenario through tco's ingest (poll, accounting, runner records, reconcile), then settle."""
    settings.TCO_LOST_GRACE_S = settings.TCO_DELETED_GRACE_S = 3600.0  # nothing is given up on in a run
    truth, steps, last = scenario(seed)
    base = tmp_path / f"s{seed}-{adopted_after_s}"
    spool = base / "spool"
    spool.mkdir(parents=True)
    acct = base / "accounting"
    acct.write_bytes(HEADER)
    cluster = Cluster.objects.create(name=f"c{seed}-{adopted_after_s}", accounting_path=str(acct))
    job = 100 + seed
    campaign = make_campaign(cluster, job, len(truth), adopted_after_s=adopted_after_s)
    truth = [dataclasses.replace(t) for t in truth]
    caches: dict[str, dict] = {"a": {}, "b": {}}  # each poller is its own process, with its own snapshot cache
    written: set[int] = set()

    def snapshot(view: float) -> list[QstatTask]:
        out = []
        for t in truth:
            q = t.view(view)
            if q is not None:
                out.append(dataclasses.replace(q, job_number=job))
        return out

    def accounting_until(moment: float) -> None:
        # Records are appended in the order the qmaster writes them (end + flush delay).
        due = sorted(((t.end + 0.5 + (t.task % 3) * 0.5, t.task, t) for t in truth), key=lambda d: d[:2])
        lines = b"".join(colon_line(job, t.task, start=S + t.start, wall=t.end - t.start, submitted=S,
                                    exit_status=t.exit_status) for when, _, t in due if when <= moment)
        acct.write_bytes(HEADER + lines)
        ingest_accounting(cluster, path=str(acct))

    def runner_until(moment: float) -> None:
        for t in truth:
            if t.end <= moment and t.task not in written:
                path = spool / "records" / str(campaign.pk) / f"{t.task}.json"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(json.dumps(runner_record(campaign, t)))
                written.add(t.task)
        ingest_runner_records(cluster, spool=spool)

    for step in steps:
        if step.kind == "poll":
            poller, began, answered, view = step.args
            poll._SNAPSHOTS.pop(cluster.pk, None)
            if cluster.pk in caches[poller]:
                poll._SNAPSHOTS[cluster.pk] = caches[poller][cluster.pk]
            apply_qstat_poll(cluster, snapshot(view), observed_at=at(began), answered_at=at(answered))
            if cluster.pk in poll._SNAPSHOTS:
                caches[poller][cluster.pk] = poll._SNAPSHOTS[cluster.pk]
        elif step.kind == "accounting":
            accounting_until(step.when)
        elif step.kind == "runner":
            runner_until(step.when)
        else:
            reconcile_gone_tasks(cluster, now=at(step.when))
    # Settle: a poll after everything ended, every record read, the reconciler.
    poll._SNAPSHOTS.pop(cluster.pk, None)
    apply_qstat_poll(cluster, [], observed_at=at(last + 5), answered_at=at(last + 5.1))
    accounting_until(last + 10)
    runner_until(last + 10)
    reconcile_gone_tasks(cluster, now=at(last + 20))
    return campaign, truth


def end_state(campaign: Campaign) -> dict[int, list[tuple]]:
    out: dict[int, list[tuple]] = {}
    for row in Task.objects.filter(cluster=campaign.cluster).order_by("id"):
        out.setdefault(row.task_number, []).append((
            row.campaign_id == campaign.pk, row.state, row.active, row.exit_status, row.started_at, row.ended_at,
            row.teardown_done_at, AccountingRecord.objects.filter(task=row).count()))
    return out


@pytest.mark.parametrize("adopted_after_s", [0.5, 7.0], ids=["drmaa-quick", "drmaa-slow"])
def test_any_order_of_polls_records_and_runner_records_gives_one_row_per_task_and_one_end_state(
        tmp_path, settings, adopted_after_s):
    """Random histories (seeded): two pollers whose qstat calls overlap and are applied late, accounting
    and runner-record ingests at random moments. Every task ends with exactly one row, the one its
    campaign owns, in the state its accounting record says, with its runner record and its record:
    the same end state whatever the order."""
    failures = []
    for seed in range(budget.cases(40, check=8)):  # every seed in make test, the first 8 in make check
        campaign, truth = play(seed, tmp_path, settings, adopted_after_s=adopted_after_s)
        state = end_state(campaign)
        expected = {t.task: [(True, "done" if t.exit_status == 0 else "failed", False, t.exit_status, at(t.start),
                              at(t.end), at(t.end - 0.1), 1)] for t in truth}
        if state != expected:
            failures.append((seed, {n: (state.get(n), expected[n]) for n in expected if state.get(n) != expected[n]}))
    assert failures == []


@pytest.mark.django_db(transaction=True)
def test_the_migration_merges_rows_a_database_already_holds_twice():
    """A database from before the fix may hold tasks twice (the replay's 26.77: a done row with its
    accounting record, and an active row that ended lost, with the runner record): the migration keeps
    one row with both, and the constraint then holds."""
    from django.db import connection
    from django.db.migrations.executor import MigrationExecutor

    cluster = cluster_get_default()
    campaign = make_campaign(cluster, 26, 2)
    executor = MigrationExecutor(connection)
    executor.migrate([("dashboards", "0017_api_token_password_stamp")])
    try:
        old = executor.loader.project_state([("dashboards", "0017_api_token_password_stamp")]).apps
        OldTask = old.get_model("dashboards", "Task")
        done = OldTask.objects.get(campaign_id=campaign.pk, task_number=1)
        OldTask.objects.filter(pk=done.pk).update(state="done", active=False, exit_status=0)
        ghost = OldTask.objects.create(cluster_id=cluster.pk, campaign_id=campaign.pk, job_number=26, task_number=1,
                                       is_array=True, state="lost", active=False,
                                       runner_record={"exit_status": 0}, teardown_done_at=at(9))
        old.get_model("dashboards", "AccountingRecord").objects.create(
            cluster_id=cluster.pk, task_id=done.pk, job_number=26, task_number=1, submission_us=0, start_us=1,
            end_us=2, job_name=NAME, owner="tco", group="tco", queue="agent.q", hostname="vm", slots=1,
            wallclock_s=1.0, cpu_s=0.0, maxvmem_bytes=0.0, failed=0, exit_status=0)
        old.get_model("dashboards", "TaskEvent").objects.create(task_id=ghost.pk, at=at(9), from_state="finishing",
                                                                to_state="lost")
    finally:
        executor = MigrationExecutor(connection)
        executor.loader.build_graph()
        executor.migrate(executor.loader.graph.leaf_nodes())
    (row,) = Task.objects.filter(campaign=campaign, task_number=1)
    assert (row.pk, row.state, row.runner_record, row.teardown_done_at) == (done.pk, "done", {"exit_status": 0}, at(9))
    assert row.accounting.count() == 1 and row.events.filter(to_state="lost").count() == 1
    assert Task.objects.filter(campaign=campaign).count() == 2
