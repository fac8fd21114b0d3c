"""worker.poll_loop: the qstat poll in a loop of its own (manage.py tco_poll), and the beat that then leaves it."""
from __future__ import annotations

import contextlib
import threading

import pytest

from dashboards.core.clusters import cluster_get_default
from worker import poll_loop

pytestmark = pytest.mark.django_db


@pytest.fixture
def tasks(monkeypatch):
    import worker.tasks as tasks

    held = []

    @contextlib.contextmanager
    def always_mine(name, timeout):
        held.append(name)
        yield True

    monkeypatch.setattr(tasks, "single_flight", always_mine)
    tasks.held = held
    return tasks


def test_the_loop_polls_its_cluster_again_and_again_under_the_poll_lock(bootstrap, tasks, monkeypatch):
    stop = threading.Event()
    polled = []

    def poll_cluster(cluster):
        polled.append(cluster.name)
        if len(polled) == 3:
            stop.set()
        return {"added": 0, "changed": 0, "gone": 0, "polls": 1}

    monkeypatch.setattr(tasks, "poll_cluster", poll_cluster)
    name = cluster_get_default().name
    assert poll_loop.poll_forever(name, stop, interval_s=0.0) == 3
    assert polled == [name] * 3
    assert tasks.held == [f"poll:{name}"] * 3


def test_a_failing_poll_does_not_end_the_loop(bootstrap, tasks, monkeypatch):
    stop = _Waits(3)   # records the loop's waits instead of sleeping them
    calls = []

    def poll_cluster(cluster):
        calls.append(cluster.name)
        if len(calls) == 1:
            raise RuntimeError("database away")
        stop.set()
        return {"error": "SchedulerUnavailable: unable to contact qmaster"}

    monkeypatch.setattr(tasks, "poll_cluster", poll_cluster)
    assert poll_loop.poll_forever(cluster_get_default().name, stop, interval_s=0.0) == 1
    assert len(calls) == 2
    assert stop.waits[0] == 1.0     # the poll after a failure comes a second later


def test_no_poll_while_another_poller_holds_the_lock_and_none_of_a_cluster_not_watched(bootstrap, monkeypatch):
    import worker.tasks as tasks

    stop = threading.Event()

    @contextlib.contextmanager
    def theirs(name, timeout):
        stop.set()
        yield False

    monkeypatch.setattr(tasks, "single_flight", theirs)
    monkeypatch.setattr(tasks, "poll_cluster", lambda cluster: pytest.fail("polled without the lock"))
    assert poll_loop.poll_forever(cluster_get_default().name, stop, interval_s=0.0) == 0
    assert poll_loop.poll_forever("no-such-cluster", threading.Event(), interval_s=0.0) == 0


class _Waits(threading.Event):
    """A stop event that records each wait's timeout (seconds) instead of sleeping, and stops after ``n``."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.n, self.waits = n, []

    def wait(self, timeout=None):
        self.waits.append(timeout)
        if len(self.waits) >= self.n:
            self.set()
        return self.is_set()


def test_the_next_poll_comes_sooner_while_tasks_change_state(bootstrap, tasks, monkeypatch):
    """A poll that saw tasks start or end is followed by one ``active_s`` after it began; a quiet one by
    one ``interval_s`` after (issue 22: the cadence is the first part of a change's lag)."""
    results = iter([{"state_changes": 96}, {"state_changes": 0}, {"state_changes": 3}, {"error": "qmaster away"}])
    monkeypatch.setattr(tasks, "poll_cluster", lambda cluster: next(results))
    clock = iter(range(0, 100, 1))   # time.monotonic() as the loop reads it: whole seconds, 1 s a call
    monkeypatch.setattr(poll_loop.time, "monotonic", lambda: float(next(clock)) / 1000)  # ~0 s polls
    stop = _Waits(4)
    assert poll_loop.poll_forever(cluster_get_default().name, stop, interval_s=1.0, active_s=0.5) == 4
    assert [round(w, 3) for w in stop.waits] == [0.499, 0.999, 0.499, 0.999]


@pytest.mark.parametrize("loop, polled_by_beat", [(False, True), (True, False)])
def test_the_beat_queues_the_poll_only_without_the_loop(settings, loop, polled_by_beat):
    from tco_web.celery import setup_periodic_tasks

    settings.TCO_POLL_LOOP = loop
    queued = []

    class Sender:
        def signature(self, name, **kwargs):
            return name

        def add_periodic_task(self, every, signature, name):
            queued.append(signature)

    setup_periodic_tasks(Sender())
    assert ("worker.tasks.poll_queue" in queued) is polled_by_beat
    assert "worker.tasks.poll_cluster_status" in queued and "worker.tasks.sample_queue_depth" in queued
