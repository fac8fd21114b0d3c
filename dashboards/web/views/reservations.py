"""The reservations page (issue 17): a launcher books capacity for a team (``qrsub``) and sees
and deletes the team's advance reservations. Role-checked like the launch page (``launch`` on
a team), audited by :mod:`dashboards.reservations`.
"""
from __future__ import annotations

import datetime as dt

from django import forms
from django.conf import settings
from django.core.validators import MaxValueValidator
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils import timezone
from django.views.decorators.http import require_http_methods, require_POST

from dashboards.core.clusters import cluster_get_default
from dashboards.core.errors import ActionRefused, LaunchError, Refused
from dashboards.core.roles import is_admin, request_can, teams_with
from dashboards.launch import reservations as launch_reservations
from dashboards.web.views.common import refused

#: Longest booking from the page (seconds): one week, as the adapter allows.
MAX_DURATION_MIN = 7 * 24 * 60


class ReservationForm(forms.Form):
    """Team, name, start (UTC), duration (minutes), queue, slots, seats."""

    team = forms.ModelChoiceField(queryset=None, empty_label=None)
    name = forms.RegexField(regex=r"^[A-Za-z][A-Za-z0-9_.-]{0,63}$", max_length=64, label="reservation name",
                            help_text="a letter, then letters, digits, '_', '.', '-'",
                            error_messages={"invalid": "a letter first, then letters, digits, '_', '.', '-'"})
    start = forms.DateTimeField(label="start (UTC)", input_formats=["%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M",
                                                                    "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S"],
                                widget=forms.DateTimeInput(attrs={"type": "datetime-local", "step": 1}),
                                help_text="YYYY-MM-DD HH:MM, in UTC")
    duration_min = forms.IntegerField(min_value=1, max_value=MAX_DURATION_MIN, initial=60, label="duration (minutes)")
    queue = forms.ChoiceField(choices=(), help_text="a queue restricted to projects (agent.q on the dev cluster) "
                                                     "cannot be reserved on SGE 8.1.9: its qrsub has no -P")
    slots = forms.IntegerField(min_value=1, max_value=1000, initial=1,
                               help_text=f"job slots; more than 1 uses the parallel environment "
                                         f"{launch_reservations.RESERVATION_PE}")
    seats = forms.IntegerField(min_value=0, max_value=10000, initial=1,
                               label=f"seats ({settings.TCO_SEAT_RESOURCE})",
                               help_text="model API seats held for the reservation's jobs")

    def __init__(self, *args, user, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.user = user
        self.fields["team"].queryset = teams_with(user, "launch").order_by("name")
        self.fields["queue"].choices = [(q, q) for q in settings.TCO_QUEUES]
        if not is_admin(user):
            # A launcher's booking is bounded by the team's caps (the service checks them again,
            # with the team's other bookings): the fields say so before anything is sent.
            caps = launch_reservations.TeamCaps.from_settings()
            for name, cap, setting in (("seats", caps.seats, "TCO_RESERVATION_TEAM_MAX_SEATS"),
                                       ("slots", caps.slots, "TCO_RESERVATION_TEAM_MAX_SLOTS")):
                self._bound(name, cap, f"at most {cap} for a team at any moment ({setting})")
            longest = min(caps.longest_s, caps.total_s) // 60
            self._bound("duration_min", longest, f"at most {longest} min for a launcher")

    def _bound(self, name: str, cap: int, text: str) -> None:
        field = self.fields[name]
        cap = min(cap, field.max_value) if field.max_value is not None else cap
        field.max_value = cap
        field.validators = [v for v in field.validators if not isinstance(v, MaxValueValidator)]
        field.validators.append(MaxValueValidator(cap))
        field.widget.attrs["max"] = cap
        field.help_text = f"{field.help_text}; {text}" if field.help_text else text

    def clean_start(self) -> dt.datetime:
        value = self.cleaned_data["start"]
        # The form's times are UTC whatever the site's zone (the field says so); Django made the
        # wall-clock input aware in the current zone, so it is read again as UTC.
        if timezone.is_aware(value):
            value = timezone.make_naive(value, timezone.get_current_timezone())
        value = value.replace(tzinfo=dt.timezone.utc)
        if value < timezone.now() - dt.timedelta(minutes=1):
            raise forms.ValidationError("the start is in the past")
        return value

    def book_request(self) -> launch_reservations.BookRequest:
        data = self.cleaned_data
        return launch_reservations.BookRequest(team=data["team"], name=data["name"], start=data["start"],
                                        duration_s=data["duration_min"] * 60, queue=data["queue"],
                                        slots=data["slots"], seats=data["seats"])


@login_required
@require_http_methods(["GET", "POST"])
def reservations_page(request: HttpRequest) -> HttpResponse:
    """GET: the form and the reservations the user may see; POST: book one (then back here)."""
    if not request_can(request, "launch"):
        return refused(request, "Booking reservations is for launchers of a team.", action="reservation_book")
    cluster = cluster_get_default()
    if request.method == "POST":
        form = ReservationForm(request.POST, user=request.user)
        if form.is_valid():
            try:
                booked = launch_reservations.book(user=request.user, request=form.book_request(), cluster=cluster)
            except Refused as exc:
                form.add_error(None, str(exc))
            else:
                messages.success(request, f"Advance reservation {booked.ar_id} ({booked.name}) booked for team "
                                          f"{booked.team.name}.")
                return redirect("ops-reservations")
    else:
        start = (timezone.now() + dt.timedelta(minutes=10)).astimezone(dt.timezone.utc).replace(second=0,
                                                                                                microsecond=0)
        form = ReservationForm(user=request.user, initial={"start": start.strftime("%Y-%m-%dT%H:%M"),
                                                           "queue": "classic.q"})
    cluster.refresh_from_db()
    caps = launch_reservations.TeamCaps.from_settings()
    caps_text = (f"A team's launchers may hold at most {caps.seats} model API seats and {caps.slots} slots in "
                 f"reservations at any moment, {caps.total_s / 3600:g} h of reservations not yet ended, each "
                 f"at most {caps.longest_s / 3600:g} h long and starting at most {caps.lead_s / 3600:g} h ahead; "
                 "admins may book above these.")
    return render(request, "dashboards/reservations.html", {
        "form": form, "rows": launch_reservations.rows_for(request.user, cluster), "now": timezone.now(),
        "error": (cluster.status or {}).get("reservations_error", ""),
        "holders": launch_reservations.holders(cluster), "seat_resource": settings.TCO_SEAT_RESOURCE,
        "caps_text": caps_text})


@login_required
@require_POST
def reservation_delete_view(request: HttpRequest, ar_id: int) -> HttpResponse:
    """Delete one reservation (launchers of its team, admins); audited either way."""
    try:
        launch_reservations.delete(user=request.user, cluster=cluster_get_default(), ar_id=ar_id)
    except ActionRefused as exc:
        return refused(request, str(exc))
    except LaunchError as exc:
        messages.error(request, str(exc))
    else:
        messages.success(request, f"Advance reservation {ar_id} deleted.")
    return redirect("ops-reservations")
