"""WebSocket consumers: authenticate, join groups, forward scoped snapshots.

A change event carries no task data; the consumer answers it by reading the
snapshot its own user may see (selectors), at most once per ``MIN_INTERVAL_S``
so a burst of changes costs one read. A consumer joins a campaign's or a
task's group only after the selector has found that the user may view it,
and a snapshot that the user may no longer see closes the socket (4403).

Every socket is also in its user's group and its session's group: a logout
closes it (4401), a deactivation, role or group change closes it with
``realtime.RECHECK`` and the browser's reconnect is authorized afresh.

A web process joins each page's group once (:class:`Relay`) and hands the
events to its sockets; the sockets of one scope and page share their reads
(:class:`Coalescer`), never one that began before they joined or got their
latest event. Each snapshot says what it answers (``as_of``, :func:`as_of_text`).

Messages from the browser only choose what to show: ``{"page": n}`` (queue
and campaign pages) and ``{"state": "failed"|null}`` (campaign page).
"""
from __future__ import annotations

import abc
import asyncio
import dataclasses
import json
import logging
import time
from typing import Awaitable, Callable

from channels.db import database_sync_to_async
from channels.generic.websocket import AsyncJsonWebsocketConsumer
from django.conf import settings

from dashboards.core import realtime
from dashboards.core import scope as core_scope
from dashboards.live import campaign, cluster, queue
from dashboards.live import task as live_task
from dashboards.models import Campaign, Task
from schedulers import base

log = logging.getLogger(__name__)

MIN_INTERVAL_S = 0.3
#: The clock of reads' starts and sockets' joins (time.monotonic; a test may replace it).
clock = time.monotonic
#: How long a finished read stays reusable in this process (seconds); only by sockets that joined before it began.
READ_KEEP_S = 10.0


@dataclasses.dataclass
class _Flight:
    """One key's reads: ``current`` (monotonic start, future) in flight or finished, ``queued`` the next."""

    current: tuple[float, asyncio.Future] | None = None
    queued: asyncio.Future | None = None
    queued_compute: Callable[[], Awaitable] | None = None


class Coalescer:
    """Single-flight reads shared by the sockets of this process (they share one event loop).

    ``await read(key, compute, since)`` returns what a call of ``compute()`` (an async callable)
    returned, where that call *began* at or after ``since`` (``time.monotonic()``): the read in
    flight or kept (``READ_KEEP_S``) if it began late enough, else the next read of the key, which
    begins once the one in flight ends (every caller that needs it shares it). So N sockets opening
    at once cost about two reads per key, not N, and none is ever served a read that began before
    it joined its groups (``since``): a change committed after such a read began would be missing
    from it, and its event (published after the commit) might have gone out before the socket
    joined. A shared read that raises is not shared: each other caller then reads for itself.
    """

    def __init__(self) -> None:
        self._flights: dict[str, _Flight] = {}

    async def read(self, key: str, compute: Callable[[], Awaitable], since: float):
        flight = self._flights.setdefault(key, _Flight())
        current = flight.current
        mine = False
        if current is not None and current[0] >= since and not (current[1].done() and current[1].exception()):
            future = current[1]
        else:
            future = flight.queued
            if future is None:
                future = flight.queued = asyncio.get_running_loop().create_future()
                flight.queued_compute, mine = compute, True
                if current is None or current[1].done():
                    self._begin(flight)
                else:
                    current[1].add_done_callback(lambda _f, flight=flight: self._begin(flight))
        try:
            return await asyncio.shield(future)
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the shared read failed: each other caller reads for itself
            if mine:
                raise
            return await compute()

    def _begin(self, flight: _Flight) -> None:
        future, compute = flight.queued, flight.queued_compute
        flight.current, flight.queued, flight.queued_compute = (clock(), future), None, None

        async def run() -> None:
            try:
                future.set_result(await compute())
            except BaseException as exc:  # noqa: BLE001 - handed to every caller waiting on it
                future.set_exception(exc)
                future.exception()   # retrieved: no "never retrieved" warning when nobody waits
            self._sweep()

        asyncio.ensure_future(run())

    def _sweep(self) -> None:
        if len(self._flights) < 256:
            return
        old = clock() - READ_KEEP_S
        for key, f in list(self._flights.items()):
            if f.queued is None and (f.current is None or (f.current[1].done() and f.current[0] < old)):
                del self._flights[key]


