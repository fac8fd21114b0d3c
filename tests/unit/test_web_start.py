"""A web process loads what its first requests need before it serves (tco_web.asgi.load_for_first_requests):
every view module and template, the auth backends and the session engine, then freezes its heap. Run in a
child process: the freeze and the imports are the process's own."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

CHILD = r"""
import gc, json, sys
import tco_web.asgi as asgi
before = {m for m in sys.modules}
loaded = asgi.load_for_first_requests()
print(json.dumps({
    "loaded": loaded,
    "frozen": gc.get_freeze_count(),
    "new": sorted(m for m in set(sys.modules) - before),
    "redis": "redis.asyncio.client" in sys.modules,
    "sessions": "django.contrib.sessions.backends.db" in sys.modules,
}))
"""


def test_a_web_process_loads_every_template_and_view_and_freezes_its_heap_before_serving():
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tco_web.settings", "TCO_WEB_WARM": "0"}
    out = subprocess.run([sys.executable, "-c", CHILD], cwd=REPO, env=env, capture_output=True, text=True,
                         timeout=120, check=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    templates = list((REPO / "dashboards" / "templates").rglob("*.html"))
    assert got["loaded"] == len(templates) > 30
    assert got["frozen"] > 10_000                     # the heap of a loaded Django, not a handful
    # The page views (imported by the URL conf) were loaded by the call itself; the session engine and
    # the async Redis client are loaded once it returns (Channels' session middleware may load the first).
    assert {"dashboards.web.urls", "dashboards.web.urls_ops"} <= set(got["new"])
    assert got["redis"] and got["sessions"]
