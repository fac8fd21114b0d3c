"""The live path (docs/live.md): one build per change and audience for any number of sockets, the finished
bytes forwarded, sequence numbers and resyncs, a bounded queue per socket; and the poll that polls again
while a burst goes on."""
from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import time

import pytest
from asgiref.sync import async_to_sync

from dashboards.core import live_bus
from dashboards.core import realtime
from dashboards.core import scope
from dashboards.live import campaign
from dashboards.live import hub as live_hub
from dashboards.live import publish, snapshots
from dashboards.models import Task

from tests.support.sockets import campaign_source, push, ws_connect

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_passwords", "locmem_cache")]


def test_sockets_on_one_view_share_one_build_per_change_and_each_is_checked_once(
        world, monkeypatch, django_capture_on_commit_callbacks):
    from channels.db import database_sync_to_async

    viewer, lead, launcher = (world["users"][name] for name in ("viewer", "lead", "launcher"))
    alpha = world["alpha"].pk
    builds, checks = [], []
    real_read, real_check = campaign.campaign_detail, scope.scopes_of

    def counted(user, *args, **kwargs):
        builds.append(user)
        return real_read(user, *args, **kwargs)

    def checked(users):
        users = list(users)
        checks.extend(user.username for user in users)     # a user's check (the producer builds for a scope)
        return real_check(users)

    monkeypatch.setattr("dashboards.live.campaign.campaign_detail", counted)
    monkeypatch.setattr("dashboards.core.scope.scopes_of", checked)

    def revoke(user):
        with django_capture_on_commit_callbacks(execute=True):
            user.memberships.all().delete()
            user.groups.clear()

    async def scenario():
        sockets = [await ws_connect(user, f"/ws/campaigns/{alpha}/") for user in (viewer, lead, launcher)]
        assert all(connected for _, connected, _, _ in sockets)
        connect = (list(builds), list(checks))
        builds.clear()
        checks.clear()
        await push(campaign_source(world["alpha"]))
        first = [(await comm.receive_output(timeout=5))["text"] for comm, _, _, _ in sockets]
        one_build = (list(builds), list(checks))
        # The launcher loses the team: its socket closes at once (to reconnect, refused); the next change
        # reaches the others only.
        await database_sync_to_async(revoke)(launcher)
        closed = await sockets[2][0].receive_output(timeout=5)
        await push(campaign_source(world["alpha"]))
        second = [await comm.receive_output(timeout=5) for comm, _, _, _ in sockets[:2]]
        assert await sockets[2][0].receive_nothing(timeout=0.3) or \
            (await sockets[2][0].receive_output())["type"] == "websocket.close"
        for comm, _, _, _ in sockets:
            await comm.disconnect()
        return connect, first, one_build, closed, second

    connect, first, one_build, closed, second = async_to_sync(scenario)()
    # opening: each socket checked once (its user), one build for the three
    assert connect[1] == ["viewer", "lead", "launcher"] and connect[0] == [scope.EVERYTHING]
    # one change: one build, no check at all, and the very same bytes on each socket
    assert one_build == ([scope.EVERYTHING], [])
    assert first[0] == first[1] == first[2] and json.loads(first[0])["data"]["campaign"]["name"] == "alpha"
    assert closed == {"type": "websocket.close", "code": realtime.RECHECK}
    assert [m["type"] for m in second] == ["websocket.send", "websocket.send"]
    assert json.loads(second[0]["text"])["seq"] == json.loads(first[0])["seq"] + 1


def test_a_snapshot_says_when_the_poll_saw_its_change_and_when_it_was_committed_read_and_published(world):
    viewer, alpha = world["users"]["viewer"], world["alpha"].pk

    async def scenario():
        comm, connected, _, first = await ws_connect(viewer, f"/ws/campaigns/{alpha}/")
        before = time.time()
        await push(campaign_source(world["alpha"]), observed_at=1000.25)
        answer = json.loads((await comm.receive_output(timeout=5))["text"])
        after = time.time()
        await comm.disconnect()
        return connected, first, answer, before, after

    connected, first, answer, before, after = async_to_sync(scenario)()
    # the connect snapshot answered no poll
    assert connected and first["as_of"]["observed_at"] is None and first["kind"] == "campaign.snapshot"
    as_of = answer["as_of"]
    assert as_of["observed_at"] == 1000.25
    # committed (marked), then read, then published: all while the test waited for the answer
    assert before <= as_of["committed_at"] <= as_of["read_at"] <= as_of["published_at"] <= after
    assert answer["data"]["campaign"]["id"] == alpha
    assert answer["view"] == f"campaign/{alpha}/1" and answer["seq"] == first["seq"] + 1


def test_a_polls_change_marks_the_queue_and_its_campaigns_with_when_its_qstat_began(
        world, django_capture_on_commit_callbacks, live_store_in_memory):
    from dashboards.core.clusters import cluster_get_default
    from dashboards.ingest.poll import apply_qstat_poll
    from schedulers.base import QstatTask

    store = live_store_in_memory
    alpha = world["alpha"]
    observed = dt.datetime(2026, 1, 1, 12, 0, 0, 250000, tzinfo=dt.timezone.utc)
    rows = [QstatTask(job_number=1001, task_number=n, name="alpha", owner="tco", project="research",
                      state="running", state_code="r", restarted=False, queue="agent.q", host="vm", slots=1,
                      submitted_at=observed, started_at=observed, priority=0.5) for n in (1, 2)]
    before = time.time()
    with django_capture_on_commit_callbacks(execute=True):
        apply_qstat_poll(cluster_get_default(), rows, observed_at=observed)
    # alpha's tasks started; beta's left qstat (finishing): one change of the queue and of each campaign,
    # marked, not yet built (nothing watched them)
    sources = ("queue", live_bus.campaign_source(alpha.pk), live_bus.campaign_source(world["beta"].pk))
    assert store.gen == {source: 1 for source in sources}
    assert store.oldest_obs == {source: 1767268800.25 for source in sources}   # 2026-01-01T12:00:00.25Z
    assert all(before <= store.oldest_commit[s] <= time.time() for s in sources)


