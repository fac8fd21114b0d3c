"""Advance reservations booked through tco (issue 17): which team and which tco user booked each.

Grid Engine knows a reservation's owner only as the submit account (``tco``);
this record keeps the team it was booked for and the tco user who booked it,
so the queue page can say who booked it and the launch form can offer a team
its own reservations (and refuse another team's).
"""
from __future__ import annotations

from django.conf import settings
from django.db import models


class Reservation(models.Model):
    """One advance reservation booked from tco: ``ar_id`` is qrsub's id on ``cluster``.

    ``start_at``/``end_at`` and the booked ``queue``, ``slots``, ``pe`` and
    ``seats`` are what was asked (qrstat shows what was granted).
    ``deleted_at`` is set when tco deleted it (qrdel).
    """

    cluster = models.ForeignKey("dashboards.Cluster", on_delete=models.CASCADE, related_name="reservations")
    ar_id = models.PositiveIntegerField(help_text="the advance reservation id qrsub gave")
    team = models.ForeignKey("dashboards.Team", on_delete=models.PROTECT, related_name="reservations")
    booked_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL,
                                  related_name="+")
    name = models.CharField(max_length=64)
    queue = models.CharField(max_length=64)
    slots = models.PositiveIntegerField(default=1)
    pe = models.CharField(max_length=64, blank=True, default="")
    seats = models.PositiveIntegerField(default=0, help_text="consumable seats reserved (anthropic_api)")
    start_at = models.DateTimeField()
    end_at = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["cluster", "ar_id", "created_at"],
                                               name="reservation_cluster_ar_created")]
        ordering = ["start_at", "ar_id"]

    def __str__(self) -> str:
        return f"AR {self.ar_id} ({self.team_id}) {self.name}"
