"""Advance reservations (issue 17): booking capacity for a team, listing and deleting reservations,
and the reservation parts of the cluster's status poll.

A launcher of a team books a reservation (``qrsub``: start, duration, queue,
slots, the consumable seats) for that team with :func:`book`; it is recorded
as a :class:`~dashboards.models.Reservation` (team, tco user) and audited
(action ``reservation_book``; ``reservation_delete`` for :func:`delete`), a
refusal too. The status poll stores ``qrstat``'s list in
``Cluster.status["reservations"]`` (:func:`poll_status`), which the queue
page (:func:`rows_for`), the pending reasons and the MCP assistant read.
Nothing here reaches a shell: the adapter builds a qrsub argv from validated
fields (``schedulers.gridengine.commands.reservation_submit_argv``).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Count
from django.utils import timezone

from dashboards.core import clusters as core_clusters
from dashboards.core.audit import audit, refused
from dashboards.core.errors import LaunchError
from dashboards.core.roles import teams_with, user_can
from dashboards.ingest.reservations import parse_reservation_rows, refresh_status
from dashboards.models import Cluster, Reservation, Task, Team
from schedulers.base import InvalidSubmission, ReservationSpec, SchedulerError

#: The parallel environment multi-slot reservations use (scripts/dev-cluster makes it).
RESERVATION_PE = getattr(settings, "TCO_RESERVATION_PE", "smp")


@dataclasses.dataclass
class BookRequest:
    """What a launcher books: ``start`` (aware), ``duration_s`` (seconds), ``queue`` (one of
    ``TCO_QUEUES``), ``slots`` (over 1 uses the PE ``RESERVATION_PE``), ``seats`` (the seat
    consumable, ``TCO_SEAT_RESOURCE``) and ``name`` (the AR name)."""

    team: Team
    name: str
    start: dt.datetime
    duration_s: int
    queue: str = "agent.q"
    slots: int = 1
    seats: int = 0

    def audit_params(self) -> dict[str, Any]:
        return {"team": self.team.project, "name": str(self.name)[:64], "queue": str(self.queue)[:64],
                "start": self.start.isoformat() if isinstance(self.start, dt.datetime) else str(self.start)[:40],
                "duration_s": self.duration_s, "slots": self.slots, "seats": self.seats}


def book(*, user: AbstractBaseUser, request: BookRequest, cluster: Cluster | None = None,
         scheduler=None) -> Reservation:
    """Book ``request`` for ``user`` (``launch`` capability on the team, like a launch).

    Returns the recorded Reservation (``ar_id`` from qrsub). Raises ActionRefused
    (role) and LaunchError (bad field, a launcher's booking longer than
    ``TCO_RESERVATION_MAX_S`` seconds, or the scheduler refused: "no suitable
    queues", limit reached …; the scheduler's message is kept); each is
    audited and nothing is recorded.
    """
    action, target, params = "reservation_book", f"team:{request.team.project}", request.audit_params()
    if not user_can(user, "launch", request.team):
        raise refused(user, action, target, params,
                      f"you may not book reservations for team {request.team.name}")
    cluster = cluster or core_clusters.cluster_get_default()
    slots = request.slots
    spec = ReservationSpec(name=str(request.name).strip(), start=request.start, duration_s=request.duration_s,
                           queue=request.queue, slots=slots, pe=RESERVATION_PE if slots and slots > 1 else None,
                           seats=request.seats, seat_resource=settings.TCO_SEAT_RESOURCE)
    scheduler = scheduler or core_clusters.scheduler_for(cluster, timeout=20)
    try:
        if request.queue not in settings.TCO_QUEUES:
            raise InvalidSubmission(f"queue {request.queue!r} is not one of {', '.join(settings.TCO_QUEUES)}")
        longest = settings.TCO_RESERVATION_MAX_S
        if not user.is_staff and isinstance(request.duration_s, int) and request.duration_s > longest:
            raise InvalidSubmission(f"duration: at most {longest} s ({longest / 3600:g} h) for a launcher "
                                    "(TCO_RESERVATION_MAX_S): a reservation holds its slots and seats from "
                                    "every other team; an admin may book longer")
        ar_id = scheduler.reservation_submit(spec)
    except InvalidSubmission as exc:
        raise refused(user, action, target, params, str(exc), error=LaunchError) from None
    except SchedulerError as exc:
        message = getattr(exc, "stderr", "") or str(exc)
        raise refused(user, action, target, params, f"the scheduler refused the reservation: {message[:500]}",
                      error=LaunchError) from None
    start = spec.start.astimezone(dt.timezone.utc).replace(microsecond=0)
    with transaction.atomic():
        reservation = Reservation.objects.create(
            cluster=cluster, ar_id=ar_id, team=request.team, booked_by=user, name=spec.name, queue=spec.queue,
            slots=slots, pe=spec.pe or "", seats=spec.seats, start_at=start,
            end_at=start + dt.timedelta(seconds=spec.duration_s))
        audit(user=user, action=action, target=f"reservation:{ar_id}", params={**params, "status": "done"},
              ok=True, result=f"advance reservation {ar_id} granted")
    refresh_status(cluster, scheduler)
    return reservation


def delete(*, user: AbstractBaseUser, cluster: Cluster, ar_id: int, scheduler=None) -> None:
    """Delete advance reservation ``ar_id`` (``qrdel``; its jobs are deleted with it).

    Allowed to a launcher of the team it was booked for, and to admins (also
    for reservations tco did not book). Raises ActionRefused, LaunchError
    (the scheduler refused); both audited.
    """
    action, target, params = "reservation_delete", f"reservation:{ar_id}", {"ar_id": ar_id}
    record = booking(cluster, ar_id)
    team = record.team if record else None
    if not (user_can(user, "launch", team) if team is not None else user_can(user, "triage")):
        raise refused(user, action, target, params, f"you may not delete advance reservation {ar_id}")
    scheduler = scheduler or core_clusters.scheduler_for(cluster, timeout=20)
    try:
        scheduler.reservation_delete(ar_id)
    except (InvalidSubmission, SchedulerError) as exc:
        message = getattr(exc, "stderr", "") or str(exc)
        raise refused(user, action, target, params, f"qrdel refused: {message[:500]}", error=LaunchError) from None
    if record is not None:
        Reservation.objects.filter(pk=record.pk).update(deleted_at=timezone.now())
    audit(user=user, action=action, target=target, params={**params, "status": "done"}, ok=True,
          result=f"advance reservation {ar_id} deleted")
    refresh_status(cluster, scheduler)


def booking(cluster: Cluster, ar_id: int) -> Reservation | None:
    """tco's newest booking of ``ar_id`` on ``cluster`` that was not deleted (ids are reused
    after 9999999), or None when tco did not book it."""
    return (Reservation.objects.filter(cluster=cluster, ar_id=ar_id, deleted_at__isnull=True)
            .select_related("team", "booked_by").order_by("-created_at").first())


def check_launch_into(*, user: AbstractBaseUser, team: Team, ar_id: int | None,
                      cluster: Cluster | None = None) -> None:
    """A launch with ``-ar ar_id`` for ``team``: refused (LaunchError) when tco booked that
    reservation for another team. A reservation tco did not book is left to the scheduler
    (qsub refuses a job whose owner is not in the reservation's ``-u`` list)."""
    if ar_id is None:
        return
    record = booking(cluster or core_clusters.cluster_get_default(), ar_id)
    if record is not None and record.team_id != team.pk:
        raise LaunchError(f"advance reservation {ar_id} was booked for team {record.team.name}, "
                          f"not {team.name}")


def team_choices(user: AbstractBaseUser, cluster: Cluster | None = None) -> list[tuple[int, str]]:
    """The reservations a launcher may launch into: ``[(ar_id, label)]`` of bookings of teams the
    user may launch for, not deleted and not ended, by start."""
    cluster = cluster or core_clusters.cluster_get_default()
    rows = (Reservation.objects.filter(cluster=cluster, deleted_at__isnull=True, end_at__gt=timezone.now(),
                                       team__in=teams_with(user, "launch"))
            .select_related("team").order_by("start_at", "ar_id"))
    return [(r.ar_id, f"{r.ar_id} {r.name} ({r.team.name}, {r.start_at.astimezone(dt.timezone.utc):%Y-%m-%d %H:%M} UTC "
                      f"for {_duration_text((r.end_at - r.start_at).total_seconds())})") for r in rows]


def _duration_text(seconds: float) -> str:
    minutes = int(seconds // 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min"


def reservation_context(status: dict) -> dict:
    """``explain_pending``'s reservation arguments from a stored cluster status:
    ``{"reservations", "reserving_jobs", "queue_instances"}`` (None where the poll has none)."""
    return {"reservations": status.get("reservations"), "reserving_jobs": status.get("reserving_jobs"),
            "queue_instances": status.get("queue_instances")}


# --------------------------------------------------------------------------- queue page

def rows_for(user: AbstractBaseUser, cluster: Cluster) -> list[dict]:
    """The reservations ``user`` may see on the queue page: a team's booking for viewers of that
    team, every reservation for admins. Each row: the poll's fields plus ``team_name``,
    ``used_slots`` (running tasks of campaigns launched into it), ``used_seats`` (those tasks'
    seats) and ``seats`` (the seat consumable it holds, int)."""
    from dashboards.core.roles import is_admin

    status = cluster.status or {}
    rows = status.get("reservations") or []
    visible = None if is_admin(user) else set(teams_with(user, "view").values_list("project", flat=True))
    teams = dict(Team.objects.values_list("project", "name"))
    seat = settings.TCO_SEAT_RESOURCE
    ids = [r["id"] for r in rows]
    used = {}
    for row in (Task.objects.filter(cluster=cluster, active=True, state__in=("running", "suspended"),
                                    campaign__advance_reservation__in=ids)
                .values("campaign__advance_reservation", "campaign__seats_per_task")
                .annotate(n=Count("id"))):
        entry = used.setdefault(row["campaign__advance_reservation"], [0, 0])
        entry[0] += row["n"]
        entry[1] += row["n"] * (row["campaign__seats_per_task"] or 0)
    out = []
    for row in rows:
        if visible is not None and row.get("team") not in visible:
            continue
        seats = row.get("resources", {}).get(seat)
        try:
            seats = int(float(seats)) if seats not in (None, "") else 0
        except ValueError:
            seats = 0
        slots_used, seats_used = used.get(row["id"], [0, 0])
        out.append({**row, "team_name": teams.get(row.get("team") or "", row.get("team") or ""),
                    "start_at": parse_reservation_rows(row.get("start_at")), "end_at": parse_reservation_rows(row.get("end_at")),
                    "seats": seats, "used_slots": slots_used, "used_seats": seats_used,
                    "queue_names": ", ".join(sorted({q.get("queue_instance", "") for q in row.get("queues") or []}))})
    return out