def test_a_change_committed_while_a_view_is_built_gets_a_build_of_its_own(world, monkeypatch, live_store_in_memory):
    store = live_store_in_memory
    store.eager = False
    alpha = world["alpha"]
    view = snapshots.campaign_view(alpha.pk)
    real_read = campaign.campaign_detail
    reads = []

    def read(user, *args, **kwargs):
        data = real_read(user, *args, **kwargs)
        reads.append(data["states"]["running"])
        if len(reads) == 1:
            # committed after this read began: not in it
            Task.objects.filter(campaign=alpha, task_number=2).update(state="running")
            store.mark_changed([view.source])
        return data

    monkeypatch.setattr("dashboards.live.campaign.campaign_detail", read)
    producer = publish.Producer(store)
    store._register([view.key])
    store.mark_changed([view.source])
    first = producer.publish_pass()
    record, gen, _ = store.snapshot(view.key, view.source, register=False)
    assert (first.built, record.gen, gen) == (1, 1, 2)          # built from generation 1; 2 came meanwhile
    second = producer.publish_pass()
    record, gen, _ = store.snapshot(view.key, view.source, register=False)
    assert (second.built, record.gen, gen) == (1, 2, 2)
    assert reads == [1, 2] and json.loads(record.body)["data"]["states"]["running"] == 2
    assert producer.publish_pass().built == 0                   # nothing moved since


def test_only_watched_views_are_built_and_one_nobody_watched_is_rebuilt_before_it_is_shown(
        world, live_store_in_memory):
    store = live_store_in_memory
    store.eager = False
    alpha = world["alpha"]
    producer = publish.Producer(store)
    view = snapshots.campaign_view(alpha.pk)
    store._register([view.key])
    assert producer.publish_pass().built == 1
    store.views[view.key] = time.time() - 1          # its registration ended (nobody watched it for a minute)
    Task.objects.filter(campaign=alpha, task_number=2).update(state="running")
    store.mark_changed([view.source])
    assert producer.publish_pass().built == 0 and view.key not in store.snaps   # forgotten, not built
    # a page that opens it finds no snapshot: the producer builds it, with the change
    record, gen, watched = store.snapshot(view.key, view.source)
    assert record is None and not watched
    assert producer.publish_pass().built == 1
    record, gen, _ = store.snapshot(view.key, view.source)
    data = json.loads(record.body)
    assert record.gen == gen == 1 and data["data"]["states"]["running"] == 2
    assert data["seq"] == 2       # its sequence went on: a browser that showed seq 1 takes it


def test_a_record_round_trips_and_orders_by_its_views_sequence_within_an_epoch():
    record = live_bus.Record(7, 3, "e1", 1000.5, b'{"kind":"x"}')
    again = live_bus.Record.decode(record.encode())
    assert again == record and again.text == '{"kind":"x"}'
    assert live_bus.Record(8, 3, "e1", None, b"{}").newer_than(record)
    assert not live_bus.Record(7, 4, "e1", None, b"{}").newer_than(record)
    assert live_bus.Record(1, 1, "e2", None, b"{}").newer_than(record)      # the store lost its data: a new epoch
    with pytest.raises(ValueError):
        live_bus.Record.decode(b"not a record")


def test_views_are_named_by_their_audience_and_choices_and_parse_back():
    research = scope.Scope(frozenset({4, 1}))
    views = [snapshots.queue_view(research, 2), snapshots.depth_view(scope.EVERYTHING),
             snapshots.campaign_view(12), snapshots.campaign_view(12, page=3, state="waiting", sort="host",
                                                                  direction="desc", q="a&b", host="node-1"),
             snapshots.task_view(55, 12), snapshots.task_view(56, None)]
    assert [v.key for v in views] == ["queue/teams:1,4/2", "depth/admin", "campaign/12/1",
                                      "campaign/12/3?state=held&sort=host&dir=desc&q=a%26b&host=node-1",
                                      "task/55/12", "task/56/0"]
    assert [v.source for v in views] == ["queue", "depth", "campaign:12", "campaign:12", "campaign:12", "queue"]
    assert [snapshots.View.parse(v.key) for v in views] == views
    for bad in ("queue/everyone/1", "campaign/x/1", "secret", "queue/admin/0"):
        with pytest.raises(ValueError):
            snapshots.View.parse(bad)


def test_sockets_opening_at_once_share_their_first_snapshot(world, monkeypatch):
    viewer, lead, launcher = (world["users"][name] for name in ("viewer", "lead", "launcher"))
    alpha = world["alpha"].pk
    reads = []
    real_read = campaign.campaign_detail

    def counted(user, *args, **kwargs):
        reads.append(user)
        return real_read(user, *args, **kwargs)

    monkeypatch.setattr("dashboards.live.campaign.campaign_detail", counted)

    async def scenario():
        sockets = await asyncio.gather(*(ws_connect(user, f"/ws/campaigns/{alpha}/")
                                         for user in (viewer, lead, launcher, viewer, lead, launcher)))
        for comm, _, _, _ in sockets:
            await comm.disconnect()
        return sockets

    sockets = async_to_sync(scenario)()
    assert all(connected for _, connected, _, _ in sockets)
    assert {first["data"]["campaign"]["name"] for _, _, _, first in sockets} == {"alpha"}
    assert len({first["seq"] for _, _, _, first in sockets}) == 1
    assert len(reads) == 1   # one build for six sockets opening at once


def qstat_rows(states: dict[int, str]) -> list:
    from schedulers.base import QstatTask

    at = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    return [QstatTask(job_number=4242, task_number=n, name="burst", owner="tco", project="research", state=s,
                      state_code="r" if s == "running" else "qw", restarted=False,
                      queue="agent.q" if s == "running" else None, host="h1" if s == "running" else None, slots=1,
                      submitted_at=at, started_at=at if s == "running" else None, priority=0.5)
            for n, s in states.items()]