#: The reads of this process's consumers (one event loop: Channels runs every consumer on it).
READS = Coalescer()


@dataclasses.dataclass
class _Fanout:
    """One group's relay in this process: its channel, the task receiving on it, the local sockets."""

    channel: str
    task: asyncio.Task | None = None
    members: set = dataclasses.field(default_factory=set)
    renewer: asyncio.Task | None = None   # group_add again every renew_s (Relay.renew_s)
    added: float = 0.0                    # loop time (seconds) of the latest group_add

    def stop(self) -> None:
        for task in (self.task, self.renewer):
            if task is not None:
                task.cancel()


class Relay:
    """One channel-layer channel per group and process, fanned out to the process's sockets.

    A change event sent to a group used to reach each socket through a channel of
    its own: N sockets of a page, N messages through Redis and N receives (one
    BZPOPMIN and a few asyncio tasks each, channels_redis) in the web process.
    Under a burst on a loaded host that backlog held events for tens of seconds
    (the replay's lag breakdown, "published -> received"). Here a process joins
    each group once and hands each message to its sockets in the process: one
    message per process and event. A socket is in the group once :meth:`join`
    returned (the relay's channel was added before, or just now). When the
    relay's receive fails (Redis went away), its sockets are closed with
    ``realtime.RECHECK`` (as a socket whose own receive failed was closed):
    the browsers reconnect, and their joins make the relay again.

    A channel layer drops a group's member ``group_expiry`` seconds after its
    ``group_add`` (channels_redis and the in-memory layer; default 86400): a
    relay renews its membership (``group_add`` again) every :func:`renew_s`
    while it lives, and when a socket joins it after half of that interval,
    so a page kept open for days goes on getting its events.
    """

    def __init__(self) -> None:
        self._groups: dict[str, _Fanout] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self._bound: tuple | None = None   # (event loop, channel layer) the relays belong to

    def _here(self, layer) -> None:
        # One loop and one layer per web process; tests make new ones: start afresh for them.
        bound = (asyncio.get_running_loop(), layer)
        if self._bound is None or self._bound[0] is not bound[0] or self._bound[1] is not bound[1]:
            self._groups, self._locks, self._bound = {}, {}, bound

    async def join(self, layer, group: str, consumer) -> None:
        """Add ``consumer`` (its ``dispatch`` gets the group's messages) to ``group``."""
        self._here(layer)
        async with self._locks.setdefault(group, asyncio.Lock()):
            fanout = self._groups.get(group)
            loop = asyncio.get_running_loop()
            if fanout is None or fanout.task is None or fanout.task.done():
                members = fanout.members if fanout else set()
                if fanout is not None:
                    fanout.stop()
                fanout = _Fanout(channel=await layer.new_channel(), members=members)
                await layer.group_add(group, fanout.channel)
                fanout.added = loop.time()
                fanout.task = asyncio.ensure_future(self._receive(layer, group, fanout))
                fanout.renewer = asyncio.ensure_future(self._renew(layer, group, fanout))
                self._groups[group] = fanout
            elif loop.time() - fanout.added >= renew_s(layer) / 2:
                await layer.group_add(group, fanout.channel)
                fanout.added = loop.time()
            fanout.members.add(consumer)

    async def leave(self, layer, group: str, consumer) -> None:
        """Take ``consumer`` out of ``group``; the process leaves the group with its last socket."""
        self._here(layer)
        async with self._locks.setdefault(group, asyncio.Lock()):
            fanout = self._groups.get(group)
            if fanout is None:
                return
            fanout.members.discard(consumer)
            if fanout.members:
                return
            del self._groups[group]
            fanout.stop()
            try:
                await layer.group_discard(group, fanout.channel)
            except Exception:  # noqa: BLE001 - the group's membership expires by itself (group_expiry)
                log.warning("could not leave %s", group, exc_info=True)

    async def _receive(self, layer, group: str, fanout: _Fanout) -> None:
        try:
            while True:
                message = await layer.receive(fanout.channel)
                for consumer in list(fanout.members):
                    asyncio.ensure_future(_deliver(consumer, message))
        except asyncio.CancelledError:
            raise
        except Exception:  # noqa: BLE001 - the sockets reconnect, and their joins make the relay again
            log.warning("relay of %s stopped; closing its sockets (they reconnect)", group, exc_info=True)
            if self._groups.get(group) is fanout:
                del self._groups[group]
            if fanout.renewer is not None:
                fanout.renewer.cancel()
            for consumer in list(fanout.members):
                asyncio.ensure_future(_deliver(consumer, {"type": "tco.close", "code": realtime.RECHECK}))

    async def _renew(self, layer, group: str, fanout: _Fanout) -> None:
        # group_add again before the layer's group_expiry drops the relay's channel from the group.
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(max(0.0, fanout.added + renew_s(layer) - loop.time()))
            try:
                await layer.group_add(group, fanout.channel)
                fanout.added = loop.time()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - tried again shortly; a Redis gone also fails the receive
                log.warning("could not renew %s's membership of %s", fanout.channel, group, exc_info=True)
                await asyncio.sleep(min(renew_s(layer), 30.0))


