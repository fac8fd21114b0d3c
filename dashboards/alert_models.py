"""Anomaly alerts (issue 25): what tco noticed about a team's tasks, campaigns or spend, kept once.

Imported by dashboards/models.py, so the model belongs to the ``dashboards`` app. Written only by
``dashboards.alerts.anomalies``; its ``key`` makes each alert once, whatever runs the check.
"""
from __future__ import annotations

from django.db import models


class AnomalyAlert(models.Model):
    """One anomaly, recorded once (``key``), shown to the team's leads and admins, mailed and posted.

    ``kind``: ``task_pending`` / ``task_running`` (a campaign's tasks waiting or running much
    longer than the history of the same queue and agent), ``campaign_failures`` (a burst of failed
    tasks), ``budget_burn`` (the spend rate exhausts a budget before its period ends).
    ``details``: the numbers the text says (JSON-ready: observed seconds, percentile, threshold,
    counts, dates). ``starts_at``: when the anomaly began (the Alertmanager ``startsAt``).
    """

    KINDS = [("task_pending", "tasks pending longer than usual"),
             ("task_running", "tasks running longer than usual"),
             ("campaign_failures", "a burst of failed tasks"),
             ("budget_burn", "a budget spent before its period ends")]
    SEVERITIES = [("warning", "warning"), ("critical", "critical")]

    key = models.CharField(max_length=160, unique=True)
    kind = models.CharField(max_length=20, choices=KINDS)
    severity = models.CharField(max_length=8, choices=SEVERITIES, default="warning")
    team = models.ForeignKey("dashboards.Team", on_delete=models.CASCADE, related_name="anomaly_alerts")
    campaign = models.ForeignKey("dashboards.Campaign", null=True, blank=True, on_delete=models.CASCADE,
                                 related_name="anomaly_alerts")
    task = models.ForeignKey("dashboards.Task", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    budget = models.ForeignKey("dashboards.Budget", null=True, blank=True, on_delete=models.CASCADE,
                               related_name="anomaly_alerts")
    title = models.CharField(max_length=200)
    text = models.TextField()
    details = models.JSONField(default=dict, blank=True)
    starts_at = models.DateTimeField()
    at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        app_label = "dashboards"
        ordering = ["-at", "-id"]

    def __str__(self) -> str:
        return f"{self.kind}: {self.title}"
