"""A team's members and budgets: each user's role in a team, and the team's spending limits.

Imported by dashboards/models.py, so the models belong to the ``dashboards`` app (``from
dashboards.models import Membership, Budget, BudgetAlert``); ``Role``, the roles' choices, is read
from here. Who may do what with a role: ``dashboards.core.roles``; budgets checked and alerted:
``dashboards.billing.budgets``.
"""
from __future__ import annotations

from django.conf import settings
from django.db import models


class Role(models.TextChoices):
    """What a user may do; each role includes the ones before it, admin includes all.

    ``lead`` (team lead) reads bills and sets budgets; ``launcher`` launches
    campaigns; ``urgent`` (urgent launcher) also launches urgent agents.
    """

    VIEWER = "viewer", "viewer"
    LEAD = "lead", "team lead"
    LAUNCHER = "launcher", "launcher"
    URGENT = "urgent", "urgent launcher"


class Membership(models.Model):
    """A user's role in one team (the team's Django group holds the same users)."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    team = models.ForeignKey("dashboards.Team", on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=10, choices=Role.choices, default=Role.VIEWER)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["user", "team"], name="one_role_per_team")]


class Budget(models.Model):
    """A team's spending limit per period, with alert thresholds (fractions of ``amount_usd``)."""

    PERIODS = [("day", "day"), ("week", "week"), ("month", "month")]
    ON_EXCEED = [("refuse", "refuse the launch"), ("hold", "submit on hold")]

    team = models.ForeignKey("dashboards.Team", on_delete=models.CASCADE, related_name="budgets")
    period = models.CharField(max_length=5, choices=PERIODS, default="month")
    amount_usd = models.DecimalField(max_digits=12, decimal_places=2)
    thresholds = models.JSONField(default=list, help_text="e.g. [0.5, 0.8, 1.0]")
    on_exceed = models.CharField(max_length=6, choices=ON_EXCEED, default="refuse")
    alert_emails = models.TextField(blank=True, help_text="one address per line")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["team", "period"], name="one_budget_per_period")]


class BudgetAlert(models.Model):
    """A threshold crossed in one period; sent once."""

    budget = models.ForeignKey(Budget, on_delete=models.CASCADE, related_name="alerts")
    period_start = models.DateField()
    threshold = models.DecimalField(max_digits=5, decimal_places=3)
    spent_usd = models.DecimalField(max_digits=14, decimal_places=6)
    at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["budget", "period_start", "threshold"], name="alert_once")]