@pytest.mark.parametrize("started,polls", [(10, 2), (7, 1)])
def test_a_poll_that_finds_a_burst_polls_again_until_it_is_over(bootstrap, monkeypatch, started, polls):
    from dashboards.core.clusters import cluster_get_default
    from worker import tasks

    monkeypatch.setattr("dashboards.core.realtime.queue_changed", lambda *a, **k: None)
    cluster = cluster_get_default()
    pending = {n: "pending" for n in range(1, 11)}
    assert tasks.poll_burst(cluster, lambda: qstat_rows(pending), budget_s=10, every_s=0)["polls"] == 1  # new: no burst
    after = {**pending, **{n: "running" for n in range(1, started + 1)}}
    calls = []

    def list_tasks():
        calls.append(1)
        return qstat_rows(after)

    out = tasks.poll_burst(cluster, list_tasks, budget_s=10, every_s=0)
    # BURST_TASKS (8) started: one more poll, which finds nothing new, and it stops; fewer: one poll
    assert (out["polls"], len(calls), out["changed"]) == (polls, polls, started)
    assert Task.objects.filter(job_number=4242, state="running").count() == started
    # No time left in the budget: one poll, however many changed.
    after = {n: "running" for n in range(1, 11)}
    assert tasks.poll_burst(cluster, list_tasks, budget_s=0, every_s=0.01)["polls"] == 1


def test_a_poll_writes_priority_only_changes_per_priority_and_counts_no_state_change(bootstrap, monkeypatch):
    from dashboards.core.clusters import cluster_get_default
    from dashboards.ingest.poll import apply_qstat_poll
    from schedulers.base import QstatTask

    monkeypatch.setattr("dashboards.core.realtime.queue_changed", lambda *a, **k: None)
    cluster = cluster_get_default()
    at = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)

    def rows(priorities: dict[int, float], running: set[int] = frozenset()) -> list:
        return [QstatTask(job_number=5151, task_number=n, name="p", owner="tco", project="research",
                          state="running" if n in running else "pending", state_code="r" if n in running else "qw",
                          restarted=False, queue="agent.q" if n in running else None,
                          host="h1" if n in running else None, slots=1, submitted_at=at,
                          started_at=at if n in running else None, priority=p) for n, p in priorities.items()]

    apply_qstat_poll(cluster, rows({n: 0.5 for n in range(1, 7)}), observed_at=at)
    # The share tree moved tasks 1-3 to 0.6 and 4-5 to 0.55; task 6 started (and its priority moved too).
    changes = apply_qstat_poll(cluster, rows({1: 0.6, 2: 0.6, 3: 0.6, 4: 0.55, 5: 0.55, 6: 0.7}, running={6}),
                               observed_at=at + dt.timedelta(seconds=1))
    assert (changes.changed, changes.state_changes) == (6, 1)
    stored = dict(Task.objects.filter(job_number=5151).values_list("task_number", "priority"))
    assert stored == {1: 0.6, 2: 0.6, 3: 0.6, 4: 0.55, 5: 0.55, 6: 0.7}
    assert list(Task.objects.filter(job_number=5151, state="running").values_list("task_number", "host")) == [(6, "h1")]


def test_an_idle_sockets_wait_on_the_channel_layer_outlasts_its_redis_read_timeout():
    # channels_redis waits for a socket's next message with BZPOPMIN for brpop_timeout seconds; redis-py
    # 8 reads with a 5 s socket timeout unless told otherwise: with both at 5 s, every socket that got no
    # message for 5 s crashed (closed 1006) -- seen in bench_ws_latency.py's connect storm.
    from channels_redis.core import RedisChannelLayer
    from redis._defaults import DEFAULT_SOCKET_TIMEOUT

    from tco_web.settings import CHANNEL_LAYERS

    for host in CHANNEL_LAYERS["default"]["CONFIG"]["hosts"]:
        read_timeout = host.get("socket_timeout", DEFAULT_SOCKET_TIMEOUT)
        assert read_timeout is None or read_timeout >= RedisChannelLayer.brpop_timeout + 5




def test_a_process_subscribes_to_a_view_once_for_all_its_sockets_and_drops_it_after_the_last(
        world, live_store_in_memory, monkeypatch):
    viewer, lead, launcher = (world["users"][name] for name in ("viewer", "lead", "launcher"))
    alpha = world["alpha"].pk
    store = live_store_in_memory
    monkeypatch.setattr(live_hub.Hub, "LINGER_S", 0.0)
    monkeypatch.setattr(live_hub.Hub, "UPKEEP_S", 0.1)     # the hub's upkeep: every 0.1 s (a second on a site)
    name = live_bus.channel(f"campaign/{alpha}/1")

    async def scenario():
        sockets = [await ws_connect(user, f"/ws/campaigns/{alpha}/") for user in (viewer, lead, launcher)]
        ports = [p for p in store.ports if name in p.channels]
        await push(campaign_source(world["alpha"]))
        answers = [json.loads((await comm.receive_output(timeout=5))["text"]) for comm, _, _, _ in sockets]
        for comm, _, _, _ in sockets[:2]:
            await comm.disconnect()
        await asyncio.sleep(0.4)                 # four rounds of the hub's upkeep
        still = [p for p in store.ports if name in p.channels]
        await sockets[2][0].disconnect()
        await asyncio.sleep(0.4)
        return ports, answers, still, [p for p in store.ports if name in p.channels]

    ports, answers, still, after = async_to_sync(scenario)()
    # one subscription for the three sockets, each socket answered with the same record
    assert len(ports) == 1
    assert len({(a["seq"], a["epoch"]) for a in answers}) == 1
    # the process stays subscribed while a socket of it is there, and leaves with the last
    assert still == ports and after == []


