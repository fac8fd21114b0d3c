"""Issue 23, A4: every key tco keeps in Redis is in the install's namespace (``TCO_REDIS_PREFIX``).

Two installs of one host (or a test run beside a demo) shared one Redis and the keys ``tco:live:*``,
``tco:lock:*``, the cache's ``tco:1:*`` and Celery's queues: one install's poll lock stopped the
other's poll, its snapshots were served by the other's pages, its workers took the other's tasks.
The integration test (tests/integration/test_redis_namespace.py) replays that on the real Redis.
"""
from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from tco_web.settings import redis_prefix


def test_the_default_is_a_hash_of_the_resolved_state_directory(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir()
    two.mkdir()
    (tmp_path / "link").symlink_to(one)
    expected = "tco:" + hashlib.sha256(str(one.resolve()).encode()).hexdigest()[:10] + ":"
    assert redis_prefix(one) == expected
    assert redis_prefix(tmp_path / "link") == expected          # the same install through a link
    assert redis_prefix(Path(str(one) + "/")) == expected
    assert redis_prefix(two) != expected                          # another install of this host
    assert redis_prefix(two).startswith("tco:") and len(redis_prefix(two)) == len(expected)


def test_an_explicit_prefix_wins_and_ends_with_a_colon(tmp_path):
    assert redis_prefix(tmp_path, "site-a") == "site-a:"
    assert redis_prefix(tmp_path, "lab.b:prod:") == "lab.b:prod:"


@pytest.mark.parametrize("bad", ["with space", "a*b", "x" * 65, "tco:{1}", "new\nline"])
def test_a_malformed_prefix_stops_start_up(tmp_path, bad):
    with pytest.raises(ImproperlyConfigured, match="TCO_REDIS_PREFIX"):
        redis_prefix(tmp_path, bad)


def test_this_process_uses_the_state_directorys_prefix():
    """The settings module computed it from TCO_STATE_DIR as above (no TCO_REDIS_PREFIX in the test env)."""
    import os

    if os.environ.get("TCO_REDIS_PREFIX"):
        pytest.skip("TCO_REDIS_PREFIX is set in this environment")
    digest = hashlib.sha256(str(Path(settings.STATE_DIR).resolve()).encode()).hexdigest()[:10]
    assert settings.TCO_REDIS_PREFIX == f"tco:{digest}:"


def test_every_redis_user_writes_under_the_prefix(monkeypatch):
    """The cache, the channel layer, Celery's broker, the live store, the depth history and the locks."""
    import tco_web.settings as configured
    from dashboards.core import live_bus
    from dashboards.live import history
    from worker import tasks

    prefix = settings.TCO_REDIS_PREFIX
    # The settings module's own values (the tests' autouse fixture swaps CACHES for a local one).
    assert configured.CACHES["default"]["KEY_PREFIX"] + ":" == prefix
    assert configured.CHANNEL_LAYERS["default"]["CONFIG"]["prefix"].startswith(prefix)
    assert configured.CELERY_BROKER_TRANSPORT_OPTIONS["global_keyprefix"].startswith(prefix)
    assert live_bus.PREFIX.startswith(prefix)
    assert live_bus.snap_key("queue").startswith(prefix) and live_bus.channel("queue").startswith(prefix)
    assert all(key.startswith(prefix + "depth:") for key in history._keys())

    taken = []

    class Lock:
        def acquire(self, blocking):
            return False

    class Client:
        def lock(self, name, **kwargs):
            taken.append(name)
            return Lock()

    monkeypatch.setattr(tasks, "_redis", lambda: Client())
    with tasks.single_flight("poll:dev", 5) as acquired:
        assert acquired is False
    assert taken == [prefix + "lock:poll:dev"]


def test_celery_takes_the_transport_options():
    from tco_web.celery import app

    assert app.conf.broker_transport_options["global_keyprefix"] == settings.TCO_REDIS_PREFIX + "celery:"
