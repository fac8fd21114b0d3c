"""WebSocket consumers: authenticate, join groups, forward scoped snapshots.

A change event carries no task data; the consumer answers it by reading the
snapshot its own user may see (selectors), at most once per ``MIN_INTERVAL_S``
so a burst of changes costs one read.
"""
from __future__ import annotations

import asyncio
import time

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from . import realtime, selectors

MIN_INTERVAL_S = 0.3


class SnapshotConsumer(AsyncJsonWebsocketConsumer):
    """Base: sends a snapshot on connect and after every change event.

    Subclasses define ``groups_to_join`` and ``async snapshot() -> dict``.
    """

    groups_to_join: list[str] = []

    async def connect(self) -> None:
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.close(code=4401)
            return
        if not await self.authorize():
            await self.close(code=4403)
            return
        self._last_sent = 0.0
        self._pending: asyncio.Task | None = None
        for group in self.groups_to_join:
            await self.channel_layer.group_add(group, self.channel_name)
        await self.accept()
        await self.send_snapshot()

    async def disconnect(self, code: int) -> None:
        for group in getattr(self, "groups_to_join", []):
            await self.channel_layer.group_discard(group, self.channel_name)
        if getattr(self, "_pending", None):
            self._pending.cancel()

    async def authorize(self) -> bool:
        return True

    async def tco_event(self, message: dict) -> None:
        if self._pending and not self._pending.done():
            return  # a snapshot is already scheduled; it will include this change
        delay = max(0.0, MIN_INTERVAL_S - (time.monotonic() - self._last_sent))
        self._pending = asyncio.ensure_future(self._send_later(delay))

    async def _send_later(self, delay: float) -> None:
        if delay:
            await asyncio.sleep(delay)
        await self.send_snapshot()

    async def send_snapshot(self) -> None:
        self._last_sent = time.monotonic()
        await self.send_json(await self.snapshot())


class QueueConsumer(SnapshotConsumer):
    """``/ws/queue/``: the live queue page."""

    groups_to_join = [realtime.QUEUE_GROUP]

    @database_sync_to_async
    def snapshot(self) -> dict:
        return {"kind": "queue.snapshot",
                "data": selectors.queue_summary(self.scope["user"], seat_resource=settings.TCO_SEAT_RESOURCE)}