def test_when_the_subscription_is_lost_the_process_subscribes_again_and_its_sockets_miss_nothing(
        world, live_store_in_memory, caplog):
    """Redis away (the subscription's reads fail, what it would have carried is lost): the web process
    subscribes again on a new connection and reads its views again; its sockets stay open and get the
    change published while it was away, then the later ones."""
    viewer, alpha = world["users"]["viewer"], world["alpha"].pk
    store = live_store_in_memory

    async def scenario():
        comm, connected, _, first = await ws_connect(viewer, f"/ws/campaigns/{alpha}/")
        (port,) = store.ports

        async def broken(timeout):
            raise ConnectionError("Redis went away")

        port.get = broken
        port.deliver = lambda name, raw: None          # what it would carry now is lost
        await push(campaign_source(world["alpha"]))   # published while the subscription is away
        missed = json.loads((await comm.receive_output(timeout=10))["text"])
        await push(campaign_source(world["alpha"]))   # through the new subscription
        later = json.loads((await comm.receive_output(timeout=5))["text"])
        quiet = await comm.receive_nothing(timeout=0.3)
        ports = set(store.ports)
        await comm.disconnect()
        return connected, first, missed, later, quiet, port, ports

    with caplog.at_level(logging.WARNING, logger="dashboards.live.hub"):
        connected, first, missed, later, quiet, old, ports = async_to_sync(scenario)()
    assert connected and quiet                          # never closed, nothing more than the two
    assert (missed["seq"], later["seq"]) == (first["seq"] + 1, first["seq"] + 2)
    assert old not in ports and len(ports) == 1         # the lost connection closed, one new one
    assert any("subscription restored" in r.getMessage() for r in caplog.records)


def test_a_process_renews_the_registration_of_the_views_its_sockets_show(world, live_store_in_memory, monkeypatch):
    # A view is built only while registered (REGISTRATION_S, a minute); a page open for longer keeps
    # getting its changes. 2.4 s stands for the minute (renewed every 0.8 s), 0.1 s for the hub's upkeep
    # (a second). 0.6 s left the renewal 0.4 s of slack, less than one stall of a loaded CI host's loop
    # (the registration lapsed, the push built nothing: a flake on PostgreSQL, 2026-12-03).
    viewer, alpha = world["users"]["viewer"], world["alpha"].pk
    store = live_store_in_memory
    monkeypatch.setattr(live_bus, "REGISTRATION_S", 2.4)
    monkeypatch.setattr(live_hub.Hub, "UPKEEP_S", 0.1)
    key = f"campaign/{alpha}/1"

    async def scenario():
        comm, connected, _, first = await ws_connect(viewer, f"/ws/campaigns/{alpha}/")
        await asyncio.sleep(3.4)                 # well past the first registration's end
        registered = store.views.get(key, 0) > time.time()
        await push(campaign_source(world["alpha"]))
        later = json.loads((await comm.receive_output(timeout=5))["text"])
        await comm.disconnect()
        return first, registered, later

    first, registered, later = async_to_sync(scenario)()
    assert registered and later["seq"] == first["seq"] + 1


class FakeSocket:
    """What an Outbox sends through: ``send`` waits while ``gate`` is closed (a client not reading)."""

    def __init__(self, gated: bool = False) -> None:
        self.sent: list[str] = []
        self.closed: list[int] = []
        self.gate = asyncio.Event()
        if not gated:
            self.gate.set()

    async def send(self, text: str) -> None:
        await self.gate.wait()
        self.sent.append(text)

    async def close(self, code: int) -> None:
        self.closed.append(code)


def records(n: int, view: str = "v") -> list:
    return [live_bus.Record(seq, seq, "e", time.time(), json.dumps({"view": view, "seq": seq}).encode())
            for seq in range(1, n + 1)]


def test_a_slow_socket_is_dropped_to_a_resync_and_never_holds_up_the_others(caplog):
    async def scenario():
        latest = {}
        slow, fast = FakeSocket(gated=True), FakeSocket()
        boxes = [live_hub.Outbox(s.send, s.close, label, latest.get, maxsize=4)
                 for s, label in ((slow, "slow"), (fast, "fast"))]
        for box in boxes:
            box.show(["v"])
        for record in records(20):
            latest["v"] = record                  # the hub keeps the latest, then offers it
            for box in boxes:
                box.offer("v", record)
            await asyncio.sleep(0)
        fast_done = list(fast.sent)
        slow.gate.set()                           # the slow client reads again
        for _ in range(20):
            await asyncio.sleep(0)
        for box in boxes:
            box.stop()
        return fast_done, slow.sent, boxes[0]

    with caplog.at_level(logging.WARNING, logger="dashboards.live.hub"):
        fast_done, slow_sent, box = async_to_sync(scenario)()
    # the fast socket got all 20 in order while the slow one was stuck
    assert [json.loads(t)["seq"] for t in fast_done] == list(range(1, 21))
    # the slow one: the one it was sending when it stalled, then straight to the latest (a resync)
    assert [json.loads(t)["seq"] for t in slow_sent] == [1, 20]
    assert box.resyncs >= 1 and box.dropped >= 4
    assert "slow fell 4 messages behind" in caplog.text and "resync" in caplog.text


def test_a_socket_whose_client_stopped_reading_is_closed_to_reconnect(world, settings, caplog, monkeypatch):
    settings.TCO_LIVE_SEND_TIMEOUT_S = 0.5
    monkeypatch.setattr(live_hub.Hub, "UPKEEP_S", 0.1)

    async def scenario():
        hub = live_hub.hub()
        stuck = FakeSocket(gated=True)
        box = hub.outbox(stuck.send, stuck.close, "stuck")
        box.show(["v"])
        hub._tasks.append(asyncio.ensure_future(hub._upkeep()))
        box.offer("v", records(1)[0])
        for _ in range(30):
            await asyncio.sleep(0.1)
            if stuck.closed:
                break
        for task in hub._tasks:
            task.cancel()
        return stuck.closed

    with caplog.at_level(logging.WARNING, logger="dashboards.live.hub"):
        assert async_to_sync(scenario)() == [realtime.RECHECK]
    assert "did not finish in 0 s" in caplog.text or "did not finish in 1 s" in caplog.text


