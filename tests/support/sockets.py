"""WebSockets of the live pages driven in-process (channels' communicator), and events pushed to their groups."""
from __future__ import annotations

import json

from channels.routing import URLRouter
from channels.testing import WebsocketCommunicator
from dashboards.live.routing import websocket_urlpatterns


async def ws_connect(user, path: str):
    """``(communicator, connected, close code, first message)`` for ``user`` on ``path``."""
    communicator = WebsocketCommunicator(URLRouter(websocket_urlpatterns), path)
    communicator.scope["user"] = user
    connected, code = await communicator.connect(timeout=5)
    if not connected:
        return communicator, False, code, None
    first = await communicator.receive_output(timeout=5)
    if first["type"] == "websocket.close":  # refused: accepted, then closed with a 44xx code
        return communicator, False, first.get("code"), None
    return communicator, True, None, json.loads(first["text"])


async def push(group: str, event: dict) -> None:
    from channels.layers import get_channel_layer

    await get_channel_layer().group_send(group, {"type": "tco.event", "event": event})
