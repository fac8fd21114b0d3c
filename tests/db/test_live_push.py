"""The live push under a burst (issue 15 item 4): one read per change for many sockets, and the poll
that polls again while a burst goes on."""
from __future__ import annotations

import asyncio
import datetime as dt
import json
import time

import pytest
from asgiref.sync import async_to_sync

from dashboards.core import realtime
from dashboards.core import scope
from dashboards.live import campaign
from dashboards.models import Task

from tests.support.sockets import push, ws_connect

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_passwords", "locmem_cache")]


def test_sockets_answering_one_change_share_one_read_and_the_check_stays_per_scope(world, monkeypatch):
    viewer, lead, launcher = (world["users"][name] for name in ("viewer", "lead", "launcher"))
    alpha = world["alpha"].pk
    reads, checks = [], []
    real_read, real_check = campaign.campaign_detail, scope.campaigns_visible_to

    def counted(user, *args, **kwargs):
        reads.append(user.username)
        return real_read(user, *args, **kwargs)

    def checked(user):
        checks.append(user.username)
        return real_check(user)

    monkeypatch.setattr("dashboards.live.campaign.campaign_detail", counted)
    monkeypatch.setattr("dashboards.core.scope.campaigns_visible_to", checked)

    def revoke(user):
        user.memberships.all().delete()
        user.groups.clear()

    async def scenario():
        from channels.db import database_sync_to_async

        sockets = [await ws_connect(user, f"/ws/campaigns/{alpha}/") for user in (viewer, lead, launcher)]
        assert all(connected for _, connected, _, _ in sockets)
        reads.clear()
        checks.clear()
        await push(realtime.campaign_group(alpha), {"kind": "campaign.changed", "id": "e1"})
        first = [json.loads((await comm.receive_output(timeout=5))["text"]) for comm, _, _, _ in sockets]
        one_read = (list(reads), list(checks))
        # The launcher loses the team; the next change reaches the others and closes the launcher's socket.
        await database_sync_to_async(revoke)(launcher)
        await push(realtime.campaign_group(alpha), {"kind": "campaign.changed", "id": "e2"})
        second = [await comm.receive_output(timeout=5) for comm, _, _, _ in sockets]
        for comm, _, _, _ in sockets:
            await comm.disconnect()
        return first, one_read, second

    first, one_read, second = async_to_sync(scenario)()
    # three sockets of one scope, one change: one read, and one visibility check for the scope beside the
    # read's own (it was one per socket: 4)
    assert (len(one_read[0]), len(one_read[1])) == (1, 2)
    # the same snapshot; only "as_of" differs (each socket's own sent_at)
    same = [{k: v for k, v in m.items() if k != "as_of"} for m in first]
    assert same[0] == same[1] == same[2] and first[0]["data"]["campaign"]["name"] == "alpha"
    assert {m["as_of"]["event"] for m in first} == {"e1"}
    assert [m.get("type") for m in second] == ["websocket.send", "websocket.send", "websocket.close"]
    assert second[2]["code"] == 4403
    assert json.loads(second[0]["text"])["data"]["campaign"]["id"] == alpha


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


def test_a_snapshot_says_which_change_it_answers_and_when_the_poll_saw_it(world):
    viewer, alpha = world["users"]["viewer"], world["alpha"].pk

    async def scenario():
        comm, connected, _, first = await ws_connect(viewer, f"/ws/campaigns/{alpha}/")
        before = time.time()
        await push(realtime.campaign_group(alpha), {"kind": "campaign.changed", "id": "e7",
                                                    "observed_at": 1000.25, "published_at": 1001.5})
        answer = json.loads((await comm.receive_output(timeout=5))["text"])
        after = time.time()
        await comm.disconnect()
        return connected, first, answer, before, after

    connected, first, answer, before, after = async_to_sync(scenario)()
    assert connected and first["as_of"]["event"] is None and first["kind"] == "campaign.snapshot"
    as_of = answer["as_of"]
    assert (as_of["event"], as_of["observed_at"], as_of["published_at"]) == ("e7", 1000.25, 1001.5)
    # received, then read, then sent: all while the test waited for the answer
    assert before <= as_of["received_at"] <= as_of["read_at"] <= as_of["sent_at"] <= after
    assert answer["data"]["campaign"]["id"] == alpha


