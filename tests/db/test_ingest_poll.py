"""The poll diff as it lands in the database: added, changed, gone, adopted by campaigns."""
from __future__ import annotations

import datetime as dt

import pytest
from django.utils import timezone

from dashboards.models import Campaign, Task, TaskEvent
from dashboards.core.clusters import cluster_get_default
from dashboards.ingest.poll import apply_qstat_poll, reconcile_gone_tasks
from schedulers.base import QstatTask

pytestmark = pytest.mark.django_db

T0 = dt.datetime(2026, 11, 29, 12, 0, 0, tzinfo=dt.timezone.utc)


def qtask(job: int, task: int | None, code: str, state: str, host: str | None = None) -> QstatTask:
    return QstatTask(job_number=job, task_number=task, name="tco-inst1-c1-demo", owner="tco", project="research",
                     state=state, state_code=code, restarted=False,
                     queue="agent.q" if host else None, host=host, slots=1,
                     submitted_at=T0, started_at=T0 + dt.timedelta(seconds=5) if host else None, priority=0.5)


def test_it_creates_one_row_per_task_and_never_keys_by_job_alone():
    cluster = cluster_get_default()
    changes = apply_qstat_poll(cluster, [qtask(7, 1, "r", "running", "vm"), qtask(7, 2, "qw", "pending"),
                                         qtask(8, None, "qw", "pending")], observed_at=T0)
    assert changes.added == 3
    rows = {(t.job_number, t.task_number): t for t in Task.objects.all()}
    assert set(rows) == {(7, 1), (7, 2), (8, 0)}
    assert rows[(7, 1)].state == "running" and rows[(7, 1)].host == "vm" and rows[(7, 1)].is_array
    assert rows[(8, 0)].is_array is False and rows[(8, 0)].task_id == "8"


def test_it_writes_only_changes_and_records_state_events():
    cluster = cluster_get_default()
    apply_qstat_poll(cluster, [qtask(7, 1, "qw", "pending"), qtask(7, 2, "qw", "pending")], observed_at=T0)
    later = T0 + dt.timedelta(seconds=2)
    changes = apply_qstat_poll(cluster, [qtask(7, 1, "r", "running", "vm"), qtask(7, 2, "qw", "pending")],
                               observed_at=later)
    assert (changes.added, changes.changed, changes.gone) == (0, 1, 0)
    event = TaskEvent.objects.get(to_state="running")
    assert event.from_state == "pending" and event.task.task_number == 1
    again = apply_qstat_poll(cluster, [qtask(7, 1, "r", "running", "vm"), qtask(7, 2, "qw", "pending")],
                             observed_at=later + dt.timedelta(seconds=1))
    assert not again.any


def test_a_task_gone_from_qstat_is_finishing_not_done():
    cluster = cluster_get_default()
    apply_qstat_poll(cluster, [qtask(7, 1, "r", "running", "vm")], observed_at=T0)
    changes = apply_qstat_poll(cluster, [], observed_at=T0 + dt.timedelta(seconds=1))
    assert changes.gone == 1
    task = Task.objects.get()
    assert task.state == "finishing" and task.active


def test_a_task_created_after_the_snapshot_started_is_not_gone():
    cluster = cluster_get_default()
    apply_qstat_poll(cluster, [qtask(7, 1, "qw", "pending")], observed_at=T0)
    # The snapshot was taken before the task's row existed (a submission raced the poll).
    changes = apply_qstat_poll(cluster, [], observed_at=T0 - dt.timedelta(seconds=1))
    assert changes.gone == 0 and Task.objects.get().state == "pending"


def test_gone_tasks_without_accounting_become_deleted_or_lost_after_the_grace(settings):
    settings.TCO_LOST_GRACE_S = 60
    settings.TCO_DELETED_GRACE_S = 10
    cluster = cluster_get_default()
    apply_qstat_poll(cluster, [qtask(7, 1, "r", "running", "vm"), qtask(7, 2, "qw", "pending")], observed_at=T0)
    apply_qstat_poll(cluster, [], observed_at=T0 + dt.timedelta(seconds=1))
    assert reconcile_gone_tasks(cluster, now=T0 + dt.timedelta(seconds=5)) == 0
    assert reconcile_gone_tasks(cluster, now=T0 + dt.timedelta(seconds=30)) == 1  # the one that never started
    assert Task.objects.get(task_number=2).state == "deleted"
    assert Task.objects.get(task_number=1).state == "finishing"
    assert reconcile_gone_tasks(cluster, now=T0 + dt.timedelta(seconds=120)) == 1
    states = dict(Task.objects.values_list("task_number", "state"))
    assert states == {1: "lost", 2: "deleted"}
    assert not Task.objects.filter(active=True).exists()


