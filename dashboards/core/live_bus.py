"""The live views' store and fan-out: change marks, finished snapshots with sequence numbers, pub/sub.

One producer (``dashboards.live.publish``, the ``tco_live_publish`` process) builds each live view's
payload once per change and audience and keeps it here; the web processes forward the bytes
(``dashboards.live.hub``). Nothing here knows what a view shows: views are opaque keys
(``dashboards.live.snapshots.View``), each fed by one **source** (``queue``, ``depth``,
``campaign:<id>``) whose **generation** counts the committed changes.

Redis keys (``tco:live:`` prefix; Redis is the cache and the broker already, never the truth: lost
data is rebuilt from the database at the next pass):

=================  ======  ==========================================================================
``gen``            hash    source -> generation, incremented after each commit that changed it
``oldest:obs``     hash    source -> qstat start (epoch s) of the oldest change not yet built
``oldest:commit``  hash    source -> commit instant of the oldest change not yet built
``views``          zset    view -> when its registration ends (epoch s): the views someone watches
``known``          zset    view -> when it was last registered (its ``seq`` is kept a day after)
``built``          hash    view -> the generation its latest snapshot was built from
``seq``            hash    view -> its latest sequence number (1, 2, ... never reset while known)
``snap:<view>``    string  the view's latest :class:`Record`
``wake``           list    the producer's wake-up calls (a few at most)
``epoch``          string  random, made once: a Redis that lost its data gets a new one
``lag``            hash    the lag histograms' bucket counts (``dashboards.web.metrics``)
``status``         string  the producer's latest pass (JSON), with an expiry: its heartbeat
=================  ======  ==========================================================================

Channel ``tco:live:v:<view>`` carries each new record of the view.

Whether a snapshot is current is decided by generations, not by timing: the producer reads the
source's generation *before* it reads the database (:meth:`take`), and a change's generation is
incremented after its commit, so a snapshot built from generation ``g`` holds every change
counted in ``g``; a view whose built generation is below its source's is rebuilt.

``TCO_LIVE_BUS`` chooses the backend: ``redis`` (every process of a site) or ``memory`` (one
process: the unit tests; with ``eager`` the producer runs at each wake-up).
"""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import logging
import threading
import time
import uuid
from typing import Any, Callable, Iterable

from django.conf import settings

from dashboards.core.live_histogram import Histogram, histogram_fields, parse_histograms
from dashboards.core.redis_client import shared_redis_client

log = logging.getLogger(__name__)

PREFIX = settings.TCO_REDIS_PREFIX + "live:"  # the install's namespace (tco_web/settings.py redis_prefix)
GEN, OLDEST_OBS, OLDEST_COMMIT = PREFIX + "gen", PREFIX + "oldest:obs", PREFIX + "oldest:commit"
VIEWS, KNOWN, BUILT, SEQ = PREFIX + "views", PREFIX + "known", PREFIX + "built", PREFIX + "seq"
WAKE, EPOCH, LAG, STATUS = PREFIX + "wake", PREFIX + "epoch", PREFIX + "lag", PREFIX + "status"

QUEUE, DEPTH = "queue", "depth"
#: How long a view stays registered without a renewal (seconds); web processes renew every third of it.
REGISTRATION_S = 60.0
#: A view's sequence counter is kept this long after its last registration (a browser page that could
#: not reconnect for longer reloads), then forgotten with it.
KNOWN_S = 86400.0


def campaign_source(campaign_id: int) -> str:
    return f"campaign:{campaign_id}"


def snap_key(view: str) -> str:
    return PREFIX + "snap:" + view


def channel(view: str) -> str:
    return PREFIX + "v:" + view


def view_of_channel(name: str) -> str:
    return name[len(PREFIX + "v:"):]


@dataclasses.dataclass(frozen=True)
class Record:
    """One finished snapshot of a view: ``body`` is the JSON text sent to browsers as it is.

    Stored and published as one header line ``<seq> <gen> <epoch> <observed_at or ->`` then the body,
    so a web process reads what it needs (the order, the lag) without parsing the JSON.
    """

    seq: int
    gen: int
    epoch: str
    observed_at: float | None
    body: bytes

    def encode(self) -> bytes:
        observed = "-" if self.observed_at is None else repr(float(self.observed_at))
        return f"{self.seq} {self.gen} {self.epoch} {observed}\n".encode() + self.body

    @classmethod
    def decode(cls, raw: bytes) -> "Record":
        """Raises ValueError for anything that is not an encoded record."""
        header, sep, body = bytes(raw).partition(b"\n")
        parts = header.decode().split(" ")
        if not sep or len(parts) != 4:
            raise ValueError("not a live record")
        return cls(int(parts[0]), int(parts[1]), parts[2], None if parts[3] == "-" else float(parts[3]), body)

    @functools.cached_property
    def text(self) -> str:
        return self.body.decode()

    def newer_than(self, other: "Record | None") -> bool:
        """Later in its view's sequence than ``other`` (always, when the store's epoch changed)."""
        return other is None or self.epoch != other.epoch or self.seq > other.seq