def test_a_polls_change_event_carries_when_its_qstat_began_and_when_it_was_published(
        bootstrap, settings, django_capture_on_commit_callbacks):
    from channels.layers import get_channel_layer

    from dashboards.core.clusters import cluster_get_default
    from dashboards.ingest.poll import apply_qstat_poll

    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(realtime.QUEUE_GROUP, channel)
    observed = dt.datetime(2026, 1, 1, 12, 0, 0, 250000, tzinfo=dt.timezone.utc)
    before = time.time()
    with django_capture_on_commit_callbacks(execute=True):
        apply_qstat_poll(cluster_get_default(), qstat_rows({1: "running"}), observed_at=observed)
    event = async_to_sync(layer.receive)(channel)["event"]
    assert event["kind"] == "queue.changed"
    assert event["observed_at"] == 1767268800.25     # 2026-01-01T12:00:00.25Z in epoch seconds
    assert before <= event["published_at"] <= time.time()


def test_a_read_that_began_before_a_socket_joined_is_never_reused_for_it(monkeypatch):
    from dashboards.live import consumers

    ticks = iter(range(1, 1000))
    monkeypatch.setattr(consumers, "clock", lambda: next(ticks))   # every instant a distinct, later tick
    reads = consumers.Coalescer()
    began: list[int] = []
    gate = asyncio.Event()

    async def read():
        began.append(len(began) + 1)
        await gate.wait()
        return len(began)   # which read this is: 1, 2, ...

    async def scenario():
        early = consumers.clock()                                   # tick 1: a socket joined
        first = asyncio.ensure_future(reads.read("campaign:1:1", read, early))
        await asyncio.sleep(0)                                      # read 1 begins (its start: tick 2)
        joined = consumers.clock()                                  # tick 3: more sockets join, read 1 in flight
        late = [asyncio.ensure_future(reads.read("campaign:1:1", read, joined)) for _ in range(5)]
        also_early = asyncio.ensure_future(reads.read("campaign:1:1", read, early))
        await asyncio.sleep(0)
        gate.set()
        return await first, [await t for t in late], await also_early

    first, late, also_early = async_to_sync(scenario)()
    # read 1 began before the late sockets joined: a change committed between its start and their join
    # would be in neither it nor their events; they share read 2, which began after they joined
    assert (first, also_early) == (1, 1)
    assert late == [2, 2, 2, 2, 2]
    assert began == [1, 2]


def test_a_shared_read_that_fails_is_read_again_by_each_other_caller(monkeypatch):
    from dashboards.live import consumers

    reads = consumers.Coalescer()
    calls = []

    async def failing():
        calls.append("shared")
        await asyncio.sleep(0)
        raise RuntimeError("database locked")

    async def own():
        calls.append("own")
        return "mine"

    async def scenario():
        a = asyncio.ensure_future(reads.read("k", failing, 0.0))
        await asyncio.sleep(0)
        b = asyncio.ensure_future(reads.read("k", own, 0.0))
        with pytest.raises(RuntimeError):
            await a
        return await b

    # b shared a's read (it began after b's since), which failed: b reads for itself
    assert async_to_sync(scenario)() == "mine" and calls == ["shared", "own"]


def test_sockets_opening_at_once_share_their_first_snapshot(world, monkeypatch):
    viewer, lead, launcher = (world["users"][name] for name in ("viewer", "lead", "launcher"))
    alpha = world["alpha"].pk
    reads = []
    real_read = campaign.campaign_detail

    def counted(user, *args, **kwargs):
        reads.append(user.username)
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
    # six sockets joined while the first read was queued or in flight: at most that read and one after
    assert len(reads) <= 2


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


def test_a_change_that_arrives_while_a_snapshot_is_being_read_gets_a_snapshot_of_its_own(world, monkeypatch):
    from dashboards.live import consumers

    viewer, alpha = world["users"]["viewer"], world["alpha"].pk
    reads, got, gate = [], [], {}
    real_db, real_event = consumers.db, consumers.SnapshotConsumer.tco_event

    def gated_db(fn, *args):
        async def run():
            if fn.__name__ == "read":     # the campaign page's read (not the visibility check)
                reads.append(fn)
                if len(reads) == 2:       # the read answering e1 (the first: the connect snapshot) waits
                    await gate["open"].wait()
            return await real_db(fn, *args)
        return run()

    async def recording(self, message):
        got.append(message["event"]["id"])
        await real_event(self, message)

    monkeypatch.setattr(consumers, "db", gated_db)
    monkeypatch.setattr(consumers.CampaignConsumer, "tco_event", recording)

    async def until(condition):
        while not condition():
            await asyncio.sleep(0.01)

    async def scenario():
        gate["open"] = asyncio.Event()
        comm, connected, _, _ = await ws_connect(viewer, f"/ws/campaigns/{alpha}/")
        await push(realtime.campaign_group(alpha), {"kind": "campaign.changed", "id": "e1"})
        await until(lambda: len(reads) == 2)          # the read answering e1 has begun
        await push(realtime.campaign_group(alpha), {"kind": "campaign.changed", "id": "e2"})
        await until(lambda: "e2" in got)              # e2 reached the socket while that read was on its way
        gate["open"].set()
        answers = [json.loads((await comm.receive_output(timeout=5))["text"]) for _ in range(2)]
        await comm.disconnect()
        return connected, answers

    connected, answers = async_to_sync(scenario)()
    # the read that answered e1 began before e2 arrived: e2 gets a read of its own
    assert connected and [a["as_of"]["event"] for a in answers] == ["e1", "e2"]
    assert len(reads) == 3


