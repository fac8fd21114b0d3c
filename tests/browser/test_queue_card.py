"""Issue 16, bug 11, in Chromium: the cluster card's slot line and the queue-depth chart.

The page is rendered by Django (the test client) from a cluster status made
of real qstat/qquota XML, then served with its static files by a plain HTTP
server, so no cluster, worker or WebSocket is needed (the page keeps the
server's first snapshot).
"""
from __future__ import annotations

import datetime as dt
import functools
import http.server
import os
import shutil
import threading
from pathlib import Path

import pytest
from django.conf import settings
from django.test import Client

from schedulers.gridengine.parsers.qquota import parse_qquota
from schedulers.hosts import parse_queue_instances

from tests.support.stack import TEST_OUTPUT

pytestmark = [pytest.mark.browser, pytest.mark.django_db]
os.environ.setdefault("DJANGO_ALLOW_ASYNC_UNSAFE", "true")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
END = dt.datetime(2026, 12, 1, 16, 30, tzinfo=dt.timezone.utc)


def depth_of(seconds: list[float]):
    """A queue_depth_history stand-in: samples at ``END - s`` for each s."""
    def history(user, window="hour"):
        t = [(END - dt.timedelta(seconds=s)).isoformat() for s in seconds]
        return {"window": window, "t": t, "queued": {"research": [3] * len(t)}, "running": [1] * len(t)}
    return history


def served_page(tmp_path: Path, html: str) -> tuple[str, http.server.ThreadingHTTPServer]:
    site = tmp_path / "site"
    static = site / "static"
    shutil.copytree(settings.BASE_DIR / "static", static)
    plotly_dir = next(Path(d[1]) for d in settings.STATICFILES_DIRS if isinstance(d, tuple) and d[0] == "plotly")
    shutil.copytree(plotly_dir, static / "plotly")
    if Path(settings.STATIC_ROOT).is_dir():  # after collectstatic the page names hashed files
        shutil.copytree(settings.STATIC_ROOT, static, dirs_exist_ok=True)
    (site / "index.html").write_text(html)

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(site)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return f"http://127.0.0.1:{server.server_address[1]}/index.html", server


@pytest.mark.parametrize("samples", [[0.0], [1.0, 0.0], [3600.0 - 30 * i for i in range(121)]],
                         ids=["one-sample", "two-samples-1s-apart", "an-hour"])
def test_the_card_splits_the_slots_and_the_depth_chart_keeps_its_labels(browser, bootstrap, monkeypatch, tmp_path,
                                                                       samples, memory_live_store):
    # memory_live_store: the page is built from the status written below, not a snapshot another test left in Redis.
    from dashboards.core.clusters import cluster_get_default
    from dashboards.models import Cluster

    monkeypatch.setattr("dashboards.live.queue.queue_depth_history", depth_of(samples))
    # agent.q@mh-exec1 unknown with 2 tasks (48 slots), agent.q@mh-exec2 disabled (48), classic.q fine (2).
    Cluster.objects.filter(pk=cluster_get_default().pk).update(status={
        "queues": [{"name": "agent.q", "used": 2, "resv": 0, "available": 0, "total": 96},
                   {"name": "classic.q", "used": 0, "resv": 0, "available": 2, "total": 2}],
        "quotas": parse_qquota((FIXTURES / "sge819/qquota.xml").read_bytes()), "global_capacity": {}, "hosts": [],
        "queue_instances": parse_queue_instances((FIXTURES / "multihost/qstat_f_unknown_disabled.xml").read_bytes())})
    from dashboards.models import Task

    for job in (4000, 4001):  # two jobs of another account: one line for their owner
        Task.objects.create(cluster=cluster_get_default(), job_number=job, name="theirs", owner="alice",
                            project="", state="pending", state_code="qw")
    client = Client()
    assert client.login(username="admin", password="test-admin-pw-1")
    url, server = served_page(tmp_path, client.get("/").content.decode())
    try:
        for width in (390, 1400):
            page = browser.new_page(viewport={"width": width, "height": 1000})
            page.goto(url)
            page.wait_for_selector("#depth-chart .xtick text")
            line = page.text_content('p.slots-line[data-queue="agent.q"]')
            # 2 in use; 48 - 2 on the unknown instance and 48 on the disabled one cannot take work.
            assert line == ("agent.q: 96 slots: 2 in use by tasks placed there, 94 unavailable "
                            "(agent.q@mh-exec1 unknown (u); agent.q@mh-exec2 disabled (d)), 0 free."), line
            quota = page.text_content('p.quota[data-rule="agent_cap/1"]')
            assert "slots 5 of 96 in use" in quota and "in queues agent.q" in quota, quota
            owner = page.locator('#other-owners tr[data-owner="alice"] td')
            assert [owner.nth(i).text_content() for i in range(3)] == ["alice", "2", "2"]
            found = page.evaluate("""() => {
              const out = {labels: [], outside: []};
              document.querySelectorAll('#depth-chart .xtick text').forEach(t => out.labels.push(t.textContent));
              document.querySelectorAll('#depth-chart text').forEach(t => {
                const r = t.getBoundingClientRect(), svg = t.closest('svg').getBoundingClientRect();
                if (!t.textContent.trim() || !r.width) return;
                if (r.bottom > svg.bottom + 0.5 || r.top < svg.top - 0.5 || r.left < svg.left - 0.5 ||
                    r.right > svg.right + 0.5) out.outside.push(t.textContent);
              });
              return out;
            }""")
            shown = [label for label in found["labels"] if label]
            assert len(shown) >= 2 and len(set(shown)) == len(shown), shown  # no label repeated
            assert found["outside"] == [], found  # no clipped letter under or beside the chart
            page.screenshot(path=str(TEST_OUTPUT / f"queue-card-{len(samples)}-{width}.png"), full_page=True)
            page.close()
    finally:
        server.shutdown()
