"""A web process's fan-out of the live views: one subscription per view, the bytes to every local socket.

The producer (``dashboards.live.publish``) publishes each view's new snapshot once, finished. A web
process subscribes to a view's channel once, whatever the number of its sockets on it (:class:`Hub`),
keeps the latest record (a socket that opens, or falls behind, is served from it without a read),
and hands each record to its sockets' :class:`Outbox`: per socket, a bounded queue and a task that
sends. Per socket and message the work is a queue append and a send of the same text; nothing here
reads the database or encodes JSON.

A socket that does not keep up cannot slow the others: when its queue is full (``TCO_LIVE_SOCKET_QUEUE``
messages) the queue is dropped and the socket resynchronised from the latest snapshot of each of its
views (said in the log); when one send does not finish within ``TCO_LIVE_SEND_TIMEOUT_S`` seconds (a
client that stopped reading), the socket is closed with ``RECHECK`` and the browser reconnects.

Records carry their view's sequence number; a socket never gets one older than, or the same as, one
it got (a resync, a reconnect of the subscription, a browser's request for a snapshot).
"""
from __future__ import annotations

import asyncio
import collections
import logging
import os
import time
import weakref
from typing import Awaitable, Callable

from django.conf import settings

from dashboards.core import live_bus, live_histogram, realtime

log = logging.getLogger(__name__)

#: Lags of what this process sent (seconds from the change's qstat start to the send), all sockets.
HISTOGRAM = live_histogram.Histogram()
#: (monotonic instant, lag) of recent sends, for the admins' "current lag" (``live_status``).
RECENT: collections.deque = collections.deque(maxlen=20000)
RECENT_S = 300.0


def queue_limit() -> int:
    return int(getattr(settings, "TCO_LIVE_SOCKET_QUEUE", 16))


def send_timeout_s() -> float:
    return float(getattr(settings, "TCO_LIVE_SEND_TIMEOUT_S", 10.0))


class Outbox:
    """One socket's bounded queue of records and the task that sends them (module doc).

    ``send(text)`` and ``close(code)`` are the socket's; ``latest(view)`` the hub's latest record of a
    view (for a resync); ``views`` the views the socket shows now (records of others are dropped).
    """

    def __init__(self, send: Callable[[str], Awaitable], close: Callable[[int], Awaitable], label: str,
                 latest: Callable[[str], "live_bus.Record | None"], *, maxsize: int | None = None) -> None:
        self.send, self.close, self.label, self.latest = send, close, label, latest
        self.maxsize = maxsize or queue_limit()
        self.views: list[str] = []
        self.queue: collections.deque[tuple[str, live_bus.Record]] = collections.deque()
        self.last: dict[str, live_bus.Record] = {}
        self.resync = False
        self.mute: set[str] = set()     # views whose next record is taken as shown, not sent (Hub.join)
        self.dropped = 0
        self.resyncs = 0
        self.sending_since: float | None = None
        self._wakeup = asyncio.Event()
        self._task = asyncio.ensure_future(self._run())

    def show(self, views: list[str]) -> None:
        """The socket now shows ``views`` (its page or choice changed): records of others are dropped."""
        self.views = list(views)
        self.last = {v: r for v, r in self.last.items() if v in views}

    def offer(self, view: str, record: "live_bus.Record | None") -> None:
        if record is None or view not in self.views or not record.newer_than(self.last.get(view)):
            return
        if view in self.mute:
            self.mute.discard(view)
            self.last[view] = record
            return
        if len(self.queue) >= self.maxsize:
            self.dropped += len(self.queue)
            if not self.resync:
                self.resyncs += 1
                log.warning("live socket %s fell %d messages behind: dropped them; it gets the latest snapshot "
                            "of %s when it catches up (resync %d)", self.label, len(self.queue),
                            ", ".join(self.views), self.resyncs)
            self.queue.clear()
            self.resync = True
        else:
            self.queue.append((view, record))
        self._wakeup.set()

    def snapshot(self) -> None:
        """Send the latest record of each view unless this socket has it (a browser's request)."""
        self.resync = True
        self._wakeup.set()

    async def _run(self) -> None:
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            while self.queue or self.resync:
                if self.resync:
                    self.resync = False
                    self.queue.clear()
                    batch = [(view, self.latest(view)) for view in self.views]
                else:
                    batch = [self.queue.popleft()]
                for view, record in batch:
                    if record is None or view not in self.views or not record.newer_than(self.last.get(view)):
                        continue
                    self.sending_since = time.monotonic()
                    try:
                        await self.send(record.text)
                    except asyncio.CancelledError:
                        raise
                    except Exception:  # noqa: BLE001 - the socket is gone; its disconnect cleans up
                        log.debug("live socket %s: send failed", self.label, exc_info=True)
                        self.sending_since = None
                        return
                    self.sending_since = None
                    self.last[view] = record
                    if record.observed_at is not None:
                        lag = time.time() - record.observed_at
                        HISTOGRAM.observe("sent", lag)
                        RECENT.append((time.monotonic(), lag))

    def stuck_for(self, now: float) -> float:
        return 0.0 if self.sending_since is None else now - self.sending_since

    async def give_up(self) -> None:
        """The client stopped reading: stop sending and close the socket (the browser reconnects)."""
        log.warning("live socket %s: one send did not finish in %.0f s; closed with %d (it reconnects)",
                    self.label, send_timeout_s(), realtime.RECHECK)
        self.sending_since = None
        self.stop()
        try:
            await self.close(realtime.RECHECK)
        except Exception:  # noqa: BLE001 - the transport is gone already
            log.debug("closing %s failed", self.label, exc_info=True)

    def stop(self) -> None:
        self._task.cancel()


