"""Sockets' joins and leaves of channel-layer groups, batched: the sockets that ask at once, in one round trip.

Every live socket joins two groups on the channel layer (its session's, before its check; its user's, after),
so that a logout or a change of rights closes it (``dashboards.live.consumers``). Channels' ``RedisChannelLayer``
makes each ``group_add`` two round trips to Redis (``ZADD``, then ``EXPIRE``), on a pooled connection each: a
connect storm of 1,000 sockets made 4,000 round trips, and they, not the checks, were most of a socket's time
from its connect to its first snapshot (issue 22, traced per phase: the two joins p50 0.4 s and 1.2 s of a
storm's 4.5 s, the check 0.06 s).

:class:`Memberships` (one per event loop and layer: :func:`memberships`) sends the first request at once and the
requests that come while it is on its way together in the next trip: on a ``RedisChannelLayer``, one pipeline
per shard with each join's ``ZADD`` and ``EXPIRE`` and each leave's ``ZREM``, the same commands, keys, scores
and expiry as the layer's own ``group_add``/``group_discard``, so the layer's ``group_send`` reaches a member
as before. Any other layer (channels' ``InMemoryChannelLayer`` in tests) gets its own calls, at most
:data:`LAYER_CALLS` at once. A request is answered when its commands have run; an error of a request's own
command is that request's, a trip that fails (Redis away) fails each request of the trip.
"""
from __future__ import annotations

import asyncio
import time
import weakref
from collections import defaultdict

#: Joins and leaves in one trip, at most.
BATCH = 512
#: Channel-layer calls at once, at most, on a layer without pipelines (one trip's calls run at most this many
#: at a time).
LAYER_CALLS = 16

ADD, DISCARD = "add", "discard"


def pipelined(layer) -> bool:
    """Whether ``layer`` is channels_redis' ``RedisChannelLayer`` (its joins and leaves go in pipelines)."""
    try:
        from channels_redis.core import RedisChannelLayer
    except ImportError:   # pragma: no cover - channels_redis is a requirement
        return False
    return isinstance(layer, RedisChannelLayer)


class Memberships:
    """The group joins and leaves of one event loop's sockets on ``layer``, in batches (module doc)."""

    def __init__(self, layer) -> None:
        self.layer = layer
        self.waiting: list[tuple[str, str, str, asyncio.Future]] = []
        self.draining = False
        self.trips = 0
        self._task: asyncio.Future | None = None

    async def add(self, group: str, channel: str) -> None:
        """Join ``channel`` to ``group`` (as ``layer.group_add``); raises what the layer raised."""
        await self._ask(ADD, group, channel)

    async def discard(self, group: str, channel: str) -> None:
        """Remove ``channel`` from ``group`` (as ``layer.group_discard``); raises what the layer raised."""
        await self._ask(DISCARD, group, channel)

    async def _ask(self, op: str, group: str, channel: str) -> None:
        assert self.layer.require_valid_group_name(group), "Group name not valid"
        assert self.layer.require_valid_channel_name(channel), "Channel name not valid"
        future = asyncio.get_running_loop().create_future()
        self.waiting.append((op, group, channel, future))
        if not self.draining:
            self.draining = True
            self._task = asyncio.ensure_future(self._drain())
        await future

    async def _drain(self) -> None:
        try:
            while self.waiting:
                batch, self.waiting = self.waiting[:BATCH], self.waiting[BATCH:]
                self.trips += 1
                ops = [(op, group, channel) for op, group, channel, _ in batch]
                try:
                    errors = await (_pipeline(self.layer, ops) if pipelined(self.layer) else _calls(self.layer, ops))
                except BaseException as exc:  # noqa: BLE001 - the trip itself failed: each request is told
                    errors = [exc] * len(batch)
                for (_, _, _, future), error in zip(batch, errors):
                    if not future.done():
                        future.set_result(None) if error is None else future.set_exception(error)
        finally:
            self.draining = False


async def _pipeline(layer, ops: list[tuple[str, str, str]]) -> list[BaseException | None]:
    """``ops`` on a ``RedisChannelLayer``: per shard, one pipeline (no transaction) of each join's ``ZADD key
    {channel: now}`` and each leave's ``ZREM key channel`` in order, then ``EXPIRE key group_expiry`` for each
    key joined (channels_redis ``group_add``, ``group_discard``). For each op, None or its error."""
    shards: dict[int, list[int]] = defaultdict(list)
    for i, (_, group, _) in enumerate(ops):
        shards[layer.consistent_hash(group)].append(i)
    errors: list[BaseException | None] = [None] * len(ops)

    async def one(index: int, members: list[int]) -> None:
        pipe = layer.connection(index).pipeline(transaction=False)
        now = time.time()
        joined: dict[bytes, list[int]] = {}
        for i in members:
            op, group, channel = ops[i]
            key = layer._group_key(group)
            if op == ADD:
                pipe.zadd(key, {channel: now})
                joined.setdefault(key, []).append(i)
            else:
                pipe.zrem(key, channel)
        for key in joined:
            pipe.expire(key, layer.group_expiry)
        results = await pipe.execute(raise_on_error=False)
        for i, result in zip(members, results):
            if isinstance(result, Exception):
                errors[i] = result
        for (key, adders), result in zip(joined.items(), results[len(members):]):
            if isinstance(result, Exception):
                for i in adders:
                    errors[i] = errors[i] or result

    await asyncio.gather(*(one(index, members) for index, members in shards.items()))
    return errors


async def _calls(layer, ops: list[tuple[str, str, str]]) -> list[BaseException | None]:
    """``ops`` as the layer's own ``group_add``/``group_discard`` calls, at most :data:`LAYER_CALLS` at once."""
    gate = asyncio.Semaphore(LAYER_CALLS)

    async def one(op: str, group: str, channel: str) -> BaseException | None:
        async with gate:
            try:
                await (layer.group_add if op == ADD else layer.group_discard)(group, channel)
            except Exception as exc:  # noqa: BLE001 - that request's answer
                return exc
        return None

    return list(await asyncio.gather(*(one(*op) for op in ops)))


_BATCHES: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[int, Memberships]]" = weakref.WeakKeyDictionary()


def memberships(layer) -> Memberships:
    """This event loop's :class:`Memberships` on ``layer``."""
    loop = asyncio.get_running_loop()
    per_layer = _BATCHES.setdefault(loop, {})
    found = per_layer.get(id(layer))
    if found is None or found.layer is not layer:
        found = per_layer[id(layer)] = Memberships(layer)
    return found
