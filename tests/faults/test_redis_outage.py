"""Redis stopped and started under the running stack (web server, Celery worker and beat).

While Redis is down (a few seconds: other engineers' tests share it), the
queue and campaign pages render from the database and say that live updates
are paused. Once it is back, nothing is restarted: a WebSocket connects and
receives its snapshot and a pushed change (the channel layer), the Celery
beat and worker poll and ingest again (the cluster's poll time moves on and
the accounting checkpoint reaches the end of the file), and every record of
the accounting file is in the database once.
"""
from __future__ import annotations

import asyncio
import os
import time
import urllib.request

import pytest
from django.conf import settings
from django.db import transaction
from django.test import Client
from django.utils import timezone

from dashboards.core import realtime
from dashboards.models import Cluster, IngestCheckpoint, Team
from dashboards.core.clusters import cluster_get_default
from tests.support.campaigns import make_campaign

from .services import RedisServer, wait_for
from .ledger import compare, report

pytestmark = [pytest.mark.integration]


def get(stack, path: str, session: str) -> tuple[int, str]:
    request = urllib.request.Request(stack.url + path, headers={"Cookie": f"sessionid={session}"})
    try:
        with urllib.request.urlopen(request, timeout=20) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace")


async def websocket_round(stack, session: str, cluster_name: str) -> list[str]:
    """Connect to the queue socket, read the snapshot, push a change from here, read the pushed snapshot."""
    import aiohttp
    from asgiref.sync import sync_to_async

    kinds = []
    async with aiohttp.ClientSession(cookies={"sessionid": session}) as http:
        async with http.ws_connect(stack.url.replace("http", "ws") + "/ws/queue/", origin=stack.url,
                                   timeout=10) as ws:
            first = await ws.receive_json(timeout=20)
            kinds.append(first.get("kind"))

            def push():
                with transaction.atomic():
                    realtime.queue_changed(cluster_name)

            await sync_to_async(push, thread_sensitive=False)()
            second = await ws.receive_json(timeout=20)
            kinds.append(second.get("kind"))
    return kinds


def test_redis_stopped_and_started_pages_render_and_everything_resumes(live_stack, root_only, django_user_model):
    stack = live_stack
    cluster = cluster_get_default()
    admin = django_user_model.objects.get(username="admin")
    campaign = make_campaign(team=Team.objects.get(project="research"), user=admin, name="during-redis-outage",
                             job_number=999_001, status="finished",
                             tasks=[{"state": "done", "ended_at": timezone.now()}])
    client = Client()
    client.force_login(admin)
    session = client.cookies["sessionid"].value
    assert get(stack, "/", session)[0] == 200
    wait_for("the stack's worker to poll", lambda: Cluster.objects.get(pk=cluster.pk).polled_at, 90)

    redis_server = RedisServer(settings.REDIS_URL)
    pages = {}
    try:
        redis_server.stop()
        for path in ("/", f"/campaigns/{campaign.pk}/"):
            pages[path] = get(stack, path, session)
    finally:
        redis_server.start()
    back_at = timezone.now()
    for path, (status, body) in pages.items():
        assert status == 200, (path, body[:2000])
        assert "Live updates are paused" in body, path
    assert "during-redis-outage" in pages["/"][1]

    # Live updates: a socket joins its groups on the channel layer, gets its snapshot and a pushed change.
    kinds = wait_for("a WebSocket to connect and receive pushes",
                     lambda: _try(lambda: asyncio.run(websocket_round(stack, session, cluster.name))), 60, step=1)
    assert kinds == ["queue.snapshot", "queue.snapshot"]
    # Celery: beat and worker poll and ingest again, without a restart.
    wait_for("a poll after Redis returned", lambda: Cluster.objects.get(pk=cluster.pk).polled_at > back_at, 120)
    size = os.path.getsize(cluster_get_default().accounting_path)
    wait_for("the accounting ingest to catch up",
             lambda: IngestCheckpoint.objects.filter(cluster=cluster, offset__gte=size).exists(), 120)
    assert "Live updates are paused" not in _page_when_probe_expired(stack, session)
    assert all(proc.poll() is None for _, proc in stack.procs), "a stack process died"
    offset = IngestCheckpoint.objects.get(cluster=cluster).offset
    result = compare(cluster, [cluster_get_default().accounting_path], upto={cluster_get_default().accounting_path: offset})
    report(result, "Redis stopped and started under the stack")
    assert (result["lost"], result["doubled"], result["extra"]) == (0, 0, 0), result


def _try(call):
    try:
        return call()
    except Exception:  # noqa: BLE001 - retried until the deadline (the socket is refused while Redis is back but cold)
        return None


def _page_when_probe_expired(stack, session) -> str:
    time.sleep(2.5)  # the web process reuses a Redis probe for 2 s
    return get(stack, "/", session)[1]
