"""A stand-in for the Redis connection of channels_redis' ``RedisChannelLayer``: the commands its group joins and
leaves send (``ZADD``, ``EXPIRE``, ``ZREM``, alone or in a pipeline) kept in dicts, with each round trip counted,
and a receive that waits and gets nothing."""
from __future__ import annotations

import asyncio


class FakeRedis:
    """The few commands group_add/group_discard send, kept in dicts; ``trips`` counts round trips (a command
    awaited alone, or a pipeline's execute)."""

    def __init__(self) -> None:
        self.sets: dict[bytes, dict[str, float]] = {}
        self.ttl: dict[bytes, int] = {}
        self.commands: list[tuple] = []
        self.trips = 0
        self.down: Exception | None = None
        self.wrong_type: set[bytes] = set()

    def _run(self, command: tuple):
        self.commands.append(command)
        name, key, *rest = command
        if key in self.wrong_type:
            return RuntimeError("WRONGTYPE")
        if name == "zadd":
            self.sets.setdefault(key, {}).update(rest[0])
            return len(rest[0])
        if name == "zrem":
            return sum(self.sets.get(key, {}).pop(m, None) is not None for m in rest)
        if name == "expire":
            if key in self.sets:
                self.ttl[key] = rest[0]
            return int(key in self.sets)
        raise AssertionError(name)

    async def _one(self, command: tuple):
        await asyncio.sleep(0.001)
        self.trips += 1
        if self.down:
            raise self.down
        result = self._run(command)
        if isinstance(result, Exception):
            raise result
        return result

    async def zadd(self, key, mapping):
        return await self._one(("zadd", key, dict(mapping)))

    async def expire(self, key, seconds):
        return await self._one(("expire", key, seconds))

    async def zrem(self, key, *members):
        return await self._one(("zrem", key, *members))

    async def eval(self, script, numkeys, *args):     # channels_redis' receive: its clean-up script
        return None

    async def bzpopmin(self, key, timeout=0):          # channels_redis' receive: nothing comes
        await asyncio.sleep(min(timeout or 1, 1))
        return None

    def pipeline(self, transaction=True):
        assert transaction is False   # as many requests' commands: no MULTI around them
        return FakePipeline(self)


class FakePipeline:
    def __init__(self, redis: FakeRedis) -> None:
        self.redis, self.queued = redis, []

    def zadd(self, key, mapping):
        self.queued.append(("zadd", key, dict(mapping)))

    def expire(self, key, seconds):
        self.queued.append(("expire", key, seconds))

    def zrem(self, key, *members):
        self.queued.append(("zrem", key, *members))

    async def execute(self, raise_on_error=True):
        assert raise_on_error is False
        await asyncio.sleep(0.001)
        self.redis.trips += 1
        if self.redis.down:
            raise self.redis.down
        return [self.redis._run(c) for c in self.queued]
