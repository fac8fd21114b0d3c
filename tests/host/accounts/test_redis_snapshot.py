"""Issue 23, A4 (the other-local-user half), replayed by another local account: tco's live snapshot of
the queue sits in Redis on 127.0.0.1, which every local account can connect to. Without the password
(``/etc/tco/redis-password``, mode 0400, owner tco) it reads nothing: not the key, not the list of keys,
not by guessing the install's prefix (``TCO_REDIS_PREFIX``)."""
from __future__ import annotations

import os
import uuid

import redis
from django.conf import settings

from dashboards.core import live_bus
from tests.support.accounts import as_user

INTRUDER = "nobody"
REDIS_PORT = os.environ.get("TCO_REDIS_PORT", "6379")
REDIS_DB = os.environ.get("TCO_REDIS_DB", "0")


def test_another_account_cannot_read_a_live_snapshot(probe_account):
    view = f"queue-probe-{uuid.uuid4().hex[:8]}"
    key = live_bus.snap_key(view)
    body = b'{"running": 96, "campaigns": ["secret-project"]}'
    client = redis.Redis.from_url(settings.REDIS_URL, socket_timeout=5)
    client.set(key, body, ex=60)
    try:
        assert client.get(key) == body                          # tco reads it (the password works)
        for user in (INTRUDER, probe_account):
            for argv in (["GET", key], ["KEYS", "*"], ["--scan", "--pattern", "*live*"]):
                out = as_user(user, ["redis-cli", "-h", "127.0.0.1", "-p", REDIS_PORT, "-n", REDIS_DB, *argv])
                text = out.stdout + out.stderr
                assert "NOAUTH" in text, (user, argv, out)
                assert "secret-project" not in text and key not in text, (user, argv, out)
            # The password file itself is tco's alone.
            assert as_user(user, ["cat", os.environ.get("TCO_REDIS_PASSWORD_FILE", "/etc/tco/redis-password")]
                           ).returncode != 0
    finally:
        client.delete(key)
        client.close()