def test_a_socket_that_asks_for_a_snapshot_gets_the_latest_unless_it_has_it(world):
    viewer, alpha = world["users"]["viewer"], world["alpha"].pk

    async def scenario():
        comm, connected, _, first = await ws_connect(viewer, f"/ws/campaigns/{alpha}/")
        await comm.send_json_to({"snapshot": True})        # it has the latest: nothing is sent
        nothing = await comm.receive_nothing(timeout=0.3)
        box = next(iter(live_hub.hub().outboxes))
        box.last.clear()                                    # as if it had missed it
        await comm.send_json_to({"snapshot": True})
        again = json.loads((await comm.receive_output(timeout=5))["text"])
        await comm.disconnect()
        return first, nothing, again

    first, nothing, again = async_to_sync(scenario)()
    snapshots.unpack(again["data"])
    assert nothing and again == first


def foreign_in(message: dict, *, campaigns: set[int], projects: set[str], jobs: set[int]) -> list[str]:
    """What of another team's (``campaigns``, ``projects``, job numbers ``jobs``) ``message`` names."""
    found = []

    def walk(value, key=""):
        if isinstance(value, dict):
            for k, v in value.items():
                walk(v, k)
        elif isinstance(value, list):
            for v in value:
                walk(v, key)
        elif key in ("campaign_id",) and value in campaigns:
            found.append(f"{key} {value}")
        elif key == "project" and value in projects:
            found.append(f"project {value}")
        elif key == "job_number" and value in jobs:
            found.append(f"job {value}")

    walk(message)
    data = message.get("data") or {}
    for row in data.get("campaigns") or []:
        if row["id"] in campaigns:
            found.append(f"campaign {row['id']}")
    if (data.get("campaign") or {}).get("id") in campaigns:
        found.append(f"campaign page {data['campaign']['id']}")
    for team in (data.get("hour") or {}).get("queued") or {}:
        if team not in ("research",):
            found.append(f"depth of {team}")
    return found


def test_no_published_payload_of_one_team_reaches_another_teams_socket(world, live_store_in_memory):
    """Every payload the producer published while both teams watched, on every socket of a research
    user: nothing of engineering's (campaign, project, job) or of the job tco did not launch; and every
    stored payload of a research audience likewise (what a page GET or a later socket would get). The
    depth history's samples live in Redis, which database tests do not reach: its scoping with samples of
    both teams is tests/integration/test_queue_depth_history.py's."""
    from channels.db import database_sync_to_async

    users = world["users"]
    alpha, beta = world["alpha"], world["beta"]
    foreign = {"campaigns": {beta.pk}, "projects": {"engineering"}, "jobs": {beta.job_number, 2000}}

    def change_everything() -> None:
        Task.objects.filter(campaign=beta).update(state="running", state_code="r", host="vm")
        Task.objects.filter(campaign=alpha, task_number=2).update(state="running", state_code="r", host="vm")
        Task.objects.filter(pk=world["other"].pk).update(state="running", host="vm")

    async def scenario():
        research = [await ws_connect(users[name], path) for name in ("viewer", "lead")
                    for path in ("/ws/queue/", f"/ws/campaigns/{alpha.pk}/", f"/ws/tasks/{world['alpha_task'].pk}/")]
        others = [await ws_connect(users[name], path) for name, path in (
            ("eng-viewer", "/ws/queue/"), ("eng-viewer", f"/ws/campaigns/{beta.pk}/"), ("admin", "/ws/queue/"),
            ("admin", f"/ws/tasks/{world['other'].pk}/"))]
        assert all(ok for _, ok, _, _ in research + others)
        got = [[first] for _, _, _, first in research]
        await database_sync_to_async(change_everything)()
        for sources in (("queue", campaign_source(beta)), ("queue", campaign_source(alpha)), ("depth",)):
            await push(*sources, observed_at=time.time())
        async def drain(comm, into):
            while not await comm.receive_nothing(timeout=0.3):
                into.append(json.loads((await comm.receive_output())["text"]))

        await asyncio.gather(*(drain(comm, got[i]) for i, (comm, _, _, _) in enumerate(research)))
        for comm, _, _, _ in research + others:
            await comm.disconnect()
        return got

    got = async_to_sync(scenario)()
    assert all(len(messages) >= 2 for messages in got)          # each got its changes
    for messages in got:
        for message in messages:
            assert foreign_in(message, **foreign) == [], message.get("view")
    research_key = scope.scope_of(users["viewer"]).key
    stored = {view: json.loads(live_bus.Record.decode(raw).body) for view, raw in live_store_in_memory.snaps.items()}
    assert {v for v in stored if v.startswith(("queue/", "depth/"))} == {
        f"queue/{research_key}/1", f"depth/{research_key}", f"queue/{scope.scope_of(users['eng-viewer']).key}/1",
        f"depth/{scope.scope_of(users['eng-viewer']).key}", "queue/admin/1", "depth/admin"}
    for view, message in stored.items():
        if research_key in view or view.startswith((f"campaign/{alpha.pk}/", f"task/{world['alpha_task'].pk}/")):
            assert foreign_in(message, **foreign) == [], view
    # and the admin's queue view does show them all (the check above would see them if they leaked)
    assert foreign_in(stored["queue/admin/1"], **foreign)


def page_json(response, script_id: str):
    html = response.content.decode()
    start = html.index(f'<script id="{script_id}" type="application/json">') + len(
        f'<script id="{script_id}" type="application/json">')
    return json.loads(html[start:html.index("</script>", start)])


