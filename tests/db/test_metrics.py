"""/metrics: Prometheus exposition, readable only with the metrics token or from an allowed address."""
from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from dashboards.models import IngestCheckpoint, Task, Team
from dashboards.core.clusters import cluster_get_default

from tests.support.campaigns import make_campaign

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_passwords", "locmem_cache")]

TOKEN = "metrics-token-0123456789"


@pytest.fixture
def metrics_data(role_users, settings, tmp_path):
    settings.TCO_METRICS_TOKEN = TOKEN
    settings.TCO_METRICS_ALLOW = ["127.0.0.1", "10.9.0.0/16"]
    research = Team.objects.get(project="research")
    make_campaign(team=research, user=role_users["admin"], name="alpha", job_number=1001, tasks=[
        {"state": "running", "state_code": "r"}, {"state": "pending"}, {"state": "pending"},
        {"state": "held", "state_code": "hqw"},
        {"state": "done", "input_tokens": 1000, "cache_read_tokens": 200, "output_tokens": 300,
         "cost_usd": Decimal("0.25"), "ended_at": timezone.now()},
    ])
    cluster = cluster_get_default()
    Task.objects.create(cluster=cluster, job_number=2000, owner="alice", project="", state="pending")
    now = timezone.now()
    cluster.polled_at = now - dt.timedelta(seconds=3)
    cluster.status_at = now
    cluster.status = {
        "queues": [{"name": "agent.q", "used": 1, "resv": 0, "available": 95, "total": 96}],
        "hosts": [{"name": "global", "resources": {"anthropic_api": {"value": "95.000000"}}}],
        "global_capacity": {"anthropic_api": 96.0},
        "quotas": [{"rule": "agent_cap/1", "resource": "slots", "limit": 96, "used": 1, "filters": {}}],
        "share_tree": [{"node": "/research", "project": "research", "user": None, "usage": 6.19,
                        "actual_share": 0.99}],
    }
    cluster.save()
    accounting = tmp_path / "accounting"
    accounting.write_bytes(b"x" * 1000)
    IngestCheckpoint.objects.create(cluster=cluster, source="accounting", path=str(accounting),
                                    inode=accounting.stat().st_ino, offset=600)
    return settings


def samples(response) -> dict[tuple[str, tuple], float]:
    out = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def test_an_allowed_address_reads_the_metrics(client, metrics_data):
    response = client.get("/metrics", REMOTE_ADDR="127.0.0.1")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/plain; version=0.0.4")
    got = samples(response)
    assert got[("tco_tasks", (("cluster", "dev"), ("project", "research"), ("state", "pending")))] == 2
    assert got[("tco_tasks", (("cluster", "dev"), ("project", "research"), ("state", "held")))] == 1
    assert got[("tco_tasks", (("cluster", "dev"), ("project", "research"), ("state", "running")))] == 1
    assert got[("tco_tasks", (("cluster", "dev"), ("project", ""), ("state", "pending")))] == 1
    assert ("tco_tasks", (("cluster", "dev"), ("project", "research"), ("state", "done"))) not in got
    assert got[("tco_queue_slots_used", (("cluster", "dev"), ("queue", "agent.q")))] == 1
    assert got[("tco_queue_slots_total", (("cluster", "dev"), ("queue", "agent.q")))] == 96
    assert got[("tco_consumable_used", (("cluster", "dev"), ("resource", "anthropic_api")))] == 1
    assert got[("tco_consumable_capacity", (("cluster", "dev"), ("resource", "anthropic_api")))] == 96
    assert got[("tco_quota_limit", (("cluster", "dev"), ("resource", "slots"), ("rule", "agent_cap/1")))] == 96
    assert got[("tco_share_tree_usage", (("cluster", "dev"), ("project", "research")))] == pytest.approx(6.19)
    assert 3 <= got[("tco_poll_age_seconds", (("cluster", "dev"),))] < 60
    assert got[("tco_poll_error", (("cluster", "dev"),))] == 0
    assert got[("tco_ingest_backlog_bytes", (("cluster", "dev"), ("source", "accounting")))] == 400
    assert got[("tco_tokens_total", (("bucket", "input"), ("project", "research")))] == 1000
    assert got[("tco_tokens_total", (("bucket", "cache_read"), ("project", "research")))] == 200
    assert got[("tco_tokens_total", (("bucket", "output"), ("project", "research")))] == 300
    assert got[("tco_cost_usd_total", (("project", "research"),))] == pytest.approx(0.25)


