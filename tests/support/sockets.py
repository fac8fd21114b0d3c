"""WebSockets of the live pages driven in-process (channels' communicator), and changes marked in the live store."""
from __future__ import annotations

import json

from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from dashboards.live.routing import websocket_urlpatterns


async def ws_connect(user, path: str):
    """``(communicator, connected, close code, first message)`` for ``user`` on ``path``; the first message's
    tables unpacked as the browser's live.js unpacks them (``live.snapshots.unpack``)."""
    from dashboards.live.snapshots import unpack

    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path)
    communicator.scope["user"] = user
    connected, code = await communicator.connect(timeout=5)
    if not connected:
        return communicator, False, code, None
    first = await communicator.receive_output(timeout=5)
    if first["type"] == "websocket.close":  # refused: accepted, then closed with a 44xx code
        return communicator, False, first.get("code"), None
    message = json.loads(first["text"])
    unpack(message.get("data") or {})
    return communicator, True, None, message


async def push(*sources: str, observed_at: float | None = None) -> None:
    """What a commit that changed ``sources`` does after it (core.realtime.changed): mark them changed in
    the live store; the in-memory store runs the producer then (tests/conftest.py sets it for unit and
    database tests)."""
    from channels.db import database_sync_to_async

    from dashboards.core import live_bus

    await database_sync_to_async(live_bus.bus().mark_changed)(sorted(sources), observed_at)


async def next_of(comm, kind: str) -> dict:
    """The next message of ``kind`` on ``comm`` (a queue socket also gets its depth history)."""
    while True:
        message = await comm.receive_json_from(timeout=5)
        if message.get("kind") == kind:
            return message


def campaign_source(campaign) -> str:
    """The live store's source of ``campaign``'s views (``core.live_bus.campaign_source``)."""
    from dashboards.core import live_bus

    return live_bus.campaign_source(campaign.pk)
