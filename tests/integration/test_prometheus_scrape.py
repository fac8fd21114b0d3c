"""A real Prometheus (Debian's package) scrapes tco's /metrics with the bearer token and evaluates tco's rules.

Prometheus runs on a free loopback port with its own temporary directory, scraping a live tco
server (pytest-django's ``live_server``, loopback) every second with the token from a file, and
loads deploy/prometheus/tco-rules.yml (evaluated every second). Run under the cluster lock like
the other integration tests: ``flock /var/lock/tco-cluster.lock ...``.
"""
from __future__ import annotations

import datetime as dt
import json
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from decimal import Decimal
from pathlib import Path

import pytest
import yaml
from django.utils import timezone

from dashboards.core.clusters import cluster_get_default
from dashboards.models import Budget, IngestCheckpoint, Team
from tests.support.campaigns import make_campaign
from tests.support.stack import free_port

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("fast_passwords", "locmem_cache")]

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "deploy" / "prometheus" / "tco-rules.yml"
TOKEN = "prometheus-scrape-token-0123456789"


@pytest.fixture
def site(role_users, settings, tmp_path):
    """tco's database with something for every alert: a stale poll, an unreachable host, an ingest
    backlog, a budget mostly spent, a task pending far longer than its queue's waits."""
    settings.TCO_METRICS_TOKEN = TOKEN
    settings.TCO_METRICS_ALLOW = []
    research = Team.objects.get(project="research")
    now = timezone.now()
    t0 = now - dt.timedelta(hours=3)
    waits = [3, 3, 3, 40]  # histogram_quantile(0.95): rank 3.8 in (30, 60] -> 30 + 30 * 0.8 = 54 s
    tasks = [{"state": "done", "queue": "agent.q", "submitted_at": t0, "started_at": t0 + dt.timedelta(seconds=w),
              "task_started_at": t0 + dt.timedelta(seconds=w)} for w in waits]
    tasks.append({"state": "pending", "submitted_at": now - dt.timedelta(seconds=1000)})
    tasks.append({"state": "done", "queue": "classic.q", "submitted_at": now - dt.timedelta(seconds=61),
                  "started_at": now - dt.timedelta(seconds=60), "cost_usd": Decimal("90"), "output_tokens": 9})
    make_campaign(team=research, user=role_users["admin"], name="scraped", job_number=4001, tasks=tasks)
    Budget.objects.create(team=research, period="day", amount_usd=Decimal("100"), thresholds=[])
    cluster = cluster_get_default()
    cluster.polled_at = now - dt.timedelta(seconds=120)
    cluster.status = {"hosts": [{"name": "h1", "load_avg": 0.3}, {"name": "h2", "load_avg": None}],
                      "queue_instances": [], "reservations": [{"id": 3, "state": "running", "slots": 2,
                                                               "team": "research"}]}
    cluster.save()
    accounting = tmp_path / "accounting"
    accounting.write_bytes(b"x" * 2_000_000)
    checkpoint = IngestCheckpoint.objects.create(cluster=cluster, source="accounting", path=str(accounting),
                                                 inode=accounting.stat().st_ino, offset=0)
    IngestCheckpoint.objects.filter(pk=checkpoint.pk).update(updated_at=now - dt.timedelta(seconds=900))
    return settings


@pytest.fixture
def prometheus(live_server, site, tmp_path):
    """Prometheus scraping ``live_server`` twice: with the token (job tco) and without (job tco_no_token)."""
    binary = shutil.which("prometheus")
    assert binary, "Debian's prometheus package is missing: scripts/setup installs it"
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    token_file.chmod(0o600)
    target = urllib.parse.urlsplit(live_server.url).netloc
    assert target.startswith("127.0.0.1:") or target.startswith("localhost:"), target
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {"job_name": "tco", "metrics_path": "/metrics", "static_configs": [{"targets": [target]}],
             "authorization": {"type": "Bearer", "credentials_file": str(token_file)}},
            {"job_name": "tco_no_token", "metrics_path": "/metrics", "static_configs": [{"targets": [target]}]},
        ],
    }
    config_file = tmp_path / "prometheus.yml"
    config_file.write_text(yaml.safe_dump(config))
    port = free_port()
    log = open(tmp_path / "prometheus.log", "wb")
    proc = subprocess.Popen([binary, f"--config.file={config_file}", f"--storage.tsdb.path={tmp_path / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
                            stdout=log, stderr=subprocess.STDOUT)
    api = f"http://127.0.0.1:{port}/api/v1"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if _get(api, "targets")["data"]["activeTargets"]:
                    break
            except OSError:
                pass
            assert proc.poll() is None, (tmp_path / "prometheus.log").read_text()
            time.sleep(0.25)
        yield api
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _get(api: str, path: str, **params) -> dict:
    url = f"{api}/{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def _wait(api: str, check, what: str, seconds: float = 60):
    deadline = time.monotonic() + seconds
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.5)
    pytest.fail(f"Prometheus did not {what} in {seconds:.0f} s (last: {last!r})")


