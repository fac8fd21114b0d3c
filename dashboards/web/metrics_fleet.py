"""The fleet's metrics at ``/metrics`` beside ``web.metrics``'s: stage histograms, hosts, reservations, budgets.

Names follow Prometheus' "Metric and label naming" (prometheus.io/docs/practices/naming): the
``tco_`` prefix, base units in the name (``_seconds``, ``_usd`` for money), ``_total`` only on
counters, ``_ratio`` for 0..1; labels are bounded sets (cluster, cluster queue, project, state,
budget period), never a job, task or campaign id (a label value per job would make a series per
job; OCS 9.1's own exporter warns of the same). ``tests/db/test_prometheus_names.py`` runs
``promtool check metrics`` on the output.

| metric | type | labels | meaning |
|---|---|---|---|
| ``tco_queue_wait_seconds`` | histogram | cluster, queue | submission -> the runner's first timestamp (DESIGN.md "Stages") |
| ``tco_sandbox_start_seconds`` | histogram | cluster, queue | the sandbox asked for -> ready |
| ``tco_agent_run_seconds`` | histogram | cluster, queue | the agent started -> exited |
| ``tco_integration_overhead_seconds`` | histogram | cluster, queue | runner time that is neither sandbox start nor agent |
| ``tco_pending_oldest_seconds`` | gauge | cluster, queue | age of the oldest pending (not held) task |
| ``tco_hosts`` | gauge | cluster, state | execution hosts per state (``schedulers.hosts.HOST_STATES``; ``unreachable``: execd not heard from) |
| ``tco_reservations`` | gauge | cluster, project, state | advance reservations (qrstat), project "" when not booked through tco |
| ``tco_reservation_slots`` | gauge | cluster, project, state | their slots |
| ``tco_budget_usd`` | gauge | project, period | a team's budget |
| ``tco_budget_spent_usd`` | gauge | project, period | spent in the current period (the bill's spend) |
| ``tco_budget_period_elapsed_ratio`` | gauge | project, period | the part of the period gone (0..1) |

The histograms are cumulative over every task tco keeps (read from the database at each scrape):
``rate()``/``increase()`` give a window, ``histogram_quantile`` over the raw buckets the whole
history.
"""
from __future__ import annotations

from typing import Any

from django.utils import timezone
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily

from dashboards.billing.budgets import budget_burn_rates
from dashboards.core.stages import oldest_pending, stage_histograms
from dashboards.models import Cluster
from schedulers.hosts import HOST_STATES, host_states

#: stage -> (metric name, help). "agent work" is the agent's run.
STAGE_METRICS = {
    "queue_wait": ("tco_queue_wait_seconds", "Queue wait: the scheduler's submission to the runner's first timestamp"),
    "sandbox_start": ("tco_sandbox_start_seconds", "Sandbox start: the sandbox asked for to ready"),
    "agent_work": ("tco_agent_run_seconds", "Agent run: the agent started to exited"),
    "integration_overhead": ("tco_integration_overhead_seconds",
                             "Integration overhead: runner time that is neither sandbox start nor agent run"),
}


def fleet_snapshot() -> dict[str, Any]:
    """What :class:`FleetCollector` reports, read once per scrape (unscoped; the view checks access).

    ``{"now", "stages": core.stages.stage_histograms(), "pending": core.stages.oldest_pending(now),
    "clusters": [Cluster], "budgets": billing.budgets.budget_burn_rates(now=now)}``.
    """
    now = timezone.now()
    return {"now": now, "stages": stage_histograms(), "pending": oldest_pending(now),
            "clusters": list(Cluster.objects.order_by("name")), "budgets": budget_burn_rates(now=now)}


class FleetCollector:
    """A prometheus_client collector of the fleet's metrics (module docstring), one snapshot a scrape."""

    def collect(self):
        snap = fleet_snapshot()
        for stage, (name, help_text) in STAGE_METRICS.items():
            family = HistogramMetricFamily(name, help_text, labels=["cluster", "queue"])
            for row in snap["stages"][stage]:
                buckets = [(_le(bound), count) for bound, count in row["buckets"]] + [("+Inf", row["count"])]
                family.add_metric([row["cluster"], row["queue"]], buckets, row["sum"])
            yield family

        pending = GaugeMetricFamily("tco_pending_oldest_seconds", "Age of the oldest pending (not held) task",
                                    labels=["cluster", "queue"])
        for row in snap["pending"]:
            pending.add_metric([row["cluster"], row["queue"]], row["oldest_s"])
        yield pending

        hosts = GaugeMetricFamily("tco_hosts", "Execution hosts per state", labels=["cluster", "state"])
        reservations = GaugeMetricFamily("tco_reservations", "Advance reservations per state",
                                         labels=["cluster", "project", "state"])
        slots = GaugeMetricFamily("tco_reservation_slots", "Slots of the advance reservations per state",
                                  labels=["cluster", "project", "state"])
        for cluster in snap["clusters"]:
            status = cluster.status or {}
            if status.get("hosts") is not None:
                found = host_states(status.get("hosts") or [], status.get("queue_instances") or [])
                per_state = dict.fromkeys(HOST_STATES, 0)
                for host in found:
                    per_state[host["state"]] = per_state.get(host["state"], 0) + 1
                for state, n in per_state.items():
                    hosts.add_metric([cluster.name, state], n)
            if "reservations" in status:
                counts: dict[tuple[str, str], list[float]] = {}
                for ar in status.get("reservations") or []:
                    key = (str(ar.get("team") or ""), str(ar.get("state") or "unknown"))
                    entry = counts.setdefault(key, [0, 0])
                    entry[0] += 1
                    entry[1] += float(ar.get("slots") or 0)
                for (project, state), (n, n_slots) in sorted(counts.items()):
                    reservations.add_metric([cluster.name, project, state], n)
                    slots.add_metric([cluster.name, project, state], n_slots)
        yield from (hosts, reservations, slots)

        amount = GaugeMetricFamily("tco_budget_usd", "A team's budget per period", labels=["project", "period"])
        spent = GaugeMetricFamily("tco_budget_spent_usd", "Spent in the budget's current period",
                                  labels=["project", "period"])
        elapsed = GaugeMetricFamily("tco_budget_period_elapsed_ratio", "Part of the budget's period gone (0..1)",
                                    labels=["project", "period"])
        for row in snap["budgets"]:
            labels = [row["project"], row["period"]]
            amount.add_metric(labels, float(row["amount_usd"]))
            spent.add_metric(labels, float(row["spent_usd"]))
            elapsed.add_metric(labels, row["elapsed_ratio"])
        yield from (amount, spent, elapsed)


def _le(bound: float) -> str:
    """A bucket's upper bound as the ``le`` label (``0.5``, ``60``; Prometheus parses either)."""
    return repr(float(bound)) if bound != int(bound) else str(int(bound))
