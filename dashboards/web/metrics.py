"""Prometheus metrics at ``/metrics``, read from the database at each scrape.

Access: a request with ``Authorization: Bearer <TCO_METRICS_TOKEN>`` (or the
token in ``TCO_METRICS_TOKEN_FILE``, by default ``<state dir>/metrics-token``,
which scripts/setup writes readable by tco only), or one whose client address
is in ``TCO_METRICS_ALLOW`` (addresses or networks; empty by default: every
local account connects from 127.0.0.1, so an address alone proves nothing).
Anything else gets 403.

Metrics (labels in braces; every value is read at scrape time):

| metric | meaning |
|---|---|
| ``tco_tasks{cluster, project, state}`` | active tasks per lifecycle state (queue depth: ``pending`` + ``held``) |
| ``tco_queue_slots_used{cluster, queue}``, ``tco_queue_slots_total`` | slots per cluster queue (``qstat -g c``) |
| ``tco_consumable_used{cluster, resource}``, ``tco_consumable_capacity`` | global consumables, e.g. model API seats |
| ``tco_quota_used{cluster, rule, resource}``, ``tco_quota_limit`` | resource quota sets (``qquota``) |
| ``tco_share_tree_usage{cluster, project}``, ``tco_share_tree_actual_share`` | share tree per project |
| ``tco_poll_age_seconds{cluster}`` | seconds since the last successful qstat poll |
| ``tco_status_age_seconds{cluster}`` | seconds since the last queue/host/quota poll |
| ``tco_poll_error{cluster}`` | 1 when the last poll failed |
| ``tco_ingest_age_seconds{cluster, source}`` | seconds since an ingest checkpoint moved |
| ``tco_ingest_backlog_bytes{cluster, source}`` | accounting bytes not yet read (file size minus checkpoint) |
| ``tco_tokens_total{project, bucket}`` | tokens metered, per bucket (input, cache_read, ...) |
| ``tco_cost_usd_total{project}`` | dollars of the metered tokens |
| ``tco_otel_spans_exported_total{project}`` | trace spans the runners sent to the OTLP receiver (docs/otel.md) |
| ``tco_otel_spans_dropped_total{project}`` | trace spans lost: queue full, export failed or too late |

Stage histograms, pending age, hosts, reservations and budgets: ``web.metrics_fleet``.
"""
from __future__ import annotations

import ipaddress
import os
import secrets
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import choose_encoder

from dashboards.billing.usage import usage_by_project
from dashboards.live import cluster as live_cluster
from dashboards.live.counts import depth_counts
from dashboards.models import Cluster
from dashboards.web import metrics
from dashboards.web.metrics_fleet import FleetCollector
from execution.spool.contract import TOKEN_FIELDS


def _allowed_networks() -> list:
    networks = []
    for item in settings.TCO_METRICS_ALLOW:
        try:
            networks.append(ipaddress.ip_network(item, strict=False))
        except ValueError:
            continue  # validated at start-up by check_metrics_settings; never widen on a typo
    return networks


def metrics_allowed(request: HttpRequest) -> bool:
    """A valid Bearer token, or a client address inside ``TCO_METRICS_ALLOW``."""
    header = request.META.get("HTTP_AUTHORIZATION", "")
    token = settings.TCO_METRICS_TOKEN
    if header.startswith("Bearer "):
        # A wrong token is refused even from an allowed address: it is a mistake worth seeing.
        return bool(token) and secrets.compare_digest(header[7:].strip().encode(), token.encode())
    try:
        address = ipaddress.ip_address(request.META.get("REMOTE_ADDR", ""))
    except ValueError:
        return False
    return any(address in network for network in _allowed_networks())