def test_a_page_get_renders_the_snapshot_its_sockets_get_without_reading_it_again(world, client, monkeypatch):
    """The queue and campaign pages' live parts come from the views' latest snapshots when someone of
    the same audience watches: no build in the GET, the same data and seq as on the socket."""
    from .test_roles_scoping import login

    viewer = world["users"]["viewer"]
    alpha = world["alpha"].pk

    async def watch():
        socks = [await ws_connect(viewer, "/ws/queue/"), await ws_connect(viewer, f"/ws/campaigns/{alpha}/")]
        for comm, _, _, _ in socks:
            await comm.disconnect()
        return [first for _, _, _, first in socks]

    on_socket = async_to_sync(watch)()           # the views are registered (for a minute) and built
    builds = []
    monkeypatch.setattr("dashboards.live.queue.queue_summary", lambda *a, **k: builds.append("queue"))
    monkeypatch.setattr("dashboards.live.campaign.campaign_detail", lambda *a, **k: builds.append("campaign"))
    login(client, "lead")                          # another user of the same audience (research)
    queue_page, campaign_page = client.get("/"), client.get(f"/campaigns/{alpha}/")
    assert (queue_page.status_code, campaign_page.status_code) == (200, 200)
    assert builds == []
    assert page_json(queue_page, "initial-summary") == on_socket[0]["data"]
    assert page_json(campaign_page, "initial-campaign") == on_socket[1]["data"]
    assert page_json(queue_page, "initial-live") == {k: on_socket[0][k] for k in ("view", "epoch", "seq")}
    assert page_json(campaign_page, "initial-live") == {k: on_socket[1][k] for k in ("view", "epoch", "seq")}


def test_a_page_get_of_a_view_nobody_watches_reads_the_database_and_has_it_built(world, client, live_store_in_memory):
    from .test_roles_scoping import login

    store = live_store_in_memory
    store.eager = False
    login(client, "eng-viewer")
    page = client.get(f"/campaigns/{world['beta'].pk}/")
    assert page.status_code == 200
    assert page_json(page, "initial-campaign")["campaign"]["name"] == "beta"
    assert page_json(page, "initial-live") is None                       # read here, not a snapshot
    view = snapshots.campaign_view(world["beta"].pk)
    assert view.key in store.views and store.wakes == 1                   # registered, the producer woken
    assert publish.Producer(store).publish_pass().built >= 1 and view.key in store.snaps
    # and a campaign of another team stays a 404, snapshot or not
    assert client.get(f"/campaigns/{world['alpha'].pk}/").status_code == 404


def test_searched_campaign_pages_fetched_by_get_do_not_make_the_producer_keep_them(world, client,
                                                                                   live_store_in_memory):
    """The fresh attack's A2: a viewer fetching the campaign page with 1,264 distinct ``?q=`` in 50 s
    registered each as a watched view, rebuilt at every change for a minute (the producer's CPU 16x, the
    admin's socket lag 0.3 -> 13.5 s). A searched or host-filtered page GET reads the database and
    registers nothing; the plain page still registers its view."""
    from .test_roles_scoping import login

    store = live_store_in_memory
    store.eager = False
    login(client, "eng-viewer")
    beta = world["beta"].pk
    for n in range(20):
        page = client.get(f"/campaigns/{beta}/?q=probe{n}")
        assert page.status_code == 200 and page_json(page, "initial-live") is None
    assert client.get(f"/campaigns/{beta}/?host=sge-exec1").status_code == 200
    assert [key for key in store.views if "q=" in key or "host=" in key] == []
    assert store.wakes == 0
    client.get(f"/campaigns/{beta}/")
    assert snapshots.campaign_view(beta).key in store.views and store.wakes == 1


@pytest.mark.parametrize("failing", ["check", "channel layer"])
def test_a_handshake_whose_check_or_group_join_fails_is_closed_to_reconnect_never_answered_500(
        world, monkeypatch, failing, caplog):
    """Under load the database (locked) or Redis (timeout) may fail a socket's handshake: the socket is
    accepted and closed with RECHECK (the browser reconnects with backoff), and the log says so; an
    exception out of ``connect`` would be answered HTTP 500 by the server."""
    from django.db import OperationalError

    from dashboards.live.consumers import QueueConsumer

    if failing == "check":
        def authorize(self, user, audience, asked):
            raise OperationalError("database is locked")
        monkeypatch.setattr(QueueConsumer, "authorize", authorize)
    else:
        from channels.layers import InMemoryChannelLayer

        async def group_add(self, group, channel):
            raise ConnectionError("Redis timed out")
        monkeypatch.setattr(InMemoryChannelLayer, "group_add", group_add)

    async def scenario():
        comm, connected, code, _ = await ws_connect(world["users"]["viewer"], "/ws/queue/")
        await comm.disconnect()
        return connected, code

    with caplog.at_level(logging.WARNING, logger="dashboards.live.consumers"):
        connected, code = async_to_sync(scenario)()
    assert (connected, code) == (False, realtime.RECHECK)
    assert any("closed to reconnect" in r.getMessage() for r in caplog.records)


def test_a_connect_storm_makes_at_most_layer_calls_channel_layer_calls_at_once(world, monkeypatch):
    """On a layer without pipelines, sockets opening at once join their user's and session's groups through a
    bounded gate (issue 22: a 1,000-socket storm otherwise opened a Redis connection per call): never more
    than ``LAYER_CALLS`` at once, and every socket still joins (a logout still reaches it)."""
    from channels.layers import get_channel_layer

    from dashboards.live import memberships

    monkeypatch.setattr(memberships, "LAYER_CALLS", 2)
    layer = get_channel_layer()
    real_add = layer.group_add
    now, most, joined = [0], [0], []

    async def slow_add(group, channel):
        now[0] += 1
        most[0] = max(most[0], now[0])
        await asyncio.sleep(0.02)
        now[0] -= 1
        joined.append(group)
        return await real_add(group, channel)

    monkeypatch.setattr(layer, "group_add", slow_add)
    viewer = world["users"]["viewer"]

    async def storm():
        opened = await asyncio.gather(*(ws_connect(viewer, "/ws/queue/") for _ in range(6)))
        for comm, _, _, _ in opened:
            await comm.disconnect()
        return [connected for _, connected, _, _ in opened]

    assert async_to_sync(storm)() == [True] * 6
    assert most[0] == 2
    assert joined.count(realtime.user_group(viewer.pk)) == 6