def _query(api: str, expr: str) -> list[dict]:
    answer = _get(api, "query", query=expr)
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def test_prometheus_scrapes_with_the_token_and_evaluates_tcos_rules(prometheus):
    api = prometheus

    def targets():
        found = {t["labels"]["job"]: t for t in _get(api, "targets")["data"]["activeTargets"]}
        return found if all(t["health"] != "unknown" for t in found.values()) and len(found) == 2 else None

    found = _wait(api, targets, "scrape both targets")
    assert found["tco"]["health"] == "up", found["tco"]
    # Without the token, tco answers 403 and Prometheus marks the target down.
    assert found["tco_no_token"]["health"] == "down" and "403" in found["tco_no_token"]["lastError"]

    # The stage histograms arrived with their labels; the rule's p95 is the histogram's own.
    p95 = _wait(api, lambda: _query(api, 'cluster_queue:tco_queue_wait_seconds:p95{queue="agent.q"}'),
                "record the queue wait p95")
    assert p95[0]["metric"]["cluster"] == "dev"
    assert float(p95[0]["value"][1]) == pytest.approx(54.0)

    # Every rule loads and evaluates without error.
    def evaluated():
        groups = _get(api, "rules")["data"]["groups"]
        rules = [r for g in groups for r in g["rules"]]
        done = rules and all(r.get("lastEvaluation", "").startswith("20") and r["health"] == "ok" for r in rules)
        return rules if done else None

    rules = _wait(api, evaluated, "evaluate every rule")
    assert {r["name"] for r in rules if r["type"] == "alerting"} == {
        "TcoPollStale", "TcoIngestBacklog", "TcoHostLost", "TcoLiveLagHigh", "TcoBudgetBurnRate",
        "TcoPendingLongerThanUsual"}

    # Each alert's expression, asked through the query API, finds what the database holds.
    exprs = {r["name"]: r["query"] for r in rules if r["type"] == "alerting"}
    assert {s["metric"]["cluster"] for s in _query(api, exprs["TcoPollStale"])} == {"dev"}
    assert {s["metric"]["source"] for s in _query(api, exprs["TcoIngestBacklog"])} == {"accounting"}
    assert [float(s["value"][1]) for s in _query(api, exprs["TcoHostLost"])] == [1.0]
    assert [s["metric"]["queue"] for s in _query(api, exprs["TcoPendingLongerThanUsual"])] == ["agent.q"]
    assert _query(api, exprs["TcoLiveLagHigh"]) == []  # no lag histogram in this process, no alert
    elapsed = float(_query(api, 'tco_budget_period_elapsed_ratio{project="research"}')[0]["value"][1])
    projected = float(_query(api, 'project_period:tco_budget_projected:ratio{project="research"}')[0]["value"][1])
    # The rule's last evaluation and the gauge's last scrape may be a second apart, while the period's
    # elapsed part grows (about 1e-4 of itself a second a few hours into a day).
    assert projected == pytest.approx(0.9 / elapsed, rel=1e-3)
    burning = _query(api, exprs["TcoBudgetBurnRate"])
    assert bool(burning) == (projected > 1 and elapsed > 0.05)

    # And the alerts go pending (each has a "for" of minutes: none fires within the test).
    def pending():
        alerts = {a["labels"]["alertname"] for a in _get(api, "alerts")["data"]["alerts"]}
        return alerts if {"TcoPollStale", "TcoIngestBacklog", "TcoHostLost", "TcoPendingLongerThanUsual"} <= alerts \
            else None

    alerts = _wait(api, pending, "hold the expected alerts pending")
    assert "TcoLiveLagHigh" not in alerts