def renew_s(layer) -> float:
    """Seconds between a relay's ``group_add`` calls: a quarter of the layer's ``group_expiry``.

    ``group_expiry`` (seconds, default 86400: channels_redis ``RedisChannelLayer`` and channels'
    ``InMemoryChannelLayer``) is how long a group member lasts after its ``group_add``; a layer
    without it gets the default."""
    return max(0.1, float(getattr(layer, "group_expiry", 86400) or 86400) / 4)


async def _deliver(consumer, message: dict) -> None:
    try:
        await consumer.dispatch(message)
    except Exception:  # noqa: BLE001 - one socket's failure is not the others'
        log.warning("a socket could not handle %s", message.get("type"), exc_info=True)


#: This process's relay (one event loop).
RELAY = Relay()


def db(fn: Callable, *args):
    """``fn(*args)`` on the process's database thread (``database_sync_to_async``; an awaitable).

    Not a pool of threads (``thread_sensitive=False``): measured with bench_ws_latency.py's connect
    storm (50 clients x 4 sockets, 2 runs each, daphne and uvicorn) it gave no gain beyond the noise
    (p95 1.05-1.64 s with a pool, 1.01-2.01 s without): the reads are shared (:class:`Coalescer`)
    and what is left per socket is Python work under the GIL."""
    return database_sync_to_async(fn)(*args)


class Refused(Exception):
    """The user may not (or may no longer) see what this socket shows."""