def _unsubmitted_campaign(user_model, predecessor_job: int | None = None) -> Campaign:
    """A campaign of 2 tasks, not submitted yet, on the default cluster."""
    from dashboards.models import AgentDefinition
    from dashboards.core.accounts import team_ensure

    team = team_ensure(name="research", project="research")
    user = user_model.objects.create_user("lead")
    agent = AgentDefinition.objects.create(name="a", command=["true"])
    return Campaign.objects.create(name="c", cluster=cluster_get_default(), team=team, agent_definition=agent,
                                   launched_by=user, queue="agent.q", task_count=2, launched_at=timezone.now(),
                                   predecessor_job=predecessor_job)


def test_rows_seen_before_submission_returned_are_adopted_by_the_campaign(django_user_model):
    from dashboards.launch.submit import campaign_submit
    from schedulers.fake import FakeScheduler

    cluster = cluster_get_default()
    campaign = _unsubmitted_campaign(django_user_model)
    job = 4242
    fake = FakeScheduler(first_job_number=job)
    # The poll sees the job first.
    apply_qstat_poll(cluster, [qtask(job, 1, "qw", "pending")], observed_at=T0)
    assert Task.objects.get().campaign_id is None
    campaign = campaign_submit(campaign_id=campaign.pk, scheduler=fake)
    assert campaign.job_number == job
    assert Task.objects.filter(campaign=campaign).count() == 2
    assert Task.objects.filter(job_number=job).count() == 2


@pytest.mark.parametrize("code, state, host, predecessor, status", [
    ("r", "running", "vm", None, "running"),
    ("hqw", "held", None, 4000, "waiting"),
    ("hqw", "held", None, None, "paused"),
    ("qw", "pending", None, None, "submitted"),
])
def test_a_campaign_whose_job_a_poll_saw_first_takes_the_status_of_its_tasks(
        django_user_model, code, state, host, predecessor, status):
    # CI: the successor of a -hold_jid_ad campaign stayed "submitted" with both tasks held: the poll had
    # made its rows (hqw) before the submit worker committed the job number, and no later poll changed them.
    from dashboards.launch.submit import campaign_submit
    from schedulers.fake import FakeScheduler

    cluster = cluster_get_default()
    campaign = _unsubmitted_campaign(django_user_model, predecessor)
    job = 4242
    apply_qstat_poll(cluster, [qtask(job, 1, code, state, host), qtask(job, 2, code, state, host)], observed_at=T0)
    campaign = campaign_submit(campaign_id=campaign.pk, scheduler=FakeScheduler(first_job_number=job))
    assert campaign.job_number == job
    assert Campaign.objects.get(pk=campaign.pk).status == status
    assert sorted(Task.objects.filter(campaign=campaign).values_list("state", flat=True)) == [state, state]
    # The next poll, which changes nothing, leaves it so.
    apply_qstat_poll(cluster, [qtask(job, 1, code, state, host), qtask(job, 2, code, state, host)],
                     observed_at=T0 + dt.timedelta(seconds=1))
    assert Campaign.objects.get(pk=campaign.pk).status == status


@pytest.fixture
def fresh_snapshots():
    from dashboards.ingest import poll

    poll._SNAPSHOTS.clear()
    yield poll._SNAPSHOTS
    poll._SNAPSHOTS.clear()


@pytest.mark.django_db(transaction=True)
def test_later_polls_diff_against_the_last_snapshot_and_still_see_new_rows(fresh_snapshots):
    cluster = cluster_get_default()
    apply_qstat_poll(cluster, [qtask(7, 1, "qw", "pending"), qtask(7, 2, "qw", "pending")], observed_at=T0)
    assert set(fresh_snapshots[cluster.pk]) == {(7, 1), (7, 2)}
    changes = apply_qstat_poll(cluster, [qtask(7, 1, "r", "running", "vm"), qtask(7, 2, "qw", "pending")],
                               observed_at=T0 + dt.timedelta(seconds=1))
    assert (changes.added, changes.changed, changes.gone) == (0, 1, 0)
    assert Task.objects.get(task_number=1).state == "running"
    # A row written by someone else (a campaign submitted) is not in the snapshot:
    # the count check sends the next poll back to the database.
    Task.objects.create(cluster=cluster, job_number=9, task_number=1, is_array=True, state="pending",
                        first_seen_at=T0)
    changes = apply_qstat_poll(cluster, [qtask(7, 1, "r", "running", "vm"), qtask(7, 2, "qw", "pending"),
                                         qtask(9, 1, "r", "running", "vm")], observed_at=T0 + dt.timedelta(seconds=2))
    assert changes.changed == 1 and Task.objects.get(job_number=9).state == "running"
    changes = apply_qstat_poll(cluster, [qtask(7, 2, "qw", "pending"), qtask(9, 1, "r", "running", "vm")],
                               observed_at=T0 + dt.timedelta(seconds=3))
    assert changes.gone == 1 and Task.objects.get(job_number=7, task_number=1).state == "finishing"
    assert Task.objects.filter(state="running").count() == 1


