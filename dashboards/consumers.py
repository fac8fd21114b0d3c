"""WebSocket consumers: authenticate, join groups, forward scoped snapshots.

A change event carries no task data; the consumer answers it by reading the
snapshot its own user may see (selectors), at most once per ``MIN_INTERVAL_S``
so a burst of changes costs one read. A consumer joins a campaign's or a
task's group only after the selector has found that the user may view it,
and a snapshot that the user may no longer see closes the socket (4403).

Every socket is also in its user's group and its session's group: a logout
closes it (4401), a deactivation, role or group change closes it with
``realtime.RECHECK`` and the browser's reconnect is authorized afresh.

Messages from the browser only choose what to show: ``{"page": n}`` (queue
and campaign pages) and ``{"state": "failed"|null}`` (campaign page).
"""
from __future__ import annotations

import abc

import asyncio
import json
import time

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from . import realtime, selectors
from .models import Campaign, Task

MIN_INTERVAL_S = 0.3
#: How long this process keeps an answer to one change event (seconds; as selectors.shared_snapshot).
SHARED_TTL_S = 10.0
_SHARED: dict[str, tuple[float, object]] = {}


def shared_here(key: str, compute):
    """``compute()``, shared by the sockets of this process for ``SHARED_TTL_S`` seconds under ``key``.

    The keys name the change event answered (its id), so a burst of changes
    fanned out to N sockets costs one read, one JSON encoding and one
    visibility check per scope in this process, not N (issue 15 item 4);
    ``selectors.shared_snapshot`` below it shares the read between processes.
    """
    now = time.monotonic()
    hit = _SHARED.get(key)
    if hit is not None and hit[0] > now:
        return hit[1]
    value = compute()
    if len(_SHARED) > 2000:
        for old in [k for k, (until, _) in _SHARED.items() if until <= now]:
            _SHARED.pop(old, None)
    _SHARED[key] = (now + SHARED_TTL_S, value)
    return value


class Refused(Exception):
    """The user may not (or may no longer) see what this socket shows."""


