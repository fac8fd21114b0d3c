"""The data behind the live pages: share tree, queue-depth history, bounded queries, the agent page."""
from __future__ import annotations

from pathlib import Path

import pytest

from dashboards.live import history
from dashboards.live import queue
from dashboards.models import Team

from tests.support.campaigns import make_campaign
from asgiref.sync import async_to_sync
from tests.support.sockets import push, ws_connect

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"


@pytest.fixture
def clean_depth():
    history.depth_clear()
    yield
    history.depth_clear()


@pytest.mark.django_db
@pytest.mark.usefixtures("fast_passwords", "clean_depth")
def test_depth_history_is_scoped_per_team_and_keeps_a_day_of_minutes(role_users):
    t0 = 1_800_000_000.0
    for i in range(6):  # one sample every 30 s over 2.5 minutes
        history.depth_sample_record(counts={"dev": {"research": {"pending": 10 + i, "held": 1, "running": 2},
                                                    "engineering": {"pending": 100}, "": {"pending": 7}}},
                                    now=t0 + 30 * i)
    import time as time_module

    real_time = time_module.time
    try:
        time_module.time = lambda: t0 + 200
        viewer = queue.queue_depth_history(role_users["viewer"], "hour")
        day = queue.queue_depth_history(role_users["viewer"], "day")
        admin = queue.queue_depth_history(role_users["admin"], "hour")
    finally:
        time_module.time = real_time
    assert viewer["queued"] == {"research": [11, 12, 13, 14, 15, 16]} and viewer["running"] == [2] * 6
    assert len(viewer["t"]) == 6 and viewer["t"][0].endswith("Z")
    assert day["queued"] == {"research": [11, 13, 15]}  # one a minute
    assert set(admin["queued"]) == {"research", "engineering", "no project"}


@pytest.mark.django_db
@pytest.mark.usefixtures("fast_passwords", "locmem_cache", "clean_depth")
def test_a_depth_sample_counts_active_tasks_per_project(role_users, settings):
    settings.CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    research = Team.objects.get(project="research")
    make_campaign(team=research, user=role_users["admin"], name="a", tasks=[
        {"state": "pending"}, {"state": "running"}, {"state": "done"}])
    sample = history.depth_sample_take()
    assert sample["c"] == {"dev": {"research": {"pending": 1, "running": 1}}}
    assert history.depth_samples("hour")[-1]["c"] == sample["c"]


def test_the_queue_socket_forwards_new_depth_samples_scoped(world, settings):
    """The depth history in Redis; the live store in this process's memory, its producer run at each
    change mark, so the socket's messages come from this test's database."""
    import time

    from channels.db import database_sync_to_async

    from dashboards.core import live_bus

    settings.TCO_LIVE_BUS = "memory"
    live_bus.MEMORY.reset()
    history.depth_clear()
    history.depth_sample_record(counts={"dev": {"research": {"pending": 3}, "engineering": {"pending": 5},
                                                "": {"pending": 1}}}, now=time.time() - 5)
    viewer = world["users"]["viewer"]

    async def scenario():
        comm, ok, _, first = await ws_connect(viewer, "/ws/queue/")
        quiet = await comm.receive_nothing(timeout=0.3)           # the page has the depth history already
        await database_sync_to_async(history.depth_sample_record)(
            counts={"dev": {"research": {"pending": 4}, "engineering": {"pending": 9}}}, now=time.time())
        await push("depth")                                       # realtime.depth_sampled, after it
        pushed = await comm.receive_json_from(timeout=5)
        await comm.disconnect()
        return first, quiet, pushed

    try:
        first, quiet, pushed = async_to_sync(scenario)()
    finally:
        history.depth_clear()
        live_bus.MEMORY.reset()
    assert first["kind"] == "queue.snapshot" and quiet
    # the new sample, scoped: engineering's 5 and 9 and the job without a project never reach a research viewer
    assert pushed["kind"] == "queue.depth" and pushed["data"]["hour"]["queued"] == {"research": [3, 4]}