def test_a_process_joins_a_pages_group_once_and_hands_each_event_to_all_its_sockets(world):
    from channels.layers import get_channel_layer

    viewer, lead, launcher = (world["users"][name] for name in ("viewer", "lead", "launcher"))
    alpha = world["alpha"].pk
    group = realtime.campaign_group(alpha)

    async def scenario():
        layer = get_channel_layer()
        sockets = [await ws_connect(user, f"/ws/campaigns/{alpha}/") for user in (viewer, lead, launcher)]
        members = set(layer.groups.get(group, {}))
        await push(group, {"kind": "campaign.changed", "id": "e1"})
        answers = [json.loads((await comm.receive_output(timeout=5))["text"]) for comm, _, _, _ in sockets]
        for comm, _, _, _ in sockets[:2]:
            await comm.disconnect()
        still = set(layer.groups.get(group, {}))
        await sockets[2][0].disconnect()
        return members, answers, still, set(layer.groups.get(group, {}))

    members, answers, still, after = async_to_sync(scenario)()
    # one channel in the group for the three sockets (it was one per socket), each socket answered
    assert len(members) == 1
    assert [a["as_of"]["event"] for a in answers] == ["e1", "e1", "e1"]
    # the process stays in the group while a socket of it is there, and leaves with the last
    assert still == members and after == set()


def test_when_the_relays_receive_fails_its_sockets_are_closed_to_reconnect_and_a_new_join_relays_again(world):
    from channels.layers import get_channel_layer

    viewer, alpha = world["users"]["viewer"], world["alpha"].pk
    group = realtime.campaign_group(alpha)

    async def scenario():
        layer = get_channel_layer()
        comm, connected, _, _ = await ws_connect(viewer, f"/ws/campaigns/{alpha}/")
        relay_channel = next(iter(layer.groups[group]))
        real_receive = layer.receive

        async def receive(channel):
            if channel == relay_channel:
                raise ConnectionError("Redis went away")
            return await real_receive(channel)

        layer.receive = receive
        await push(group, {"kind": "campaign.changed", "id": "e1"})   # delivered; the next receive fails
        closed = await comm.receive_output(timeout=5)
        while closed["type"] != "websocket.close":   # e1's snapshot may come first
            closed = await comm.receive_output(timeout=5)
        layer.receive = real_receive
        # the browser reconnects: its join makes a new relay, which gets the next change
        again, reconnected, _, _ = await ws_connect(viewer, f"/ws/campaigns/{alpha}/")
        await push(group, {"kind": "campaign.changed", "id": "e2"})
        later = json.loads((await again.receive_output(timeout=5))["text"])
        await again.disconnect()
        return closed, reconnected, later

    closed, reconnected, later = async_to_sync(scenario)()
    assert closed["code"] == realtime.RECHECK
    assert reconnected and later["as_of"]["event"] == "e2"


def test_a_relay_renews_its_group_membership_before_the_layers_group_expiry_drops_it():
    # channels drops a group member group_expiry seconds after its group_add (the in-memory layer as
    # channels_redis, at the next group_send); a page open for longer (a wall display) must keep
    # getting its events, and so must a socket opened after that. 1 s stands for the default day.
    from channels.layers import InMemoryChannelLayer

    from dashboards.live import consumers

    class Sock:
        def __init__(self):
            self.got = []

        async def dispatch(self, message):
            self.got.append(message["event"]["id"])

    async def scenario():
        layer = InMemoryChannelLayer(group_expiry=1)
        relay, old, new = consumers.Relay(), Sock(), Sock()
        await relay.join(layer, "queue", old)
        await layer.group_send("queue", {"type": "tco.event", "event": {"id": "e1"}})
        await asyncio.sleep(0.2)
        await asyncio.sleep(2.5)   # past group_expiry (the layer compares whole seconds); old stays open
        await relay.join(layer, "queue", new)
        await layer.group_send("queue", {"type": "tco.event", "event": {"id": "e2"}})
        await asyncio.sleep(0.2)
        members = set(layer.groups.get("queue", {}))
        await relay.leave(layer, "queue", old)
        await relay.leave(layer, "queue", new)
        return old.got, new.got, members, set(layer.groups.get("queue", {}))

    old, new, members, after = asyncio.run(scenario())
    assert old == ["e1", "e2"] and new == ["e2"]
    assert len(members) == 1 and after == set()
