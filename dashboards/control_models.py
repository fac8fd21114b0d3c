"""The audit log of every action, and the control requests the submit worker runs.

Imported by dashboards/models.py, so the models belong to the ``dashboards`` app (``from
dashboards.models import AuditEntry, ControlRequest``); ``ControlState`` and
``CONTROL_TRANSITIONS``, a control request's states and their moves, are read from here (moved
only through ``dashboards.models.transition``). Written by ``dashboards.core.audit`` and
``dashboards.control.actions``.
"""
from __future__ import annotations

from django.conf import settings
from django.db import models


class ControlState(models.TextChoices):
    """A control request's state; the allowed moves are :data:`CONTROL_TRANSITIONS`."""

    QUEUED = "queued", "queued for the submit worker"
    CLAIMED = "claimed", "being run by the submit worker"
    DONE = "done", "done"
    FAILED = "failed", "refused by the scheduler"
    GIVEN_UP = "given_up", "given up (scheduler unreachable)"


CONTROL_TRANSITIONS: dict[str, frozenset[str]] = {
    ControlState.QUEUED: frozenset({ControlState.CLAIMED, ControlState.GIVEN_UP}),
    ControlState.CLAIMED: frozenset({ControlState.QUEUED, ControlState.DONE, ControlState.FAILED,
                                     ControlState.GIVEN_UP}),
    ControlState.DONE: frozenset(),
    ControlState.FAILED: frozenset(),
    ControlState.GIVEN_UP: frozenset(),
}


class AuditEntry(models.Model):
    """Every launch and control action: who, what, when, result."""

    at = models.DateTimeField(auto_now_add=True, db_index=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL)
    action = models.CharField(max_length=32)
    target = models.CharField(max_length=128, blank=True)
    params = models.JSONField(default=dict, blank=True)
    ok = models.BooleanField()
    result = models.TextField(blank=True)


class ControlRequest(models.Model):
    """A control action (cancel, pause, resume, triage) waiting for, or run by, the submit worker.

    Written with its audit entry at the request; the worker claims it
    (queued -> claimed), runs the scheduler's control command and records the
    result (done or failed); ``given_up`` when the scheduler stayed
    unreachable. A claim that outlives its worker goes back to queued
    (control.reconcile_control_requests).
    """

    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL)
    audit = models.ForeignKey(AuditEntry, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="control_requests")
    cluster = models.ForeignKey("dashboards.Cluster", on_delete=models.CASCADE)
    campaign = models.ForeignKey("dashboards.Campaign", null=True, blank=True, on_delete=models.CASCADE,
                                 related_name="control_requests")
    action = models.CharField(max_length=32, help_text="campaign_cancel, triage_hold, ...")
    control = models.CharField(max_length=16, help_text="the scheduler's action: hold, release, delete, ...")
    job_number = models.PositiveIntegerField()
    tasks = models.JSONField(null=True, blank=True, help_text="task ranges [[a, b], ...]; null: the whole job")
    priority = models.SmallIntegerField(null=True, blank=True)
    state = models.CharField(max_length=10, choices=ControlState.choices, default=ControlState.QUEUED,
                             db_index=True)
    claimed_at = models.DateTimeField(null=True, blank=True)
    claimed_by = models.CharField(max_length=128, blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    finished_at = models.DateTimeField(null=True, blank=True)
    result = models.TextField(blank=True)

    @property
    def ok(self) -> bool:
        return self.state == ControlState.DONE

    def __str__(self) -> str:
        return f"{self.action} job {self.job_number} ({self.state})"
