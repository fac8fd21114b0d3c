"""The one way tco's code opens a Redis client of its own (beyond Django's cache, Celery and channels).

Redis is the broker, the channel layer, the cache and the store of the queue-depth
samples and the live snapshots. Its URL (with the password read from
``TCO_REDIS_PASSWORD_FILE``) is ``settings.REDIS_URL``; see tco_web/settings.py.
"""
from __future__ import annotations

import functools

from django.conf import settings


def redis_client(*, timeout_s: float | None = None):
    """A ``redis.Redis`` on ``settings.REDIS_URL``, with its own connection pool.

    ``timeout_s``: seconds for connecting and for each command (None: wait as long as
    the socket does). Raises nothing until used; a command raises ``redis.RedisError``
    (or ``OSError``) when Redis cannot be reached. The caller closes it when done.
    """
    import redis

    return redis.Redis.from_url(settings.REDIS_URL, socket_timeout=timeout_s, socket_connect_timeout=timeout_s)


@functools.lru_cache(maxsize=4)
def shared_redis_client(timeout_s: float | None = None):
    """One :func:`redis_client` (and connection pool) per process and timeout, for hot paths
    (a worker's tasks, the live publisher): not one connection per call."""
    return redis_client(timeout_s=timeout_s)