def test_an_address_inside_an_allowed_network_reads_the_metrics(client, metrics_data):
    assert client.get("/metrics", REMOTE_ADDR="10.9.3.4").status_code == 200


def test_any_other_address_is_refused(client, metrics_data):
    response = client.get("/metrics", REMOTE_ADDR="192.0.2.7")
    assert response.status_code == 403
    assert b"tco_tasks" not in response.content


def test_the_token_opens_the_metrics_from_anywhere(client, metrics_data):
    response = client.get("/metrics", REMOTE_ADDR="192.0.2.7", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200 and b"tco_tasks" in response.content


def test_a_wrong_token_is_refused_even_from_an_allowed_address(client, metrics_data):
    assert client.get("/metrics", REMOTE_ADDR="127.0.0.1", HTTP_AUTHORIZATION="Bearer nope").status_code == 403


def test_without_a_configured_token_a_bearer_header_opens_nothing(client, metrics_data):
    metrics_data.TCO_METRICS_TOKEN = None
    assert client.get("/metrics", REMOTE_ADDR="192.0.2.7", HTTP_AUTHORIZATION="Bearer ").status_code == 403


def test_a_logged_in_admin_from_elsewhere_is_still_refused(client, metrics_data):
    client.login(username="admin", password="test-admin-pw-1")
    assert client.get("/metrics", REMOTE_ADDR="192.0.2.7").status_code == 403


def test_the_token_can_come_from_a_file(monkeypatch, tmp_path):
    import importlib

    import tco_web.settings as project_settings

    secret = tmp_path / "metrics-token"
    secret.write_text("from-a-file\n")
    monkeypatch.setenv("TCO_METRICS_TOKEN_FILE", str(secret))
    monkeypatch.setenv("TCO_METRICS_ALLOW", "127.0.0.1,::1,10.0.0.0/8")
    try:
        reloaded = importlib.reload(project_settings)
        assert reloaded.TCO_METRICS_TOKEN == "from-a-file"
        assert reloaded.TCO_METRICS_ALLOW == ["127.0.0.1", "::1", "10.0.0.0/8"]
        monkeypatch.setenv("TCO_METRICS_ALLOW", "localhost")
        from django.core.exceptions import ImproperlyConfigured

        with pytest.raises(ImproperlyConfigured, match="TCO_METRICS_ALLOW"):
            importlib.reload(project_settings)
    finally:
        monkeypatch.delenv("TCO_METRICS_TOKEN_FILE")
        monkeypatch.delenv("TCO_METRICS_ALLOW")
        importlib.reload(project_settings)


def test_openmetrics_is_served_when_asked_for(client, metrics_data):
    response = client.get("/metrics", HTTP_ACCEPT="application/openmetrics-text; version=1.0.0")
    assert response["Content-Type"].startswith("application/openmetrics-text")
    assert response.content.rstrip().endswith(b"# EOF")


def test_finished_campaigns_usage_is_cached_and_still_counted(client, metrics_data, role_users,
                                                               django_assert_max_num_queries):
    research = Team.objects.get(project="research")
    make_campaign(team=research, user=role_users["admin"], name="old", job_number=900, status="finished",
                  finished_at=timezone.now(), tasks=[{"state": "done", "input_tokens": 5, "cost_usd": Decimal("1")}])
    from dashboards.billing import usage

    first = {r["project"]: r for r in usage.usage_by_project()}
    assert first["research"]["input_tokens"] == 1005 and first["research"]["cost_usd"] == Decimal("1.25")
    Task.objects.filter(campaign__name="old").update(input_tokens=0)  # a finished campaign's sums are kept
    again = {r["project"]: r for r in usage.usage_by_project()}
    assert again["research"]["input_tokens"] == 1005
