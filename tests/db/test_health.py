"""Pages when part of the system is down or behind: Redis, the scheduler, an execd (dashboards/health.py)."""
from __future__ import annotations

import datetime as dt
import socket
import time

import pytest
from django.utils import timezone

from dashboards.core import health
from dashboards.ingest.poll import apply_qstat_poll, record_poll_failure
from dashboards.models import Cluster, Task, Team
from dashboards.core.clusters import cluster_get_default

from tests.support.campaigns import make_campaign

pytestmark = pytest.mark.django_db


@pytest.fixture
def dead_redis(settings):
    """Redis settings pointing at a port on which nothing listens (Redis "stopped")."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"redis://127.0.0.1:{port}/0"
    settings.REDIS_URL = url
    settings.CACHES = {"default": {"BACKEND": "dashboards.core.resilient_cache.ResilientRedisCache", "LOCATION": url,
                                   "KEY_PREFIX": "tco", "OPTIONS": {"socket_connect_timeout": 1}}}
    health._redis_probe["at"] = -1e9
    yield url
    health._redis_probe["at"] = -1e9


def test_a_failed_cache_call_pauses_live_updates_even_right_after_a_good_probe(dead_redis):
    """An "ok" probe a moment before Redis stopped must not hide the outage from the next page."""
    from django.core.cache import cache

    health._redis_probe.update(at=time.monotonic(), ok=True, error="")
    assert cache.get("k") is None  # fails, noted by the cache
    assert health.live_updates_paused()[0] is True


def test_the_cache_is_a_miss_not_an_error_while_redis_is_down(dead_redis):
    from django.core.cache import cache

    assert cache.get("k", "default") == "default"
    cache.set("k", 1)
    assert cache.add("lock", 1) is True  # the caller computes the value itself
    assert cache.get_many(["a", "b"]) == {} and cache.delete("k") is False


@pytest.mark.usefixtures("fast_passwords")
def test_queue_campaign_and_task_pages_render_from_the_database_while_redis_is_down(client, role_users,
                                                                                      dead_redis):
    research = Team.objects.get(project="research")
    campaign = make_campaign(team=research, user=role_users["admin"], name="during-outage", job_number=4242,
                             tasks=[{"state": "running", "host": "vm"}, {"state": "done", "ended_at": timezone.now()}])
    task = Task.objects.get(campaign=campaign, task_number=1)
    client.force_login(role_users["viewer"])
    for url in ("/", f"/campaigns/{campaign.pk}/", f"/tasks/{task.pk}/"):
        response = client.get(url)
        assert response.status_code == 200, url
        body = response.content.decode()
        assert "Live updates are paused" in body, url
    assert "during-outage" in client.get("/").content.decode()


def test_every_pages_outage_banner_reads_the_clusters_in_one_query_without_their_stored_status(bootstrap):
    """The banner is on every page: it reads a cluster's poll times and error, not the last poll's whole
    status (queues, hosts, jobs: JSON parsed on each read)."""
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    cluster = cluster_get_default()
    Cluster.objects.filter(pk=cluster.pk).update(status={"hosts": [{"name": f"h{n}"} for n in range(500)]})
    record_poll_failure(cluster, "SchedulerUnavailable: qstat: cannot reach qmaster")
    with CaptureQueriesContext(connection) as queries:
        [outage] = health.scheduler_unreachable()
    assert outage.cluster == cluster.name and "cannot reach qmaster" in outage.error
    assert len(queries) == 1 and '"status"' not in queries[0]["sql"].split(" FROM ")[0]


def test_a_failed_poll_keeps_the_last_state_and_says_since_when(client, role_users):
    cluster = cluster_get_default()
    research = Team.objects.get(project="research")
    campaign = make_campaign(team=research, user=role_users["admin"], name="c", job_number=777,
                             tasks=[{"state": "running", "host": "vm", "active": True}])
    first = timezone.now()
    record_poll_failure(cluster, "SchedulerUnavailable: qstat: cannot reach qmaster")
    cluster.refresh_from_db()
    since = cluster.poll_error_at
    assert since is not None and since >= first
    record_poll_failure(cluster, "SchedulerUnavailable: qstat: still down")
    cluster.refresh_from_db()
    assert cluster.poll_error_at == since and "still down" in cluster.poll_error
    [outage] = health.scheduler_unreachable()
    assert outage.since == since and outage.cluster == cluster.name
    assert list(Task.objects.filter(campaign=campaign).values_list("state", "active")) == [("running", True)]
    client.force_login(role_users["viewer"])
    body = client.get("/").content.decode()
    assert f"unreachable since {since.astimezone(dt.timezone.utc):%Y-%m-%d %H:%M:%S} UTC" in body
    # A good poll ends the outage; the next failure starts a new one.
    apply_qstat_poll(cluster, [], observed_at=timezone.now() - dt.timedelta(hours=1))
    cluster.refresh_from_db()
    assert health.scheduler_unreachable() == [] and "unreachable since" not in client.get("/").content.decode()
    record_poll_failure(cluster, "again")
    assert Cluster.objects.get(pk=cluster.pk).poll_error_at > since


def _finished_runner_task(role_users, *, minutes_ago: float, host: str = "vm", state: str = "running",
                          job_number: int = 888):
    research = Team.objects.get(project="research")
    ended = timezone.now() - dt.timedelta(minutes=minutes_ago)
    campaign = make_campaign(team=research, user=role_users["admin"], name="after-restart", job_number=job_number,
                             tasks=[{"state": state, "host": host, "active": True,
                                     "runner_record": {"version": 2, "exit_status": 0},
                                     "agent_exited_at": ended - dt.timedelta(seconds=2), "teardown_done_at": ended}])
    return Task.objects.get(campaign=campaign), ended


def test_a_task_whose_runner_finished_while_the_scheduler_lists_it_is_shown_as_such(client, role_users):
    cluster = cluster_get_default()
    Cluster.objects.filter(pk=cluster.pk).update(status={"hosts": [{"name": "vm", "load_avg": None}]})
    task, ended = _finished_runner_task(role_users, minutes_ago=5)
    note = health.task_note(task)
    assert note == ("finished per its runner; the scheduler still lists it: execd on host vm silent since "
                    f"{ended.astimezone(dt.timezone.utc):%Y-%m-%d %H:%M:%S} UTC")
    [silence] = health.execd_silences()
    assert (silence.host, silence.tasks, silence.since, silence.no_load) == ("vm", 1, ended, True)
    # The task's state is the scheduler's until the accounting record decides.
    assert Task.objects.get(pk=task.pk).state == "running"
    client.force_login(role_users["admin"])
    body = client.get("/ops/triage/").content.decode()
    assert "execd on host vm (" in body and "silent since" in body
    from dashboards.live import campaign as live_campaign
    from dashboards.live import task as live_task
    assert live_task.task_detail(role_users["admin"], task.pk, with_scheduler=False)["task"]["runner_note"] == note
    detail = live_campaign.campaign_detail(role_users["viewer"], task.campaign_id)
    assert detail["tasks"][0]["runner_note"] == note
    # Viewers see the task's note, not the admins' host notice.
    client.force_login(role_users["viewer"])
    assert "execd on host vm (" not in client.get("/").content.decode()


def test_a_runner_that_just_finished_is_not_called_out(role_users):
    task, _ = _finished_runner_task(role_users, minutes_ago=0.2)
    assert health.task_note(task) == "" and health.execd_silences() == []
    done, _ = _finished_runner_task(role_users, minutes_ago=10, state="done", job_number=889)
    assert health.task_note(done) == ""
