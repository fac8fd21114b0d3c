"""The in-memory FakeScheduler behaves like the GridEngine adapter where tests rely on it."""
from __future__ import annotations

import datetime as dt

import pytest

from schedulers.base import (
    AccountingRecord,
    ArrayJobSpec,
    SchedulerAdapter,
    SchedulerCommandError,
    SchedulerUnavailable,
)
from schedulers.fake import FakeScheduler
from schedulers.base import InvalidSubmission

T0 = dt.datetime(2025, 3, 1, 12, 0, tzinfo=dt.timezone.utc)


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> dt.datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += dt.timedelta(seconds=seconds)


def make_spec(**overrides) -> ArrayJobSpec:
    fields = dict(name="campaign-1", command="/usr/bin/python3", args=["-m", "execution.runner"], count=3,
                  queue="agent.q", project="research", resources={"anthropic_api": 1},
                  environment={"TCO_CAMPAIGN_ID": "1"}, working_directory="/tmp",
                  output_path="/tmp/out", error_path="/tmp/err")
    fields.update(overrides)
    return ArrayJobSpec(**fields)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def fake(clock) -> FakeScheduler:
    return FakeScheduler(first_job_number=100, clock=clock)


def states(fake) -> dict:
    return {t.key: (t.state, t.state_code) for t in fake.list_tasks()}


def test_it_satisfies_the_adapter_protocol(fake):
    adapter: SchedulerAdapter = fake
    assert callable(adapter.list_tasks) and callable(adapter.submit_array) and callable(adapter.control)


def test_submit_assigns_job_numbers_and_pending_tasks(fake):
    assert fake.submit_array(make_spec()) == (100, [1, 2, 3])
    assert fake.submit_array(make_spec(count=1)) == (101, [1])
    tasks = fake.list_tasks()
    assert [t.key for t in tasks] == [(100, 1), (100, 2), (100, 3), (101, 1)]
    first = tasks[0]
    assert (first.state, first.state_code, first.queue, first.host) == ("pending", "qw", None, None)
    assert (first.project, first.owner, first.name, first.submitted_at) == ("research", "tco", "campaign-1", T0)


def test_it_validates_like_gridengine_and_adds_nothing(fake):
    with pytest.raises(InvalidSubmission):
        fake.submit_array(make_spec(queue="agent.q -u root"))
    with pytest.raises(InvalidSubmission):
        fake.submit_array(make_spec(project="marketing"))
    assert fake.list_tasks() == [] and fake.submissions == [] and fake.next_job_number == 100


def test_tasks_run_then_finish_with_accounting_records(fake, clock):
    job, _ = fake.submit_array(make_spec())
    clock.advance(5)
    fake.start(job, [1, 2], host="node1")
    assert states(fake) == {(job, 1): ("running", "r"), (job, 2): ("running", "r"), (job, 3): ("pending", "qw")}
    running = fake.list_tasks()[0]
    assert (running.queue, running.host, running.started_at) == ("agent.q", "node1", T0 + dt.timedelta(seconds=5))

    clock.advance(10)
    (record,) = fake.finish(job, [1])
    assert isinstance(record, AccountingRecord)
    assert (record.job_number, record.task_number, record.project, record.queue) == (job, 1, "research", "agent.q")
    assert (record.failed, record.exit_status, record.wallclock_s, record.hostname) == (0, 0, 10.0, "node1")
    assert record.submitted_at == T0 and record.ended_at == T0 + dt.timedelta(seconds=15)
    assert record.identity("dev")[:3] == ("dev", job, 1)
    assert "anthropic_api=1" in record.category
    assert [t.key for t in fake.list_tasks()] == [(job, 2), (job, 3)]

    fake.finish(job, [2], exit_status=3)
    assert [r.exit_status for r in fake.accounting_records()] == [0, 3]
    assert [r.task_number for r in fake.accounting_records(since=1)] == [2]


def test_run_to_completion_finishes_every_task(fake):
    job, _ = fake.submit_array(make_spec(count=5))
    records = fake.run_to_completion(job)
    assert [r.task_number for r in records] == [1, 2, 3, 4, 5]
    assert fake.list_tasks() == []


def test_hold_release_and_a_held_running_task(fake):
    job, _ = fake.submit_array(make_spec(count=2))
    fake.start(job, [1])
    fake.control("hold", job)
    assert states(fake) == {(job, 1): ("running", "hr"), (job, 2): ("held", "hqw")}
    assert fake.start(job) == []  # a held task does not start
    fake.control("release", job, [2])
    assert states(fake)[(job, 2)] == ("pending", "qw")
    assert fake.control_calls == [["qhold", str(job)], ["qrls", f"{job}.2"]]


def test_a_spec_submitted_on_hold_stays_pending_held(fake):
    job, _ = fake.submit_array(make_spec(count=1, hold=True))
    assert states(fake) == {(job, 1): ("held", "hqw")}


def test_delete_removes_pending_tasks_without_accounting_and_bills_running_ones(fake):
    job, _ = fake.submit_array(make_spec(count=3))
    fake.start(job, [1])
    fake.control("delete", job)
    assert fake.list_tasks() == []
    (record,) = fake.accounting_records()
    assert (record.task_number, record.failed, record.exit_status) == (1, 100, 137)


def test_priority_changes_the_order_of_jat_prio(fake):
    low, _ = fake.submit_array(make_spec(count=1, priority=-100))
    high, _ = fake.submit_array(make_spec(count=1))
    fake.control("priority", high, priority=1024)
    prio = {t.job_number: t.priority for t in fake.list_tasks()}
    assert prio[high] > prio[low] and prio[high] == 1.0


def test_clear_error_puts_an_error_task_back_to_pending(fake):
    job, _ = fake.submit_array(make_spec(count=1))
    fake.set_error(job)
    assert states(fake) == {(job, 1): ("error", "Eqw")}
    fake.control("clear_error", job)
    assert states(fake) == {(job, 1): ("pending", "qw")}


def test_control_of_an_unknown_job_is_a_command_error(fake):
    with pytest.raises(SchedulerCommandError, match="does not exist"):
        fake.control("delete", 999)


def test_control_rejects_bad_arguments(fake):
    job, _ = fake.submit_array(make_spec(count=1))
    with pytest.raises(InvalidSubmission):
        fake.control("priority", job, priority=5000)
    with pytest.raises(InvalidSubmission):
        fake.control("explode", job)


def test_an_unavailable_fake_raises_the_transient_error(fake):
    fake.unavailable = True
    with pytest.raises(SchedulerUnavailable):
        fake.list_tasks()
    with pytest.raises(SchedulerUnavailable):
        fake.submit_array(make_spec())
    fake.unavailable = False
    assert fake.list_tasks() == []
