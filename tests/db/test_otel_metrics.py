"""/metrics: the runners' trace span counts (their records' ``telemetry``), summed per project (docs/otel.md)."""
from __future__ import annotations

import pytest
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from dashboards.models import Team
from tests.support.campaigns import make_campaign

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("fast_passwords", "locmem_cache")]

TOKEN = "metrics-token-otel-0123456789"


def telemetry(spans: int, exported: int) -> dict:
    return {"version": 2, "telemetry": {"spans": spans, "spans_exported": exported, "spans_dropped": spans - exported,
                                        "error": None}}


def test_span_counts_of_the_runner_records_reach_metrics(client, role_users, settings):
    settings.TCO_METRICS_TOKEN = TOKEN
    research, engineering = Team.objects.get(project="research"), Team.objects.get(project="engineering")
    done = {"state": "done", "ended_at": timezone.now()}
    make_campaign(team=research, user=role_users["admin"], name="traced", job_number=3001, status="finished",
                  finished_at=timezone.now(), tasks=[
                      {**done, "runner_record": telemetry(6, 6)}, {**done, "runner_record": telemetry(6, 2)},
                      {**done, "runner_record": {"version": 2}}])
    make_campaign(team=research, user=role_users["admin"], name="running", job_number=3002, tasks=[
        {**done, "runner_record": telemetry(9, 0)}, {"state": "pending"}])
    make_campaign(team=engineering, user=role_users["admin"], name="untraced", job_number=3003,
                  tasks=[{**done, "runner_record": {"version": 2}}])
    for _ in range(2):  # the second scrape reads the finished campaign from the cache: the same numbers
        response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
        assert response.status_code == 200
        got = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(response.content.decode()) for s in family.samples}
        assert got[("tco_otel_spans_exported_total", (("project", "research"),))] == 6 + 2 + 0
        assert got[("tco_otel_spans_dropped_total", (("project", "research"),))] == 0 + 4 + 9
        assert got[("tco_otel_spans_dropped_total", (("project", "engineering"),))] == 0
