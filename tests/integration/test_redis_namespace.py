"""Issue 23, A4, replayed on the real Redis: a second install on the same Redis (another clone with its
own state directory, as another helper's or another local user's demo would be) cannot hold this
install's locks, overwrite its live snapshots, read its cache or take its Celery tasks.

Before the per-install prefix (``TCO_REDIS_PREFIX``) both installs wrote ``tco:lock:poll:dev``,
``tco:live:snap:queue``, ``tco:1:<key>`` and Celery's ``submit``/``poll`` lists: each step below
then saw the other install's value.
"""
from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest
from django.conf import settings

from tests.support.paths import REPO

pytestmark = [pytest.mark.integration]

# Install B: holds the poll lock, writes a queue snapshot, a cache value and a Celery message,
# says so, waits for a line on stdin, then clears what it wrote.
INSTALL_B = r"""
import sys, django
django.setup()
from django.conf import settings
from django.core.cache import cache
from tco_web.celery import app
from dashboards.core import live_bus
from dashboards.core.redis_client import redis_client
from worker.tasks import single_flight

tag, queue = sys.argv[1], sys.argv[2]
r = redis_client(timeout_s=5)
with single_flight(f"poll:{tag}", 60) as held:
    r.set(live_bus.snap_key(f"queue-{tag}"), b"install B's queue", ex=60)
    cache.set(f"probe-{tag}", "install B", 60)
    with app.connection_for_write() as conn:
        conn.SimpleQueue(queue).put({"task": "worker.tasks.poll_queue"})
    print(settings.TCO_REDIS_PREFIX, held, r.get(live_bus.snap_key(f"queue-{tag}")) is not None, flush=True)
    sys.stdin.readline()
    with app.connection_for_read() as conn:
        message = conn.SimpleQueue(queue).get(block=True, timeout=5)
        message.ack()
        print(message.payload["task"], flush=True)
    r.delete(live_bus.snap_key(f"queue-{tag}"))
    cache.delete(f"probe-{tag}")
    with app.connection_for_write() as conn:
        conn.SimpleQueue(queue).queue.delete()
"""


def test_a_second_install_on_the_same_redis_sees_nothing_of_this_one(tmp_path):
    from django.core.cache import caches

    from dashboards.core import live_bus
    from dashboards.core.redis_client import redis_client
    from tco_web.celery import app
    from worker.tasks import single_flight

    tag, queue = uuid.uuid4().hex[:8], f"probe-{uuid.uuid4().hex[:8]}"
    state_b = tmp_path / "install-b"
    state_b.mkdir(mode=0o700)
    env = {**os.environ, "TCO_STATE_DIR": str(state_b), "DJANGO_SETTINGS_MODULE": "tco_web.settings",
           "PYTHONDONTWRITEBYTECODE": "1"}
    env.pop("TCO_REDIS_PREFIX", None)
    b = subprocess.Popen([sys.executable, "-c", INSTALL_B, tag, queue], cwd=REPO, env=env, text=True,
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        line = b.stdout.readline().split()
        if len(line) != 3:
            b.kill()
            pytest.fail(f"install B said {line}: {b.communicate(timeout=30)[1][-3000:]}")
        prefix_b, held_b, wrote_b = line
        assert (held_b, wrote_b) == ("True", "True")          # install B holds its lock, wrote its snapshot
        assert prefix_b != settings.TCO_REDIS_PREFIX
        # This install's poll is not stopped by B's lock ...
        with single_flight(f"poll:{tag}", 10) as held:
            assert held is True
        # ... its pages do not find B's snapshot, its cache does not read B's value ...
        r = redis_client(timeout_s=5)
        try:
            assert r.get(live_bus.snap_key(f"queue-{tag}")) is None
        finally:
            r.close()
        cache = caches["default"]
        assert settings.CACHES["default"]["KEY_PREFIX"] != prefix_b.rstrip(":")
        assert cache.get(f"probe-{tag}") is None
        # ... and its workers would not take B's task.
        with app.connection_for_read() as conn:
            mine = conn.SimpleQueue(queue)
            try:
                with pytest.raises(mine.Empty):
                    mine.get(block=True, timeout=1)
            finally:
                mine.queue.delete()
        # B's message is still there for B's workers.
        b.stdin.write("\n")
        b.stdin.flush()
        assert b.stdout.readline().strip() == "worker.tasks.poll_queue"
    finally:
        if b.poll() is None:
            try:
                b.stdin.write("\n")
                b.stdin.flush()
            except BrokenPipeError:
                pass
        out, err = b.communicate(timeout=30)
    assert b.returncode == 0, err[-3000:]
