"""A Redis cache that degrades to "no cache" while Redis is down, instead of failing the page.

Django's ``RedisCache`` raises ``redis.ConnectionError`` from every call when
Redis does not answer, and the queue and campaign pages read through the
cache (finished campaigns' counts, stage
statistics, ``qstat -j`` answers): with Redis stopped they answered 500.
Here a connection failure or timeout is logged (once per outage) and the
call behaves as a miss: ``get`` returns the default, ``set``/``delete`` do
nothing, ``add`` returns True (the caller computes the value itself, as if
it held the lock), ``get_many`` returns ``{}``. Each call tries Redis again,
so the cache comes back with Redis, without a restart. Other Redis errors
(a wrong type, a full memory) are raised as before.

Settings: ``CACHES["default"]["BACKEND"] = "dashboards.core.resilient_cache.ResilientRedisCache"``,
with ``OPTIONS`` ``socket_connect_timeout``/``socket_timeout`` (seconds) so
an unanswering Redis costs at most that per call.
"""
from __future__ import annotations

import logging
import time

import redis
from django.core.cache.backends.redis import RedisCache

log = logging.getLogger(__name__)

#: Errors that mean "Redis is not reachable now" (connection refused, reset, timed out).
UNAVAILABLE = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, ConnectionError, TimeoutError)


class ResilientRedisCache(RedisCache):
    """``RedisCache`` whose calls are misses (not errors) while Redis is unreachable.

    ``down_since`` is the monotonic time of the first failure of the current
    outage (None while Redis answers).
    """

    down_since: float | None = None

    def _fail(self, op: str, exc: Exception, value):
        if self.down_since is None:
            self.down_since = time.monotonic()
            log.warning("cache unavailable (%s: %s): reading without it until Redis answers", op, exc)
        return value

    def _ok(self, value):
        if self.down_since is not None:
            log.warning("cache available again after %.0f s", time.monotonic() - self.down_since)
            self.down_since = None
        return value

    def ping(self) -> None:
        """PING Redis through the cache's own connection settings (address, credentials, timeouts).

        Raises ``redis.RedisError``/``OSError`` when it does not answer; an answer ends ``down_since``.
        """
        self._ok(self._cache.get_client(write=True).ping())

    def get(self, key, default=None, version=None):
        try:
            return self._ok(super().get(key, default, version))
        except UNAVAILABLE as exc:
            return self._fail("get", exc, default)


def _wrap(name: str, fallback):
    """``RedisCache.<name>``, answering ``fallback()`` while Redis is unreachable."""
    base = getattr(RedisCache, name)

    def method(self, *args, **kwargs):
        try:
            return self._ok(base(self, *args, **kwargs))
        except UNAVAILABLE as exc:
            return self._fail(name, exc, fallback())

    method.__name__ = name
    method.__doc__ = f"``RedisCache.{name}``; while Redis is unreachable: {fallback()!r}."
    return method


for _name, _fallback in (("set", lambda: None), ("add", lambda: True), ("delete", lambda: False),
                         ("touch", lambda: False), ("get_many", dict), ("set_many", list),
                         ("delete_many", lambda: None), ("has_key", lambda: False), ("clear", lambda: None)):
    setattr(ResilientRedisCache, _name, _wrap(_name, _fallback))
del _name, _fallback