class SnapshotConsumer(AsyncJsonWebsocketConsumer, abc.ABC):
    """Base: sends a snapshot on connect and after every change event.

    Subclasses define ``async authorize() -> list[str]`` (the groups to join;
    raise ``Refused`` to refuse) and ``async snapshot() -> dict`` (raise
    ``Refused`` when the user may no longer see it).
    """

    async def connect(self) -> None:
        self.groups_joined: list[str] = []
        # The change event being answered; None (a fresh read) on connect and on a browser's choice.
        self.event_id: str | None = None
        # The latest change event received (its id and the poll's instants), sent as the snapshot's "as_of".
        self.news: dict = {"event": None}
        self._pending: asyncio.Task | None = None
        self._last_sent = 0.0
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.refuse(4401)
            return
        try:
            groups = await self.authorize()
        except Refused:
            await self.refuse(4403)
            return
        # Also the user's and the session's groups: a logout, deactivation or
        # role change closes this socket (realtime.connect_signals).
        groups = [*groups, realtime.user_group(user.pk)]
        session = self.scope.get("session")
        if session is not None and session.session_key:
            groups.append(realtime.session_group(session.session_key))
        for group in groups:
            await self.channel_layer.group_add(group, self.channel_name)
        self.groups_joined = groups
        await self.accept()
        await self.send_snapshot()

    async def tco_close(self, message: dict) -> None:
        """The user's session ended or their rights changed: close (4401, or RECHECK to reconnect)."""
        await self.close(code=int(message.get("code") or realtime.RECHECK))

    async def refuse(self, code: int) -> None:
        # Accept, then close with the code: a handshake refused outright reaches the
        # browser as 1006, and the page could not tell "signed out" from "network".
        await self.accept()
        await self.close(code=code)

    async def disconnect(self, code: int) -> None:
        for group in getattr(self, "groups_joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)
        if getattr(self, "_pending", None):
            self._pending.cancel()

    @abc.abstractmethod
    async def authorize(self) -> list[str]:
        """The groups this connection may join (empty: refuse it)."""

    @abc.abstractmethod
    async def snapshot(self) -> dict | str:
        """What this page shows now, for this user (a dict, or its JSON text)."""

    async def receive_json(self, content, **kwargs) -> None:
        if isinstance(content, dict) and self.choose(content):
            self.event_id = None
            await self.send_snapshot()

    def choose(self, content: dict) -> bool:
        """Apply a browser's choice (page, filter); True when the snapshot should be re-sent."""
        return False

    async def tco_event(self, message: dict) -> None:
        event = message.get("event") or {}
        if event.get("kind") == realtime.DEPTH_SAMPLED:
            return  # only the queue page draws the depth chart
        self.event_id = event.get("id")
        self.news = {"event": self.event_id, "observed_at": event.get("observed_at"),
                     "published_at": event.get("published_at")}
        if self._pending and not self._pending.done():
            return  # a snapshot is already scheduled; it will include this change
        delay = max(0.0, MIN_INTERVAL_S - (time.monotonic() - self._last_sent))
        self._pending = asyncio.ensure_future(self._send_later(delay))

    async def _send_later(self, delay: float) -> None:
        if delay:
            await asyncio.sleep(delay)
        await self.send_snapshot()

    async def send_snapshot(self) -> None:
        """Read and send this page's snapshot with its ``as_of`` (:func:`as_of_text`); 4403 when refused."""
        self._last_sent = time.monotonic()
        news = dict(self.news)   # the news this read answers: the latest event received before it began
        try:
            data = await self.snapshot()
        except Refused:
            await self.close(code=4403)
            return
        await self.send(text_data=as_of_text(data, news))


def as_of_text(data: dict | str, news: dict) -> str:
    """The JSON text of a snapshot (``data``: a dict, or its JSON text shared between sockets) with
    ``"as_of": {"event", "observed_at", "published_at", "sent_at"}`` first: the change event it
    answers (None on connect and after a browser's choice), when that poll's qstat call began and
    when the event was published (epoch seconds, from the event; None for changes no poll found),
    and when this socket sent it (now). demo/watch.py splits a change's lag along these instants.
    """
    as_of = json.dumps({**news, "sent_at": time.time()})
    text = data if isinstance(data, str) else json.dumps(data)
    return '{"as_of": ' + as_of + (", " + text[1:] if text != "{}" else "}")


def _page(value) -> int | None:
    try:
        page = int(value)
    except (TypeError, ValueError):
        return None
    return page if page >= 1 else None


class QueueConsumer(SnapshotConsumer):
    """``/ws/queue/``: the live queue page; also forwards new queue-depth samples."""

    page = 1

    async def authorize(self) -> list[str]:
        return [realtime.QUEUE_GROUP]

    def choose(self, content: dict) -> bool:
        page = _page(content.get("page"))
        if page is None or page == self.page:
            return False
        self.page = page
        return True

    async def tco_event(self, message: dict) -> None:
        if (message.get("event") or {}).get("kind") == realtime.DEPTH_SAMPLED:
            await self.send_json(await self.depth())
        else:
            await super().tco_event(message)

    @database_sync_to_async
    def depth(self) -> dict:
        user = self.scope["user"]
        return {"kind": "queue.depth", "data": {"hour": selectors.queue_depth_history(user, "hour"),
                                                "day": selectors.queue_depth_history(user, "day")}}

    @database_sync_to_async
    def snapshot(self) -> dict:
        user = self.scope["user"]

        def read() -> dict:
            return selectors.queue_summary(user, seat_resource=settings.TCO_SEAT_RESOURCE, page=self.page)

        if self.event_id is None:
            return {"kind": "queue.snapshot", "data": read()}
        key = f"snapshot:queue:{selectors.scope_key(user)}:{self.page}:{self.event_id}"
        return shared_here(key, lambda: json.dumps({"kind": "queue.snapshot",
                                                    "data": selectors.shared_snapshot(key, read)}))


class CampaignConsumer(SnapshotConsumer):
    """``/ws/campaigns/<id>/``: one campaign's page, for users who may view the campaign."""

    page = 1
    state: str | None = None
    table: dict = {"sort": None, "descending": False, "q": ""}  # selectors.task_table_choice
    host: str | None = None

    @database_sync_to_async
    def authorize(self) -> list[str]:
        campaign_id = self.scope["url_route"]["kwargs"]["campaign_id"]
        try:
            selectors.campaign_for(self.scope["user"], campaign_id)
        except Campaign.DoesNotExist:
            raise Refused from None
        return [realtime.campaign_group(campaign_id)]

    def choose(self, content: dict) -> bool:
        page, state, host = self.page, self.state, self.host
        if "state" in content:
            state = content["state"] if content["state"] in selectors.LIFECYCLE_STATES else None
            if state != self.state:
                page = 1
        table = self.table
        if any(k in content for k in ("sort", "dir", "q")):
            table = selectors.task_table_choice(content.get("sort"), content.get("dir"), content.get("q"))
            if table != self.table:
                page = 1
        host = self.host
        if "host" in content:
            host = selectors.host_filter(content["host"])
            if host != self.host:
                page = 1
        if _page(content.get("page")) is not None:
            page = _page(content["page"])
        changed = (page, state, table, host) != (self.page, self.state, self.table, self.host)
        self.page, self.state, self.table, self.host = page, state, table, host
        return changed

    @database_sync_to_async
    def snapshot(self) -> dict:
        user, campaign_id = self.scope["user"], self.scope["url_route"]["kwargs"]["campaign_id"]
        try:
            if self.event_id is None:
                data = selectors.campaign_detail(user, campaign_id, page=self.page, state=self.state,
                                                 host=self.host, **self.table)
            else:
                # Checked for this user first (once per event for all users of the same scope: whether a
                # campaign is visible depends on the teams one sees only); the data itself is the same
                # for everyone who may see it.
                scope = selectors.scope_key(user)
                visible = shared_here(f"visible:{scope}:{campaign_id}:{self.event_id}",
                                      lambda: selectors.campaigns_visible_to(user).filter(pk=campaign_id).exists())
                if not visible:
                    raise Campaign.DoesNotExist
                table = self.table
                key = (f"snapshot:campaign:{campaign_id}:{self.page}:{self.state}:{table['sort']}:"
                       f"{table['descending']}:{table['q']}:{self.host}:{self.event_id}")
                def read() -> dict:
                    return selectors.campaign_detail(user, campaign_id, page=self.page, state=self.state,
                                                     host=self.host, **table)

                return shared_here(key, lambda: json.dumps({"kind": "campaign.snapshot",
                                                            "data": selectors.shared_snapshot(key, read)}))
        except Campaign.DoesNotExist:
            raise Refused from None
        return {"kind": "campaign.snapshot", "data": data}


class TaskConsumer(SnapshotConsumer):
    """``/ws/tasks/<id>/``: one agent's page; follows its campaign's group (admins' other jobs: the queue's)."""

    @database_sync_to_async
    def authorize(self) -> list[str]:
        task_id = self.scope["url_route"]["kwargs"]["task_id"]
        try:
            task = selectors.task_for(self.scope["user"], task_id)
        except Task.DoesNotExist:
            raise Refused from None
        return [realtime.campaign_group(task.campaign_id) if task.campaign_id else realtime.QUEUE_GROUP]

    @database_sync_to_async
    def snapshot(self) -> dict:
        try:
            data = selectors.task_detail(self.scope["user"], self.scope["url_route"]["kwargs"]["task_id"])
        except Task.DoesNotExist:
            raise Refused from None
        return {"kind": "task.snapshot", "data": data}