class TcoCollector:
    """A prometheus_client collector reading ``selectors.metrics_snapshot`` once per scrape."""

    def collect(self):
        snap = metrics.metrics_snapshot()
        now = timezone.now()

        tasks = GaugeMetricFamily("tco_tasks", "Active tasks per lifecycle state", labels=["cluster", "project", "state"])
        for cluster, per_project in sorted(snap["depth"].items()):
            for project, per_state in sorted(per_project.items()):
                for state, n in sorted(per_state.items()):
                    tasks.add_metric([cluster, project, state], n)
        yield tasks

        used = GaugeMetricFamily("tco_queue_slots_used", "Slots in use per cluster queue", labels=["cluster", "queue"])
        total = GaugeMetricFamily("tco_queue_slots_total", "Slots per cluster queue", labels=["cluster", "queue"])
        c_used = GaugeMetricFamily("tco_consumable_used", "Global consumable in use", labels=["cluster", "resource"])
        c_cap = GaugeMetricFamily("tco_consumable_capacity", "Global consumable capacity",
                                  labels=["cluster", "resource"])
        q_used = GaugeMetricFamily("tco_quota_used", "Resource quota in use", labels=["cluster", "rule", "resource"])
        q_limit = GaugeMetricFamily("tco_quota_limit", "Resource quota limit", labels=["cluster", "rule", "resource"])
        st_usage = GaugeMetricFamily("tco_share_tree_usage", "Share-tree decayed usage", labels=["cluster", "project"])
        st_actual = GaugeMetricFamily("tco_share_tree_actual_share", "Share-tree actual share (0..1)",
                                      labels=["cluster", "project"])
        poll_age = GaugeMetricFamily("tco_poll_age_seconds", "Seconds since the last successful qstat poll",
                                     labels=["cluster"])
        status_age = GaugeMetricFamily("tco_status_age_seconds", "Seconds since the last queue/host/quota poll",
                                       labels=["cluster"])
        poll_error = GaugeMetricFamily("tco_poll_error", "1 when the last poll failed", labels=["cluster"])
        for cluster in snap["clusters"]:
            res = live_cluster.cluster_resources(cluster, settings.TCO_SEAT_RESOURCE)
            for q in res["queues"]:
                for family, key in ((used, "used"), (total, "total")):
                    if isinstance(q.get(key), (int, float)):
                        family.add_metric([cluster.name, q.get("name", "")], q[key])
            for c in res["consumables"]:
                c_used.add_metric([cluster.name, c["resource"]], c["used"])
                c_cap.add_metric([cluster.name, c["resource"]], c["capacity"])
            for q in res["quotas"]:
                for family, key in ((q_used, "used"), (q_limit, "limit")):
                    if isinstance(q.get(key), (int, float)):
                        family.add_metric([cluster.name, str(q.get("rule", "")), str(q.get("resource", ""))], q[key])
            for node in res["share_tree"]:
                if node.get("project") and not node.get("user"):
                    if isinstance(node.get("usage"), (int, float)):
                        st_usage.add_metric([cluster.name, node["project"]], node["usage"])
                    if isinstance(node.get("actual_share"), (int, float)):
                        st_actual.add_metric([cluster.name, node["project"]], node["actual_share"])
            if cluster.polled_at:
                poll_age.add_metric([cluster.name], (now - cluster.polled_at).total_seconds())
            if cluster.status_at:
                status_age.add_metric([cluster.name], (now - cluster.status_at).total_seconds())
            failed = bool(cluster.poll_error_at and (not cluster.polled_at or cluster.poll_error_at > cluster.polled_at))
            poll_error.add_metric([cluster.name], 1.0 if failed or cluster.poll_error else 0.0)
        yield from (used, total, c_used, c_cap, q_used, q_limit, st_usage, st_actual, poll_age, status_age, poll_error)

        ingest_age = GaugeMetricFamily("tco_ingest_age_seconds", "Seconds since the ingest checkpoint moved",
                                       labels=["cluster", "source"])
        backlog = GaugeMetricFamily("tco_ingest_backlog_bytes", "Bytes of the source not yet ingested",
                                    labels=["cluster", "source"])
        for cp in snap["checkpoints"]:
            ingest_age.add_metric([cp.cluster.name, cp.source], (now - cp.updated_at).total_seconds())
            try:
                info = os.stat(cp.path)
            except OSError:
                continue
            behind = info.st_size - cp.offset if info.st_ino == cp.inode else info.st_size
            backlog.add_metric([cp.cluster.name, cp.source], max(0, behind))
        yield ingest_age
        yield backlog

        tokens = CounterMetricFamily("tco_tokens", "Tokens metered per bucket", labels=["project", "bucket"])
        cost = CounterMetricFamily("tco_cost_usd", "Dollars of metered tokens", labels=["project"])
        for row in snap["usage"]:
            for field in TOKEN_FIELDS:
                tokens.add_metric([row["project"], field.removesuffix("_tokens")], row[field] or 0)
            cost.add_metric([row["project"]], float(row["cost_usd"] or 0))
        yield tokens
        yield cost
        # The runners' OpenTelemetry export (docs/otel.md): spans sent, and lost (never waited for).
        spans = {kind: CounterMetricFamily(f"tco_otel_spans_{kind}", f"Trace spans the runners {kind} (docs/otel.md)",
                                           labels=["project"]) for kind in ("exported", "dropped")}
        for row in snap["usage"]:
            for kind, family in spans.items():
                family.add_metric([row["project"]], row.get(f"otel_spans_{kind}") or 0)
        yield from spans.values()


def metrics_view(request: HttpRequest) -> HttpResponse:
    if not metrics_allowed(request):
        return HttpResponse("forbidden: metrics need a token or an allowed address\n", status=403,
                            content_type="text/plain")
    registry = CollectorRegistry(auto_describe=False)
    registry.register(TcoCollector())
    registry.register(FleetCollector())  # stage histograms, hosts, reservations, budgets (web.metrics_fleet)
    # The text format (0.0.4) unless the scraper asks for OpenMetrics.
    encoder, content_type = choose_encoder(request.META.get("HTTP_ACCEPT", ""))
    return HttpResponse(encoder(registry), content_type=content_type)


def metrics_snapshot() -> dict[str, Any]:
    """Unscoped numbers for /metrics (its access is checked by the view).

    ``{"depth": depth_counts(), "clusters": [Cluster], "checkpoints":
    [IngestCheckpoint], "usage": usage_by_project()}``.
    """
    from dashboards.models import IngestCheckpoint

    return {
        "depth": depth_counts(),
        "clusters": list(Cluster.objects.order_by("name")),
        "checkpoints": list(IngestCheckpoint.objects.select_related("cluster")),
        "usage": usage_by_project(),
    }