class _View:
    def __init__(self, key: str, source: str) -> None:
        self.key, self.source = key, source
        self.members: set[Outbox] = set()
        self.latest: live_bus.Record | None = None
        self.ready: asyncio.Future = asyncio.get_running_loop().create_future()
        self.empty_since: float | None = None


class Hub:
    """This process's subscriptions to the live views (one per event loop: :func:`hub`)."""

    #: Seconds a view without sockets stays subscribed (a browser that reconnects finds it warm).
    LINGER_S = 30.0
    #: Seconds between two rounds of :meth:`_upkeep`.
    UPKEEP_S = 1.0

    def __init__(self) -> None:
        self.bus = live_bus.bus().async_side()
        self.port = None
        self.views: dict[str, _View] = {}
        self.outboxes: "weakref.WeakSet[Outbox]" = weakref.WeakSet()
        self._confirm: dict[str, asyncio.Future] = {}
        self._tasks: list[asyncio.Task] = []
        self._lock = asyncio.Lock()

    def latest(self, key: str) -> "live_bus.Record | None":
        view = self.views.get(key)
        return view.latest if view else None

    def outbox(self, send, close, label: str) -> Outbox:
        box = Outbox(send, close, label, self.latest)
        self.outboxes.add(box)
        return box

    async def join(self, box: Outbox, key: str, source: str, *, latest: bool = True) -> None:
        """Add ``box`` to view ``key`` (fed by ``source``) and offer it the view's latest record; with
        ``latest`` False, only the records that come after (the page has the latest already)."""
        view = self.views.get(key)
        if view is None:
            view = self.views[key] = _View(key, source)
            try:
                await self._subscribe(live_bus.channel(key))
                # Subscribed (confirmed) before the read: a record published from now on comes through
                # the subscription, an older one is read here.
                record, gen = await self.bus.fetch(key, source)
                if record is not None and record.newer_than(view.latest):
                    view.latest = record
                if record is None or record.gen < gen:
                    await self.bus.wake()   # nobody watched it: the producer builds it now
                view.ready.set_result(None)
            except BaseException as exc:
                if self.views.get(key) is view:
                    del self.views[key]
                view.ready.set_exception(exc)
                view.ready.exception()
                raise
        else:
            await asyncio.shield(view.ready)
        view.members.add(box)
        view.empty_since = None
        if latest:
            box.offer(key, view.latest)
        elif view.latest is not None:
            box.last[key] = view.latest
        else:
            box.mute.add(key)

    def leave(self, box: Outbox, key: str) -> None:
        view = self.views.get(key)
        if view is not None:
            view.members.discard(box)
            if not view.members:
                view.empty_since = time.monotonic()

    async def _subscribe(self, name: str) -> None:
        loop = asyncio.get_running_loop()
        async with self._lock:
            if self.port is None:
                self.port = self.bus.pubsub()
                self._tasks = [asyncio.ensure_future(self._read(self.port)),
                               asyncio.ensure_future(self._upkeep())]
            confirmed = self._confirm[name] = loop.create_future()
            await self.port.subscribe(name)
        await asyncio.wait_for(asyncio.shield(confirmed), timeout=10)

    async def _read(self, port) -> None:
        """Read the subscription's messages until cancelled. When its connection is lost (Redis restarted,
        the connection killed), subscribe again on a new one and read each view again: records published
        meanwhile are not lost, and no socket is closed (a thousand browsers reconnecting at once would
        be a storm of their own). Until Redis answers again, the sockets stay open and wait."""
        delay = 0.5
        while True:
            try:
                message = await port.get(timeout=1.0)
                delay = 0.5
                if port.reconnected:
                    # redis-py reconnected it by itself: records published while it was away are lost.
                    port.reconnected = False
                    log.warning("live subscription reconnected; reading %d views again", len(self.views))
                    await self._read_again()
                if message is not None:
                    self._handle(message)
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - Redis away: subscribe again (below), with backoff
                log.warning("live subscription lost; subscribing again to %d views", len(self.views), exc_info=True)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                try:
                    port = await self._resubscribe(port)
                except asyncio.CancelledError:
                    raise
                except Exception:  # noqa: BLE001 - tried again after the next delay
                    log.warning("live subscription: Redis does not answer yet", exc_info=True)

    def _handle(self, message: dict) -> None:
        kind = message.get("type")
        name = message["channel"].decode() if isinstance(message["channel"], bytes) else message["channel"]
        if kind == "message":
            try:
                self._deliver(live_bus.view_of_channel(name), live_bus.Record.decode(message["data"]))
            except ValueError:
                log.warning("not a live record on %s", name)
        elif kind == "subscribe":
            future = self._confirm.pop(name, None)
            if future is not None and not future.done():
                future.set_result(None)

    async def _resubscribe(self, old):
        """A new subscription to every view of this process, confirmed, then each view read again; returns
        the new port. Raises when Redis does not answer (the old port is then kept, to be replaced later)."""
        async with self._lock:
            port = self.bus.pubsub()
            try:
                names = {live_bus.channel(key) for key in self.views}
                for name in names:
                    await port.subscribe(name)
                # Confirmed before the reads: a record published from now on comes through the new port.
                deadline = time.monotonic() + 10.0
                while names and time.monotonic() < deadline:
                    message = await port.get(timeout=1.0)
                    if message is None:
                        continue
                    if message.get("type") == "subscribe":
                        channel = message["channel"]
                        names.discard(channel.decode() if isinstance(channel, bytes) else channel)
                    self._handle(message)
                if names:
                    raise ConnectionError(f"{len(names)} live subscriptions not confirmed")
            except BaseException:
                asyncio.ensure_future(port.close())
                raise
            self.port = port
            asyncio.ensure_future(old.close())
            # Joins that waited for a confirmation on the old port: they are subscribed on this one.
            for name, future in list(self._confirm.items()):
                if not future.done():
                    await port.subscribe(name)
        await self._read_again()
        log.warning("live subscription restored: %d views read again", len(self.views))
        return port

    async def _read_again(self) -> None:
        for key, view in list(self.views.items()):
            record, _ = await self.bus.fetch(key, view.source)
            self._deliver(key, record)

    def _deliver(self, key: str, record: "live_bus.Record | None") -> None:
        view = self.views.get(key)
        if view is None or record is None or not record.newer_than(view.latest):
            return
        view.latest = record
        for box in list(view.members):
            box.offer(key, record)

    def status(self, now: float) -> dict:
        """This process's live figures: sockets, views, and the lag of its sends over ``RECENT_S``."""
        lags = sorted(lag for at, lag in list(RECENT) if at >= now - RECENT_S)
        return {"at": time.time(), "pid": os.getpid(), "sockets": len(self.outboxes), "views": len(self.views),
                "window_s": RECENT_S, "sent": len(lags),
                "lag_p95_s": round(lags[max(0, -(-95 * len(lags) // 100) - 1)], 3) if lags else None,
                "lag_max_s": round(lags[-1], 3) if lags else None,
                "resyncs": sum(box.resyncs for box in list(self.outboxes))}

    async def _upkeep(self) -> None:
        """Every ``UPKEEP_S`` (a second): close sockets stuck in a send; every third of
        ``REGISTRATION_S``: renew the registration of this process's views; every 5 s: hand the lag
        histogram to the store; drop views left without sockets for ``LINGER_S``."""
        renewed = flushed = time.monotonic()
        while True:
            await asyncio.sleep(self.UPKEEP_S)
            now = time.monotonic()
            limit = send_timeout_s()
            for box in list(self.outboxes):
                if box.stuck_for(now) > limit:
                    asyncio.ensure_future(box.give_up())
            try:
                for key, view in list(self.views.items()):
                    if view.empty_since is not None and now - view.empty_since > self.LINGER_S and view.ready.done():
                        del self.views[key]
                        async with self._lock:
                            if self.port is not None:
                                await self.port.unsubscribe(live_bus.channel(key))
                if now - renewed >= live_bus.REGISTRATION_S / 3:
                    await self.bus.register([k for k, v in self.views.items() if v.members])
                    renewed = now
                if now - flushed >= 5.0:
                    await self.bus.observe(HISTOGRAM, status_key=f"web:{os.getpid()}", status=self.status(now))
                    flushed = now
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - tried again at the next round
                log.warning("live upkeep failed", exc_info=True)


_HUBS: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Hub]" = weakref.WeakKeyDictionary()


def hub() -> Hub:
    """This event loop's hub (one per web process; tests make new loops and get new hubs)."""
    loop = asyncio.get_running_loop()
    found = _HUBS.get(loop)
    if found is None or (isinstance(found.bus, live_bus.AsyncMemoryBus) is not isinstance(
            live_bus.bus(), live_bus.MemoryBus)):
        found = _HUBS[loop] = Hub()
    return found