class SnapshotConsumer(AsyncJsonWebsocketConsumer, abc.ABC):
    """Base: sends a snapshot on connect and after every change event.

    Subclasses define ``async authorize() -> list[str]`` (the groups to join;
    raise ``Refused`` to refuse) and ``async snapshot(since) -> dict | (str, read_at)``
    (raise ``Refused`` when the user may no longer see it): ``since`` is the
    ``time.monotonic()`` instant a read must have begun at or after to be
    sent (:class:`Coalescer`): when the socket joined its groups, or received
    its latest change event, or the browser chose another page.
    """

    async def connect(self) -> None:
        self.groups_joined: list[str] = []
        # The change event being answered; None (a fresh read) on connect and on a browser's choice.
        self.event_id: str | None = None
        # The latest change event received (its id and the poll's instants), sent as the snapshot's "as_of".
        self.news: dict = {"event": None}
        self._pending: asyncio.Task | None = None
        self._last_sent = 0.0
        self.since = 0.0
        user = self.scope.get("user")
        if user is None or not user.is_authenticated:
            await self.refuse(4401)
            return
        try:
            groups = await self.authorize()
        except Refused:
            await self.refuse(4403)
            return
        # The page's groups through this process's relay (one channel per group and process);
        # the user's and the session's groups on the socket's own channel: a logout,
        # deactivation or role change closes this socket (realtime.connect_signals).
        for group in groups:
            await RELAY.join(self.channel_layer, group, self)
        self.relayed_groups = groups
        own = [realtime.user_group(user.pk)]
        session = self.scope.get("session")
        if session is not None and session.session_key:
            own.append(realtime.session_group(session.session_key))
        for group in own:
            await self.channel_layer.group_add(group, self.channel_name)
        self.groups_joined = own
        self.since = clock()   # in every group: any change committed from now on reaches this socket
        await self.accept()
        # The user's and session's groups above are joined once, and the channel layer drops a member
        # group_expiry seconds after its group_add (a day by default): a socket open longer would no
        # longer be closed by a logout, deactivation or role change. Such a socket is closed with
        # RECHECK well before that (renew_s: a quarter of group_expiry); the browser reconnects and is
        # authorized afresh (attack review, session 4).
        self._recheck = asyncio.ensure_future(self._recheck_after(renew_s(self.channel_layer)))
        await self.send_snapshot()

    async def _recheck_after(self, delay: float) -> None:
        await asyncio.sleep(delay)
        await self.close(code=realtime.RECHECK)

    async def tco_close(self, message: dict) -> None:
        """The user's session ended or their rights changed: close (4401, or RECHECK to reconnect)."""
        await self.close(code=int(message.get("code") or realtime.RECHECK))

    async def refuse(self, code: int) -> None:
        # Accept, then close with the code: a handshake refused outright reaches the
        # browser as 1006, and the page could not tell "signed out" from "network".
        await self.accept()
        await self.close(code=code)

    async def disconnect(self, code: int) -> None:
        for group in getattr(self, "relayed_groups", []):
            await RELAY.leave(self.channel_layer, group, self)
        for group in getattr(self, "groups_joined", []):
            await self.channel_layer.group_discard(group, self.channel_name)
        if getattr(self, "_pending", None):
            self._pending.cancel()
        if getattr(self, "_recheck", None):
            self._recheck.cancel()

    @abc.abstractmethod
    async def authorize(self) -> list[str]:
        """The groups this connection may join (empty: refuse it)."""

    @abc.abstractmethod
    async def snapshot(self, since: float) -> dict | str:
        """What this page shows now, for this user (a dict, or its JSON text), read at or after ``since``."""

    async def receive_json(self, content, **kwargs) -> None:
        if isinstance(content, dict) and self.choose(content):
            self.event_id = None
            self.since = clock()
            await self.send_snapshot()

    def choose(self, content: dict) -> bool:
        """Apply a browser's choice (page, filter); True when the snapshot should be re-sent."""
        return False

    async def tco_event(self, message: dict) -> None:
        event = message.get("event") or {}
        if event.get("kind") == realtime.DEPTH_SAMPLED:
            return  # only the queue page draws the depth chart
        self.event_id = event.get("id")
        self.since = clock()
        self.news = {"event": self.event_id, "observed_at": event.get("observed_at"),
                     "published_at": event.get("published_at"), "received_at": time.time()}
        if self._pending and not self._pending.done():
            return  # a snapshot is already scheduled; it will include this change
        delay = max(0.0, MIN_INTERVAL_S - (time.monotonic() - self._last_sent))
        self._pending = asyncio.ensure_future(self._send_later(delay))

    async def _send_later(self, delay: float) -> None:
        while True:
            if delay:
                await asyncio.sleep(delay)
            since = self.since
            await self.send_snapshot()
            if self.since == since:
                return
            # A change event arrived while this read was on its way (tco_event saw this task pending
            # and scheduled nothing): the read may have begun before it, so read once more.
            delay = max(0.0, MIN_INTERVAL_S - (time.monotonic() - self._last_sent))

    async def send_snapshot(self) -> None:
        """Read and send this page's snapshot with its ``as_of`` (:func:`as_of_text`); 4403 when refused."""
        self._last_sent = time.monotonic()
        news = dict(self.news)   # the news this read answers: the latest event received before it began
        try:
            data = await self.snapshot(self.since)
        except Refused:
            await self.close(code=4403)
            return
        read_at = None
        if isinstance(data, tuple):   # (JSON text, when its read began on the database thread)
            data, read_at = data
        await self.send(text_data=as_of_text(data, news, read_at))


def as_of_text(data: dict | str, news: dict, read_at: float | None = None) -> str:
    """The JSON text of a snapshot (``data``: a dict, or its JSON text shared between sockets) with
    ``"as_of": {"event", "observed_at", "published_at", "received_at", "read_at", "sent_at"}``
    first: the change event it answers (None on connect and after a browser's choice), when that
    poll's qstat call began and when the event was published (epoch seconds, from the event; None
    for changes no poll found), when this socket received it, when the read of the data began
    (``read_at``, None when unknown) and when this socket sent it (now). demo/watch/ splits a
    change's lag along these instants.
    """
    as_of = json.dumps({**news, "read_at": read_at, "sent_at": time.time()})
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
        return {"kind": "queue.depth", "data": {"hour": queue.queue_depth_history(user, "hour"),
                                                "day": queue.queue_depth_history(user, "day")}}

    async def snapshot(self, since: float) -> tuple[str, float]:
        user, page = self.scope["user"], self.page

        def read() -> tuple[str, float]:
            began = time.time()
            data = queue.queue_summary(user, seat_resource=settings.TCO_SEAT_RESOURCE, page=page)
            return json.dumps({"kind": "queue.snapshot", "data": data}), began

        # The same for every user who sees the same teams (selectors.scope_key).
        scope = await db(core_scope.scope_key, user)
        return await READS.read(f"queue:{scope}:{page}", lambda: db(read), since)