def test_a_campaign_snapshot_carries_its_task_rows_as_a_table_that_unpacks_to_the_rows(world):
    """On the wire a campaign view's task rows are ``{"columns", "rows"}`` (a third of the bytes of dicts that
    repeat their keys); unpacked they are exactly the rows the page's builder returned."""
    view = snapshots.campaign_view(world["alpha"].pk)
    data = snapshots.build(view)
    raw = snapshots.body(view, data, seq=1, epoch="e", as_of={})
    wire = json.loads(raw)["data"]
    assert wire["tasks"]["columns"] == list(data["tasks"][0])
    assert len(wire["tasks"]["rows"]) == len(data["tasks"]) > 0
    as_table = len(json.dumps(wire["tasks"], separators=(",", ":")))
    assert as_table < len(json.dumps(data["tasks"], separators=(",", ":")))
    assert snapshots.unpack(wire) == json.loads(json.dumps(data))


def batch_sizes(monkeypatch) -> list[int]:
    """The size of each batch of sockets' checks (``consumers._check_each``) from now on, in order."""
    from dashboards.live import consumers

    sizes = []
    real = consumers._check_each

    def counted(batch):
        sizes.append(len(batch))
        return real(batch)

    monkeypatch.setattr(consumers, "_check_each", counted)
    return sizes


def test_sockets_that_open_at_once_are_checked_in_few_trips_each_with_its_own_answer(world, monkeypatch):
    """A storm of sockets: their checks share trips to the database thread (consumers.CheckBatch), and each
    socket still gets its own answer: a user of another team is refused (4403) among those let in, and a
    socket with no user is told 4401."""
    from django.contrib.auth.models import AnonymousUser

    trips = batch_sizes(monkeypatch)
    viewer, outsider = world["users"]["viewer"], world["users"]["eng-viewer"]
    alpha = world["alpha"].pk

    async def storm():
        who = [viewer] * 6 + [outsider, AnonymousUser()]
        opened = await asyncio.gather(*(ws_connect(user, f"/ws/campaigns/{alpha}/") for user in who))
        for comm, connected, _, _ in opened:
            if connected:
                await comm.disconnect()
        return [(connected, code) for _, connected, code, _ in opened]

    answers = async_to_sync(storm)()
    assert answers == [(True, None)] * 6 + [(False, 4403), (False, 4401)]
    assert sum(trips) == 8 and len(trips) < 8


def test_one_users_page_choices_cannot_make_the_producer_build_hundreds_of_views(world, memory_live_store,
                                                                                 caplog):
    """The fresh attack: a viewer's socket sent pages 2..201 (10 ms apart) and the one producer built 200
    views. A user's choices pass a token bucket (consumers.CHOICE_BURST, then CHOICE_PER_S a second): the
    store registers at most the burst's views, the log says so once, and the socket stays open."""
    from dashboards.live import consumers

    consumers._CHOICES.clear()
    viewer = world["users"]["viewer"]

    async def attack():
        comm, connected, _, _ = await ws_connect(viewer, "/ws/queue/")
        for n in range(2, 202):
            await comm.send_json_to({"page": n})
        await asyncio.sleep(0.3)
        still_open = await comm.receive_nothing(timeout=0.2) or True
        await comm.disconnect()
        return connected, still_open

    with caplog.at_level(logging.WARNING, logger="dashboards.live.consumers"):
        assert async_to_sync(attack)() == (True, True)
    pages = {key for key in memory_live_store.views if key.startswith("queue/")}
    assert 2 <= len(pages) <= consumers.CHOICE_BURST + 2       # page 1, the burst, a token refilled meanwhile
    assert caplog.text.count("view choices faster than") == 1
    consumers._CHOICES.clear()


def test_a_choice_of_the_wrong_type_or_an_infinite_page_is_ignored_and_the_socket_stays(world):
    """{"page": 1e400} (JSON's infinity) raised OverflowError in the consumer and dropped the socket with a
    traceback in the log each time (a fresh attack: a log filler); values of the wrong type likewise."""
    viewer, alpha = world["users"]["viewer"], world["alpha"].pk

    async def poke():
        comm, connected, _, _ = await ws_connect(viewer, f"/ws/campaigns/{alpha}/")
        for text in ('{"page": 1e400}', '{"page": -1e400}', '{"q": [1, 2]}', '{"sort": {"a": 1}}',
                     '{"host": 5}', '{"state": ["x"]}', "[" * 100_000):  # the last: RecursionError in json.loads
            await comm.send_to(text_data=text)
        nothing = await comm.receive_nothing(timeout=0.3)
        await comm.send_json_to({"snapshot": True})
        box = next(iter(live_hub.hub().outboxes))
        box.last.clear()
        await comm.send_json_to({"snapshot": True})
        again = json.loads((await comm.receive_output(timeout=5))["text"])
        await comm.disconnect()
        return connected, nothing, again

    connected, nothing, again = async_to_sync(poke)()
    assert connected and nothing and again["kind"] == "campaign.snapshot"


def test_the_producers_lag_counts_changes_of_watched_views_not_a_first_build_of_old_ones(world,
                                                                                          live_store_in_memory):
    store = live_store_in_memory
    store.eager = False
    alpha = world["alpha"]
    producer = publish.Producer(store)
    view = snapshots.campaign_view(alpha.pk)
    store.mark_changed([view.source], observed_at=time.time() - 60)     # a change nobody watched, a minute ago
    store._register([view.key])                                          # then a page opens
    first = producer.publish_pass()
    assert first.built == 1 and first.lags == [] and producer.status()["lag_p95_s"] is None
    observed = time.time() - 0.5
    Task.objects.filter(campaign=alpha, task_number=2).update(state="running")
    store.mark_changed([view.source], observed_at=observed)              # a change while it is watched
    second = producer.publish_pass()
    assert second.built == 1 and len(second.lags) == 1
    assert 0.5 <= second.lags[0] < 0.5 + 30
    assert producer.status()["lag_p95_s"] == round(second.lags[0], 3)