# --------------------------------------------------------------------------- Redis

# take(source): its generation and oldest pending change, which are then cleared (one atomic step).
_TAKE = """
local g = redis.call('HGET', KEYS[1], ARGV[1])
local o = redis.call('HGET', KEYS[2], ARGV[1])
local c = redis.call('HGET', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HDEL', KEYS[3], ARGV[1])
return {g or '0', o or '', c or ''}
"""
# The registered views, after forgetting those whose registration ended (their snapshots and built
# generations go, so a view registered again is rebuilt; its seq stays while it is known). Atomic, so a
# registration renewed meanwhile is never lost.
_REGISTERED = """
local now = tonumber(ARGV[1])
local gone = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now)
for _, v in ipairs(gone) do
  redis.call('ZREM', KEYS[1], v)
  redis.call('DEL', ARGV[3] .. v)
  redis.call('HDEL', KEYS[2], v)
end
local forgotten = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now - tonumber(ARGV[2]))
for _, v in ipairs(forgotten) do
  if not redis.call('ZSCORE', KEYS[1], v) then
    redis.call('ZREM', KEYS[3], v)
    redis.call('HDEL', KEYS[4], v)
  end
end
return redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
"""


def _s(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class RedisBus:
    """The store on Redis (every process of a site): the sync side (producer, page GETs, commits)."""

    def __init__(self, url: str) -> None:
        self.url = url

    @property
    def r(self):
        return shared_redis_client(timeout_s=5.0)   # BLPOP waits at most idle_s (1 s) of these 5

    # -- writers of changes (after their commit)
    def mark_changed(self, sources: Iterable[str], observed_at: float | None = None) -> None:
        now = time.time()
        pipe = self.r.pipeline(transaction=True)
        for source in sources:
            if observed_at is not None:
                pipe.hsetnx(OLDEST_OBS, source, repr(float(observed_at)))
            pipe.hsetnx(OLDEST_COMMIT, source, repr(now))
            pipe.hincrby(GEN, source, 1)
        pipe.lpush(WAKE, "1").ltrim(WAKE, 0, 7)
        pipe.execute()

    def wake(self) -> None:
        self.r.pipeline(transaction=False).lpush(WAKE, "1").ltrim(WAKE, 0, 7).execute()

    # -- the producer
    def wait_wake(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for a wake-up call; True when one came (all are taken)."""
        got = self.r.blpop([WAKE], timeout=max(0.01, timeout))
        if got:
            self.r.delete(WAKE)
        return bool(got)

    def registered(self, now: float | None = None) -> list[str]:
        now = time.time() if now is None else now
        keys = self.r.eval(_REGISTERED, 4, VIEWS, BUILT, KNOWN, SEQ, repr(now), repr(KNOWN_S), PREFIX + "snap:")
        return [_s(k) for k in keys]

    def gens(self) -> dict[str, int]:
        return {_s(k): int(v) for k, v in self.r.hgetall(GEN).items()}

    def pending(self) -> dict[str, float]:
        """Source -> commit instant of its oldest change not yet built."""
        return {_s(k): float(v) for k, v in self.r.hgetall(OLDEST_COMMIT).items()}

    def built(self, views: list[str]) -> dict[str, int]:
        if not views:
            return {}
        return {v: int(g) for v, g in zip(views, self.r.hmget(BUILT, views)) if g is not None}

    def take(self, source: str) -> tuple[int, float | None, float | None]:
        g, o, c = self.r.eval(_TAKE, 3, GEN, OLDEST_OBS, OLDEST_COMMIT, source)
        return int(g), (float(o) if _s(o) else None), (float(c) if _s(c) else None)

    def next_seqs(self, views: list[str]) -> list[int]:
        pipe = self.r.pipeline(transaction=False)
        for view in views:
            pipe.hincrby(SEQ, view, 1)
        return [int(n) for n in pipe.execute()]

    def publish(self, items: list[tuple[str, int, bytes]]) -> None:
        """Store and publish ``[(view, gen, encoded record)]`` (one round trip)."""
        if not items:
            return
        pipe = self.r.pipeline(transaction=False)
        for view, gen, raw in items:
            pipe.set(snap_key(view), raw)
            pipe.hset(BUILT, view, gen)
            pipe.publish(channel(view), raw)
        pipe.execute()

    def forget(self, view: str) -> None:
        self.r.pipeline(transaction=True).zrem(VIEWS, view).delete(snap_key(view)).hdel(BUILT, view).execute()

    def epoch(self) -> str:
        """The store's epoch (made once, at random; a Redis that lost its data makes a new one)."""
        _, value = self.r.pipeline(transaction=True).set(EPOCH, uuid.uuid4().hex[:12], nx=True).get(EPOCH).execute()
        return _s(value)

    # -- readers (page GETs)
    def snapshot(self, view: str, source: str, *, register: bool = True) -> tuple[Record | None, int, bool]:
        """``(record or None, its source's generation now, whether the view was registered already)``;
        registers the view for ``REGISTRATION_S`` seconds (the page's socket follows)."""
        now = time.time()
        pipe = self.r.pipeline(transaction=True)
        if register:
            pipe.zadd(VIEWS, {view: now + REGISTRATION_S}).zadd(KNOWN, {view: now})
        pipe.get(snap_key(view)).hget(GEN, source)
        out = pipe.execute()
        raw, gen = out[-2], out[-1]
        was = not register or out[0] == 0
        return (Record.decode(raw) if raw else None), int(gen or 0), was

    # -- lag and status
    def observe(self, histogram: Histogram) -> None:
        counts, sums = histogram_fields(histogram.drain())
        if not counts:
            return
        pipe = self.r.pipeline(transaction=False)
        for key, n in counts.items():
            pipe.hincrby(LAG, key, n)
        for key, s in sums.items():
            pipe.hincrbyfloat(LAG, key, s)
        pipe.execute()

    def histograms(self) -> dict[str, dict[str, Any]]:
        return parse_histograms(self.r.hgetall(LAG))

    def set_status(self, status: dict, ttl_s: float = 60.0) -> None:
        self.r.set(STATUS, json.dumps(status), px=int(ttl_s * 1000))

    def status(self) -> dict | None:
        raw = self.r.get(STATUS)
        return json.loads(raw) if raw else None

    def web_statuses(self) -> list[dict]:
        """What each web process reported in the last minute (``Hub._upkeep``)."""
        keys = list(self.r.scan_iter(match=PREFIX + "web:*", count=100))
        return [json.loads(raw) for raw in (self.r.mget(keys) if keys else []) if raw]

    # -- web processes
    def async_side(self) -> "AsyncRedisBus":
        return AsyncRedisBus(self.url)


class AsyncRedisBus:
    """The store on Redis for a web process's event loop: the hub's pub/sub and its reads."""

    def __init__(self, url: str) -> None:
        import redis.asyncio as aioredis

        self._pool = aioredis.BlockingConnectionPool.from_url(url, max_connections=16, timeout=10,
                                                              socket_connect_timeout=2, socket_timeout=10)
        self.r = aioredis.Redis(connection_pool=self._pool)

    async def fetch(self, view: str, source: str) -> tuple[Record | None, int]:
        """Register ``view`` and read its record and its source's generation (one round trip)."""
        now = time.time()
        pipe = self.r.pipeline(transaction=True)
        pipe.zadd(VIEWS, {view: now + REGISTRATION_S}).zadd(KNOWN, {view: now})
        pipe.get(snap_key(view)).hget(GEN, source)
        _, _, raw, gen = await pipe.execute()
        return (Record.decode(raw) if raw else None), int(gen or 0)

    async def register(self, views: list[str]) -> None:
        if views:
            now = time.time()
            await (self.r.pipeline(transaction=False).zadd(VIEWS, {v: now + REGISTRATION_S for v in views})
                   .zadd(KNOWN, {v: now for v in views}).execute())

    async def wake(self) -> None:
        await self.r.pipeline(transaction=False).lpush(WAKE, "1").ltrim(WAKE, 0, 7).execute()

    async def observe(self, histogram: Histogram, status_key: str | None = None, status: dict | None = None) -> None:
        counts, sums = histogram_fields(histogram.drain())
        pipe = self.r.pipeline(transaction=False)
        for key, n in counts.items():
            pipe.hincrby(LAG, key, n)
        for key, s in sums.items():
            pipe.hincrbyfloat(LAG, key, s)
        if status_key and status is not None:
            pipe.set(PREFIX + status_key, json.dumps(status), ex=60)
        await pipe.execute()

    def pubsub(self) -> "RedisPort":
        return RedisPort(self.r)

    async def close(self) -> None:
        await self.r.aclose()
        await self._pool.disconnect()


class RedisPort:
    """One pub/sub connection: ``subscribe``/``unsubscribe`` send the command (its confirmation comes
    through :meth:`get` as a ``subscribe`` message), :meth:`get` the next message. ``reconnected``
    turns True when redis-py reconnected it (messages published meanwhile were lost)."""

    def __init__(self, client) -> None:
        import redis.asyncio.client as aioclient

        port = self

        class PubSub(aioclient.PubSub):
            async def on_connect(self, connection) -> None:
                port._connects += 1
                if port._connects > 1:
                    port.reconnected = True
                await super().on_connect(connection)

        self.reconnected = False
        self._connects = 0
        self.ps = PubSub(client.connection_pool)
        self._subscribed = asyncio.Event()   # set by each subscribe; cleared by a get that finds none

    async def subscribe(self, name: str) -> None:
        await self.ps.subscribe(name)
        self._subscribed.set()

    async def unsubscribe(self, name: str) -> None:
        await self.ps.unsubscribe(name)

    async def get(self, timeout: float) -> dict | None:
        """The next message within ``timeout`` seconds, or None. While nothing is subscribed (before the
        first subscription, or after the last view was dropped) it waits for the next subscription, up to
        ``timeout``: redis-py's ``get_message`` returns None at once then, so a reader calling it in a
        loop would spin, and a fixed sleep instead held a web process's first socket's confirmation (and
        its first snapshot) up to ``timeout`` behind (issue 22, connect storm)."""
        if not self.ps.subscribed:
            self._subscribed.clear()
            started = time.monotonic()
            try:
                await asyncio.wait_for(self._subscribed.wait(), timeout)
            except asyncio.TimeoutError:
                return None
            timeout = max(0.0, timeout - (time.monotonic() - started))
        return await self.ps.get_message(ignore_subscribe_messages=False, timeout=timeout)

    async def close(self) -> None:
        await self.ps.aclose()


# --------------------------------------------------------------------------- in memory (one process)

class MemoryBus:
    """The same store in this process's memory, for the unit tests. With ``eager``, a wake-up runs the
    producer (``runner``, set by ``dashboards.live.publish``) at once: inline from sync code, on the
    database thread from a web event loop."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.eager = True
        self.runner: Callable[[], Any] | None = None
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.gen: dict[str, int] = {}
            self.oldest_obs: dict[str, float] = {}
            self.oldest_commit: dict[str, float] = {}
            self.views: dict[str, float] = {}
            self.built_gen: dict[str, int] = {}
            self.seq: dict[str, int] = {}
            self.snaps: dict[str, bytes] = {}
            self.lag: dict[str, float] = {}
            self.status_value: dict | None = None
            self.statuses: dict[str, dict] = {}
            self.ports: set[MemoryPort] = set()
            self.wakes = 0
            self.epoch_value = uuid.uuid4().hex[:12]
        self._woken = threading.Event()

    # sync side
    def mark_changed(self, sources: Iterable[str], observed_at: float | None = None) -> None:
        now = time.time()
        with self.lock:
            for source in sources:
                if observed_at is not None:
                    self.oldest_obs.setdefault(source, float(observed_at))
                self.oldest_commit.setdefault(source, now)
                self.gen[source] = self.gen.get(source, 0) + 1
        self.wake()

    def wake(self) -> None:
        with self.lock:
            self.wakes += 1
        self._woken.set()
        if self.eager and self.runner is not None:
            self.runner()

    def wait_wake(self, timeout: float) -> bool:
        got = self._woken.wait(timeout)
        self._woken.clear()
        return got

    def registered(self, now: float | None = None) -> list[str]:
        now = time.time() if now is None else now
        with self.lock:
            for view in [v for v, until in self.views.items() if until <= now]:
                del self.views[view]
                self.snaps.pop(view, None)
                self.built_gen.pop(view, None)
            return sorted(self.views)

    def gens(self) -> dict[str, int]:
        with self.lock:
            return dict(self.gen)

    def pending(self) -> dict[str, float]:
        with self.lock:
            return dict(self.oldest_commit)

    def built(self, views: list[str]) -> dict[str, int]:
        with self.lock:
            return {v: self.built_gen[v] for v in views if v in self.built_gen}

    def take(self, source: str) -> tuple[int, float | None, float | None]:
        with self.lock:
            return self.gen.get(source, 0), self.oldest_obs.pop(source, None), self.oldest_commit.pop(source, None)

    def next_seqs(self, views: list[str]) -> list[int]:
        with self.lock:
            out = []
            for view in views:
                self.seq[view] = self.seq.get(view, 0) + 1
                out.append(self.seq[view])
            return out

    def publish(self, items: list[tuple[str, int, bytes]]) -> None:
        with self.lock:
            for view, gen, raw in items:
                self.snaps[view] = raw
                self.built_gen[view] = gen
            ports = list(self.ports)
        for view, _gen, raw in items:
            for port in ports:
                port.deliver(channel(view), raw)

    def forget(self, view: str) -> None:
        with self.lock:
            self.views.pop(view, None)
            self.snaps.pop(view, None)
            self.built_gen.pop(view, None)

    def epoch(self) -> str:
        return self.epoch_value

    def _register(self, views: Iterable[str]) -> int:
        with self.lock:
            new = 0
            for view in views:
                new += view not in self.views
                self.views[view] = time.time() + REGISTRATION_S
            return new

    def snapshot(self, view: str, source: str, *, register: bool = True) -> tuple[Record | None, int, bool]:
        with self.lock:
            was = not register or not self._register([view])
            raw = self.snaps.get(view)
            return (Record.decode(raw) if raw else None), self.gen.get(source, 0), was

    def observe(self, histogram: Histogram) -> None:
        counts, sums = histogram_fields(histogram.drain())
        with self.lock:
            for key, value in (*counts.items(), *sums.items()):
                self.lag[key] = self.lag.get(key, 0) + value

    def histograms(self) -> dict[str, dict[str, Any]]:
        with self.lock:
            return parse_histograms({k: str(v) for k, v in self.lag.items()})

    def set_status(self, status: dict, ttl_s: float = 60.0) -> None:
        self.status_value = dict(status)

    def status(self) -> dict | None:
        return self.status_value

    def web_statuses(self) -> list[dict]:
        return list(self.statuses.values())

    def async_side(self) -> "AsyncMemoryBus":
        return AsyncMemoryBus(self)


class AsyncMemoryBus:
    def __init__(self, bus: MemoryBus) -> None:
        self.bus = bus

    async def fetch(self, view: str, source: str) -> tuple[Record | None, int]:
        record, gen, _ = self.bus.snapshot(view, source)
        return record, gen

    async def register(self, views: list[str]) -> None:
        self.bus._register(views)

    async def wake(self) -> None:
        if self.bus.eager and self.bus.runner is not None:
            from channels.db import database_sync_to_async

            with self.bus.lock:
                self.bus.wakes += 1
            await database_sync_to_async(self.bus.runner)()
        else:
            self.bus.wake()

    async def observe(self, histogram: Histogram, status_key: str | None = None, status: dict | None = None) -> None:
        self.bus.observe(histogram)
        if status_key and status is not None:
            self.bus.statuses[status_key] = status

    def pubsub(self) -> "MemoryPort":
        port = MemoryPort(self.bus, asyncio.get_running_loop())
        with self.bus.lock:
            self.bus.ports.add(port)
        return port

    async def close(self) -> None:
        return None


class MemoryPort:
    def __init__(self, bus: MemoryBus, loop: asyncio.AbstractEventLoop) -> None:
        self.bus, self.loop = bus, loop
        self.queue: asyncio.Queue = asyncio.Queue()
        self.channels: set[str] = set()
        self.reconnected = False

    def deliver(self, name: str, raw: bytes) -> None:
        if name in self.channels and not self.loop.is_closed():
            self.loop.call_soon_threadsafe(self.queue.put_nowait,
                                           {"type": "message", "channel": name.encode(), "data": raw})

    async def subscribe(self, name: str) -> None:
        self.channels.add(name)
        self.queue.put_nowait({"type": "subscribe", "channel": name.encode(), "data": len(self.channels)})

    async def unsubscribe(self, name: str) -> None:
        self.channels.discard(name)

    async def get(self, timeout: float) -> dict | None:
        try:
            return await asyncio.wait_for(self.queue.get(), timeout)
        except asyncio.TimeoutError:
            return None

    async def close(self) -> None:
        with self.bus.lock:
            self.bus.ports.discard(self)


MEMORY = MemoryBus()


def bus() -> RedisBus | MemoryBus:
    """The configured store (``settings.TCO_LIVE_BUS``: ``redis``, the default, or ``memory``)."""
    if getattr(settings, "TCO_LIVE_BUS", "redis") == "memory":
        return MEMORY
    return _redis_bus(settings.REDIS_URL)


@functools.lru_cache(maxsize=4)
def _redis_bus(url: str) -> RedisBus:
    return RedisBus(url)