def test_a_waiting_jobs_position_counts_jobs_ahead_by_priority():
    from dashboards.core.scheduler_cache import pending_position

    cluster = cluster_get_default()
    rows = []
    for job, prio in ((10, 0.9), (11, 0.5), (12, 0.7)):
        for n in (1, 2):
            t = qtask(job, n, "qw", "pending")
            t.priority = prio
            rows.append(t)
    apply_qstat_poll(cluster, rows, observed_at=T0)
    (position,) = pending_position(cluster, 11, "research", user=None)  # every job (the admins' triage page)
    assert position["text"] == "number 3 of 3 waiting jobs in the cluster's priority order"
    assert pending_position(cluster, 10, None, user=None)[0]["text"].startswith("number 1 of 3")
    assert pending_position(cluster, 99, None, user=None) == []


def test_a_new_tasks_row_carries_every_field_qstat_gave_and_events_carry_the_poll_time():
    """The poll's prepared insert (dashboards.core.bulk.insert_varying) stores what the ORM would: each
    column from the qstat task, the rest the model's defaults; a gone task's event is at the poll's
    instant, from its last state."""
    cluster = cluster_get_default()
    running = QstatTask(job_number=9, task_number=3, name="x" * 300, owner="alice", project="engineering",
                        state="running", state_code="Rr", restarted=True, queue="agent.q", host="sge-exec2",
                        slots=2, submitted_at=T0, started_at=T0 + dt.timedelta(seconds=4, microseconds=250),
                        priority=0.75)
    apply_qstat_poll(cluster, [running], observed_at=T0 + dt.timedelta(seconds=5))
    row = Task.objects.get(job_number=9)
    assert (row.task_number, row.is_array, row.name, row.owner, row.project, row.queue, row.host, row.slots,
            row.priority, row.state, row.state_code, row.restarted) == (
        3, True, "x" * 255, "alice", "engineering", "agent.q", "sge-exec2", 2, 0.75, "running", "Rr", True)
    assert row.submitted_at == T0 and row.started_at == T0 + dt.timedelta(seconds=4, microseconds=250)
    assert row.first_seen_at == T0 + dt.timedelta(seconds=5) and row.active and row.campaign_id is None
    assert row.usage_flags == [] and row.runner_record is None and row.gone_at is None
    gone_at = T0 + dt.timedelta(seconds=9)
    apply_qstat_poll(cluster, [], observed_at=gone_at)
    row.refresh_from_db()
    assert (row.state, row.gone_at) == ("finishing", gone_at)
    event = TaskEvent.objects.get(task=row)
    assert (event.at, event.from_state, event.to_state, event.state_code) == (gone_at, "running", "finishing", "")


def test_an_older_snapshot_applied_after_a_newer_one_writes_nothing():
    """Two pollers (the poll worker and tco_replay_seed's loop) finished out of order on the dev
    cluster: the snapshot taken at .426 s was applied after the one taken at .718 s, when the task had
    ended and its row was inactive (accounting), so the older view gave the task a second, active row
    that later ended "lost" (4 such rows in a 256-task run). An older snapshot is now not applied."""
    cluster = cluster_get_default()
    apply_qstat_poll(cluster, [qtask(7, 1, "r", "running", "vm")], observed_at=T0)
    newer = apply_qstat_poll(cluster, [], observed_at=T0 + dt.timedelta(seconds=2))
    assert newer.gone == 1 and not newer.stale
    # Its accounting record ended it (as finalize_finishing does): done, no longer active.
    Task.objects.filter(job_number=7).update(state="done", active=False)
    older = apply_qstat_poll(cluster, [qtask(7, 1, "r", "running", "vm")], observed_at=T0 + dt.timedelta(seconds=1))
    assert older.stale and not older.any
    assert list(Task.objects.filter(job_number=7).values_list("state", "active")) == [("done", False)]
    cluster.refresh_from_db()
    assert cluster.poll_observed_at == T0 + dt.timedelta(seconds=2)
    # The same instant again is not newer either; a later one is applied.
    assert apply_qstat_poll(cluster, [], observed_at=T0 + dt.timedelta(seconds=2)).stale
    assert not apply_qstat_poll(cluster, [], observed_at=T0 + dt.timedelta(seconds=3)).stale
