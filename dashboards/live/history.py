"""Queue-depth history: a sample of active-task counts every ``TCO_DEPTH_SAMPLE_S``.

Kept in Redis (already the broker and the channel layer), as two sorted sets
per database (keys ``<TCO_REDIS_PREFIX>depth:<hash of the database>:fine|coarse``) scored by
the sample's epoch time: ``fine`` keeps every sample for an hour,
``coarse`` one sample a minute for a day. Each member is one JSON object::

    {"t": 1764432000.0, "c": {"dev": {"research": {"pending": 120, "running": 96}}}}

(cluster name -> project -> lifecycle state -> tasks; states with 0 tasks and
inactive states are left out). Losing Redis loses the chart's past, not any
scheduler or accounting data.

Writes: ``depth_sample_record``; reads: ``depth_samples``. Scoping (which
projects a user sees) is done by ``selectors.queue_depth_history``.
"""
from __future__ import annotations

import hashlib
import json
import time
from typing import Any

from django.conf import settings

from dashboards.core.redis_client import redis_client


def _keys() -> tuple[str, str]:
    """(fine, coarse) keys, in the install's namespace (``TCO_REDIS_PREFIX``) and per database
    within it: installs, and test runs of one install on their own databases, keep apart."""
    db = settings.DATABASES["default"]
    ns = hashlib.sha1(f"{db.get('HOST', '')}:{db.get('PORT', '')}:{db['NAME']}".encode()).hexdigest()[:10]
    prefix = settings.TCO_REDIS_PREFIX
    return f"{prefix}depth:{ns}:fine", f"{prefix}depth:{ns}:coarse"


FINE_KEEP_S = 3600
COARSE_KEEP_S = 86400
COARSE_STEP_S = 60


def _redis():
    return redis_client(timeout_s=2)


def depth_sample_record(*, counts: dict[str, dict[str, dict[str, int]]], now: float | None = None,
                        client=None) -> dict[str, Any]:
    """Store one sample ``counts`` (cluster -> project -> state -> n) taken at ``now`` (epoch s).

    Adds to the fine set every time and to the coarse set when the last coarse
    sample is at least a minute old; trims both to their windows. Returns the
    stored sample. Raises ``redis.RedisError`` when Redis cannot be reached.
    """
    now = time.time() if now is None else now
    sample = {"t": round(now, 3), "c": counts}
    member = json.dumps(sample, separators=(",", ":"), sort_keys=True)
    client = client or _redis()
    fine_key, coarse_key = _keys()
    last_coarse = client.zrevrange(coarse_key, 0, 0, withscores=True)
    pipe = client.pipeline()
    pipe.zadd(fine_key, {member: now})
    pipe.zremrangebyscore(fine_key, "-inf", now - FINE_KEEP_S)
    if not last_coarse or now - last_coarse[0][1] >= COARSE_STEP_S - 0.5:
        pipe.zadd(coarse_key, {member: now})
    pipe.zremrangebyscore(coarse_key, "-inf", now - COARSE_KEEP_S)
    pipe.execute()
    return sample


def depth_samples(window: str, *, now: float | None = None, client=None) -> list[dict]:
    """Samples of the last hour (``window="hour"``, fine) or day (``"day"``, coarse), oldest first.

    Returns ``[]`` when Redis cannot be reached: the chart is empty, the page works.
    """
    import redis

    now = time.time() if now is None else now
    fine_key, coarse_key = _keys()
    key, keep = (fine_key, FINE_KEEP_S) if window == "hour" else (coarse_key, COARSE_KEEP_S)
    try:
        client = client or _redis()
        raw = client.zrangebyscore(key, now - keep, "+inf")
    except redis.RedisError:
        return []
    samples = []
    for item in raw:
        try:
            samples.append(json.loads(item))
        except ValueError:
            continue
    return samples


def depth_clear(*, client=None) -> None:
    """Forget every sample (tests)."""
    client = client or _redis()
    client.delete(*_keys())


def depth_sample_take(*, now: float | None = None) -> dict[str, Any]:
    """Count the active tasks (``selectors.depth_counts``), store the sample, tell queue pages.

    The service behind the periodic ``worker.tasks.sample_queue_depth``.
    """
    from dashboards.core import realtime
    from dashboards.live import counts as live_counts

    sample = depth_sample_record(counts=live_counts.depth_counts(), now=now)
    realtime.depth_sampled()
    return sample