def test_a_sockets_messages_and_close_take_no_trip_to_the_database_thread(world, monkeypatch):
    """Channels sends ``close_old_connections`` to the database thread before every message it dispatches
    (the connect, each browser message, the disconnect); the live consumers do not (issue 22: a storm of
    1,000 sockets queued 1,000 such trips beside the checks, on the one thread of the sync views). Once a
    socket is open, asking for snapshots and closing it make no trip to that thread at all."""
    from asgiref.sync import SyncToAsync

    trips = []
    real = SyncToAsync.thread_handler

    def counted(self, *args, **kwargs):
        trips.append(getattr(self.func, "__name__", repr(self.func)))
        return real(self, *args, **kwargs)

    monkeypatch.setattr(SyncToAsync, "thread_handler", counted)
    viewer, alpha = world["users"]["viewer"], world["alpha"].pk

    async def scenario():
        comm, connected, _, first = await ws_connect(viewer, f"/ws/campaigns/{alpha}/")
        at_open = len(trips)
        box = next(iter(live_hub.hub().outboxes))
        for _ in range(3):
            box.last.clear()
            await comm.send_json_to({"snapshot": True})
            again = json.loads((await comm.receive_output(timeout=5))["text"])
            assert again["view"] == first["view"]
        await comm.disconnect()
        return connected, at_open

    connected, at_open = async_to_sync(scenario)()
    assert connected and at_open >= 1       # the socket's check went to the database thread
    assert trips[at_open:] == []


def test_sockets_opening_at_once_on_redis_join_their_users_group_in_a_few_round_trips(
        world, settings, monkeypatch):
    """On channels_redis' layer, the group joins of sockets that open at once go in pipelines (issue 22: two
    round trips per join made most of a connect storm's time); each socket is in its user's group when it gets
    its first snapshot (a change of rights reaches it), and out of it after its disconnect."""
    from channels_redis.core import RedisChannelLayer

    from tests.support.channel_redis import FakeRedis

    redis = FakeRedis()
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels_redis.core.RedisChannelLayer",
                                           "CONFIG": {"hosts": ["redis://127.0.0.1:9/0"], "prefix": "t:asgi"}}}
    monkeypatch.setattr(RedisChannelLayer, "connection", lambda self, index: redis)
    users = [world["users"][name] for name in ("viewer", "lead", "launcher", "admin")] * 5

    def members(group: str) -> set[str]:
        return set(redis.sets.get(f"t:asgi:group:{group}".encode(), {}))

    async def storm():
        opened = await asyncio.gather(*(ws_connect(user, "/ws/queue/") for user in users))
        joined = {user.pk: members(realtime.user_group(user.pk)) for user in users}
        trips = redis.trips
        for comm, _, _, _ in opened:
            await comm.disconnect()
        return [connected for _, connected, _, _ in opened], joined, trips

    connected, joined, trips = async_to_sync(storm)()
    assert connected == [True] * 20
    assert {pk: len(channels) for pk, channels in joined.items()} == {u.pk: 5 for u in users}
    assert len(set().union(*joined.values())) == 20
    # The layer's own group_add: ZADD then EXPIRE, a round trip each, 20 joins: 40. Batched: a few pipelines.
    assert trips <= 6
    assert all(not channels for channels in redis.sets.values())


def test_one_trip_to_the_database_thread_checks_the_batches_waiting_and_each_socket_gets_its_answer(
        world, monkeypatch):
    """Under a connect storm the event loop is busy: a trip to the database thread per batch of checks waited
    for it between two batches (issue 22, traced). A trip checks the batches that wait (at most TRIP_BATCHES),
    and each socket still gets its own answer."""
    from django.contrib.auth.models import AnonymousUser

    from dashboards.live import consumers

    monkeypatch.setattr(consumers, "CHECK_BATCH", 2)
    monkeypatch.setattr(consumers, "TRIP_BATCHES", 3, raising=False)   # absent before a trip took several batches
    batches = batch_sizes(monkeypatch)
    viewer, outsider = world["users"]["viewer"], world["users"]["eng-viewer"]
    alpha = world["alpha"].pk

    async def storm():
        who = [viewer] * 5 + [outsider, AnonymousUser(), viewer, outsider]
        opened = await asyncio.gather(*(ws_connect(user, f"/ws/campaigns/{alpha}/") for user in who))
        trips = consumers.checks().trips
        for comm, connected, _, _ in opened:
            if connected:
                await comm.disconnect()
        return [(connected, code) for _, connected, code, _ in opened], trips

    answers, trips = async_to_sync(storm)()
    assert answers == [(True, None)] * 5 + [(False, 4403), (False, 4401), (True, None), (False, 4403)]
    assert sum(batches) == 9 and max(batches) <= 2
    assert -(-len(batches) // 3) <= trips < len(batches)


def test_a_failed_trip_to_the_database_thread_closes_each_of_its_sockets_to_reconnect(world, monkeypatch):
    from django.db import OperationalError

    from dashboards.live import consumers

    async def down(fn, *args):
        raise OperationalError("database is locked")

    monkeypatch.setattr(consumers, "db", down)
    viewer = world["users"]["viewer"]

    async def storm():
        opened = await asyncio.gather(*(ws_connect(viewer, "/ws/queue/") for _ in range(5)))
        return [(connected, code) for _, connected, code, _ in opened]

    assert async_to_sync(storm)() == [(False, realtime.RECHECK)] * 5