class CampaignConsumer(SnapshotConsumer):
    """``/ws/campaigns/<id>/``: one campaign's page, for users who may view the campaign."""

    page = 1
    state: str | None = None
    table: dict = {"sort": None, "descending": False, "q": ""}  # selectors.task_table_choice
    host: str | None = None

    async def authorize(self) -> list[str]:
        campaign_id = self.scope["url_route"]["kwargs"]["campaign_id"]

        def check() -> None:
            try:
                core_scope.campaign_for(self.scope["user"], campaign_id)
            except Campaign.DoesNotExist:
                raise Refused from None

        await db(check)
        self.authorized_at = time.monotonic()
        return [realtime.campaign_group(campaign_id)]

    def choose(self, content: dict) -> bool:
        page, state, host = self.page, self.state, self.host
        if "state" in content:
            state = content["state"] if content["state"] in base.LIFECYCLE_STATES else None
            if state != self.state:
                page = 1
        table = self.table
        if any(k in content for k in ("sort", "dir", "q")):
            table = campaign.task_table_choice(content.get("sort"), content.get("dir"), content.get("q"))
            if table != self.table:
                page = 1
        host = self.host
        if "host" in content:
            host = cluster.host_filter(content["host"])
            if host != self.host:
                page = 1
        if _page(content.get("page")) is not None:
            page = _page(content["page"])
        changed = (page, state, table, host) != (self.page, self.state, self.table, self.host)
        self.page, self.state, self.table, self.host = page, state, table, host
        return changed

    async def connect(self) -> None:
        self.authorized_at = None
        await super().connect()

    async def snapshot(self, since: float) -> tuple[str, float]:
        user, campaign_id = self.scope["user"], self.scope["url_route"]["kwargs"]["campaign_id"]
        page, state, host, table = self.page, self.state, self.host, self.table
        if self.authorized_at is None or self.event_id is not None:
            # Checked for this user (once per scope for the users of the same scope: whether a campaign
            # is visible depends on the teams one sees only); the data itself is the same for everyone
            # who may see it. The first snapshot was authorized just before (authorize).
            scope = await db(core_scope.scope_key, user)
            visible = await READS.read(
                f"visible:{scope}:{campaign_id}",
                lambda: db(lambda: core_scope.campaigns_visible_to(user).filter(pk=campaign_id).exists()), since)
            if not visible:
                raise Refused
        self.authorized_at = None

        def read() -> tuple[str, float]:
            began = time.time()
            try:
                data = campaign.campaign_detail(user, campaign_id, page=page, state=state, host=host, **table)
            except Campaign.DoesNotExist:
                raise Refused from None
            return json.dumps({"kind": "campaign.snapshot", "data": data}), began

        key = (f"campaign:{campaign_id}:{page}:{state}:{table['sort']}:{table['descending']}:{table['q']}:"
               f"{host}")
        return await READS.read(key, lambda: db(read), since)


class TaskConsumer(SnapshotConsumer):
    """``/ws/tasks/<id>/``: one agent's page; follows its campaign's group (admins' other jobs: the queue's)."""

    @database_sync_to_async
    def authorize(self) -> list[str]:
        task_id = self.scope["url_route"]["kwargs"]["task_id"]
        try:
            task = core_scope.task_for(self.scope["user"], task_id)
        except Task.DoesNotExist:
            raise Refused from None
        return [realtime.campaign_group(task.campaign_id) if task.campaign_id else realtime.QUEUE_GROUP]

    async def snapshot(self, since: float) -> dict:
        return await db(self._read)

    def _read(self) -> dict:
        try:
            data = live_task.task_detail(self.scope["user"], self.scope["url_route"]["kwargs"]["task_id"])
        except Task.DoesNotExist:
            raise Refused from None
        return {"kind": "task.snapshot", "data": data}
