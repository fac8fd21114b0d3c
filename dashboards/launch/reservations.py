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

A team's launchers book within the team's caps (:func:`cap_problems`, issue 23
finding 2): model API seats and slots held at any moment, reserved time of the
team's reservations not yet ended, and how far ahead a booking may start
(``TCO_RESERVATION_TEAM_MAX_SEATS``, ``..._MAX_SLOTS``, ``..._MAX_TOTAL_S``,
``TCO_RESERVATION_MAX_LEAD_S``); admins may book above them. The caps are
checked before ``qrsub`` and again, with the team's row locked, before the
booking is recorded: of two bookings racing past the first check, the one
that would break a cap is deleted again (``qrdel``) and refused. The queue
page shows every user who holds reserved seats (:func:`holders`).
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import logging
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import Count, F
from django.utils import timezone

from dashboards.core import clusters as core_clusters
from dashboards.core.audit import audit, refused
from dashboards.core.errors import LaunchError
from dashboards.core.roles import is_admin, teams_with, user_can
from dashboards.core.scope import tasks_visible_to, visible_team_ids
from dashboards.ingest.reservations import parse_reservation_rows, refresh_status
from dashboards.models import Cluster, Reservation, Task, Team
from schedulers.base import InvalidSubmission, ReservationSpec, SchedulerError
from schedulers.durations import hours_minutes_text

log = logging.getLogger(__name__)

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


@dataclasses.dataclass(frozen=True)
class TeamCaps:
    """What one team may hold through reservations its launchers book (settings, module doc):
    ``seats`` and ``slots`` at any moment, ``total_s`` reserved seconds of its reservations not yet
    ended (summed), ``lead_s`` how far ahead a booking may start, ``longest_s`` one booking's
    duration (``TCO_RESERVATION_MAX_S``)."""

    seats: int
    slots: int
    total_s: int
    lead_s: int
    longest_s: int

    @classmethod
    def from_settings(cls) -> "TeamCaps":
        return cls(seats=settings.TCO_RESERVATION_TEAM_MAX_SEATS, slots=settings.TCO_RESERVATION_TEAM_MAX_SLOTS,
                   total_s=settings.TCO_RESERVATION_TEAM_MAX_TOTAL_S, lead_s=settings.TCO_RESERVATION_MAX_LEAD_S,
                   longest_s=settings.TCO_RESERVATION_MAX_S)


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:g} h"


def _utc_text(when: dt.datetime) -> str:
    return f"{when.astimezone(dt.timezone.utc):%Y-%m-%d %H:%M} UTC"


def _peak(bookings: list[tuple[dt.datetime, dt.datetime, int]], start: dt.datetime,
          end: dt.datetime) -> tuple[int, dt.datetime]:
    """The most of ``bookings`` (``[(start, end, amount)]``) held at one moment of ``[start, end)``,
    and the first moment it is held."""
    moments = sorted({start, *(b for b, e, _ in bookings if start < b < end)})
    best, when = 0, start
    for moment in moments:
        held = sum(n for b, e, n in bookings if b <= moment < e)
        if held > best:
            best, when = held, moment
    return best, when


def cap_problems(*, cluster: Cluster, team: Team, start: dt.datetime, duration_s: int, slots: int, seats: int,
                 now: dt.datetime | None = None, caps: TeamCaps | None = None) -> list[str]:
    """Every cap of ``team`` that a booking (``start``, ``duration_s``, ``slots``, ``seats``) would
    break, beside the team's other bookings on ``cluster`` that are neither deleted nor ended; each
    problem in words, naming its setting. ``[]``: it fits."""
    caps = caps or TeamCaps.from_settings()
    now = now or timezone.now()
    end = start + dt.timedelta(seconds=duration_s)
    problems = []
    if start - now > dt.timedelta(seconds=caps.lead_s):
        problems.append(f"start: at most {_hours(caps.lead_s)} ahead (TCO_RESERVATION_MAX_LEAD_S); this one starts "
                        f"in {_hours(round((start - now).total_seconds() / 360) * 360)}")
    booked = list(Reservation.objects.filter(cluster=cluster, team=team, deleted_at__isnull=True, end_at__gt=now)
                  .values_list("start_at", "end_at", "slots", "seats"))
    reserved = sum((e - max(b, now)).total_seconds() for b, e, _, _ in booked)
    if reserved + duration_s > caps.total_s:
        problems.append(f"team {team.name} would have {_hours(reserved + duration_s)} of reservations not yet "
                        f"ended ({_hours(reserved)} booked before this one); a team may have at most "
                        f"{_hours(caps.total_s)} (TCO_RESERVATION_TEAM_MAX_TOTAL_S)")
    for what, amount, cap, setting, index in (
            (f"model API seats ({settings.TCO_SEAT_RESOURCE})", seats, caps.seats, "TCO_RESERVATION_TEAM_MAX_SEATS", 3),
            ("slots", slots, caps.slots, "TCO_RESERVATION_TEAM_MAX_SLOTS", 2)):
        if not amount:
            continue
        held, when = _peak([(row[0], row[1], row[index]) for row in booked], start, end)
        if held + amount > cap:
            problems.append(f"team {team.name} would hold {held + amount} {what} at {_utc_text(when)} "
                            f"({held} in its other reservations then); a team may hold at most {cap} at any "
                            f"moment ({setting})")
    return problems


def book(*, user: AbstractBaseUser, request: BookRequest, cluster: Cluster | None = None,
         scheduler=None) -> Reservation:
    """Book ``request`` for ``user`` (``launch`` capability on the team, like a launch).

    Returns the recorded Reservation (``ar_id`` from qrsub). Raises ActionRefused
    (role) and LaunchError (bad field, a launcher's booking longer than
    ``TCO_RESERVATION_MAX_S`` seconds or past one of the team's caps,
    :func:`cap_problems`, or the scheduler refused: "no suitable queues",
    limit reached …; the scheduler's message is kept); each is audited and
    nothing is recorded (nor left booked at the scheduler).
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
    capped = not is_admin(user)
    checkable = (isinstance(spec.start, dt.datetime) and spec.start.tzinfo is not None
                 and all(isinstance(v, int) and not isinstance(v, bool) for v in (spec.duration_s, slots, spec.seats)))

    def over_caps() -> list[str]:
        if not (capped and checkable):
            return []
        return cap_problems(cluster=cluster, team=request.team, start=spec.start, duration_s=spec.duration_s,
                            slots=slots or 0, seats=spec.seats or 0)

    try:
        if request.queue not in settings.TCO_QUEUES:
            raise InvalidSubmission(f"queue {request.queue!r} is not one of {', '.join(settings.TCO_QUEUES)}")
        longest = settings.TCO_RESERVATION_MAX_S
        if capped and isinstance(request.duration_s, int) and request.duration_s > longest:
            raise InvalidSubmission(f"duration: at most {longest} s ({longest / 3600:g} h) for a launcher "
                                    "(TCO_RESERVATION_MAX_S): a reservation holds its slots and seats from "
                                    "every other team; an admin may book longer")
        problems = over_caps()
        if problems:
            raise InvalidSubmission("; ".join(problems) + ". A reservation holds its slots and seats from every "
                                                          "other team; an admin may book above the caps")
        ar_id = scheduler.reservation_submit(spec)
    except InvalidSubmission as exc:
        raise refused(user, action, target, params, str(exc), error=LaunchError) from None
    except SchedulerError as exc:
        message = getattr(exc, "stderr", "") or str(exc)
        raise refused(user, action, target, params, f"the scheduler refused the reservation: {message[:500]}",
                      error=LaunchError) from None
    start = spec.start.astimezone(dt.timezone.utc).replace(microsecond=0)
    with transaction.atomic():
        # The team's bookings one at a time from here (its row locked: PostgreSQL's row lock,
        # SQLite's write lock), so two bookings racing past the check above cannot both stay.
        Team.objects.filter(pk=request.team.pk).update(name=F("name"))
        late = over_caps()
        if not late:
            reservation = Reservation.objects.create(
                cluster=cluster, ar_id=ar_id, team=request.team, booked_by=user, name=spec.name, queue=spec.queue,
                slots=slots, pe=spec.pe or "", seats=spec.seats, start_at=start,
                end_at=start + dt.timedelta(seconds=spec.duration_s))
            audit(user=user, action=action, target=f"reservation:{ar_id}", params={**params, "status": "done"},
                  ok=True, result=f"advance reservation {ar_id} granted")
    if late:
        try:
            scheduler.reservation_delete(ar_id)
        except (InvalidSubmission, SchedulerError) as exc:
            log.error("advance reservation %s over team %s's caps could not be deleted: %s", ar_id,
                      request.team.project, exc)
        refresh_status(cluster, scheduler)
        raise refused(user, action, target, params, "; ".join(late) + " (another booking of the team was recorded "
                                                                    "first; this one was deleted again)",
                      error=LaunchError)
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
                      f"for {hours_minutes_text((r.end_at - r.start_at).total_seconds(), unit='min')})") for r in rows]


def reservation_context(status: dict, *, cluster: Cluster | None = None, user=None) -> dict:
    """``explain_pending``'s reservation arguments from a stored cluster status:
    ``{"reservations", "reserving_jobs", "queue_instances"}`` (None where the poll has none).

    With ``user`` (and the status's ``cluster``), a reserving ``-R y`` job the user may not see keeps
    its slots and queues but loses its number, owner and name (``job_number`` None): a team member
    reads "reserved for another team's job", never another team's job number. Without ``user`` (the
    admins' triage) the numbers stay.
    """
    jobs = status.get("reserving_jobs")
    if jobs and user is not None and cluster is not None and visible_team_ids(user) is not None:
        numbers = {j.get("job_number") for j in jobs}
        seen = set(tasks_visible_to(user).filter(cluster=cluster, job_number__in=numbers)
                   .values_list("job_number", flat=True).distinct())
        jobs = [j if j.get("job_number") in seen else
                {**j, "job_number": None, "owner": "", "name": ""} for j in jobs]
    return {"reservations": status.get("reservations"), "reserving_jobs": jobs,
            "queue_instances": status.get("queue_instances")}


# --------------------------------------------------------------------------- queue page

def _seats_of(row: dict) -> int:
    seats = (row.get("resources") or {}).get(settings.TCO_SEAT_RESOURCE)
    try:
        return int(float(seats)) if seats not in (None, "") else 0
    except (TypeError, ValueError):
        return 0


def _slots_of(row: dict) -> int:
    slots = row.get("slots")
    if isinstance(slots, int) and not isinstance(slots, bool):
        return slots
    return sum(q.get("slots") or 0 for q in row.get("queues") or [])


def holders(cluster: Cluster, now: dt.datetime | None = None) -> list[dict]:
    """Who holds reserved model API seats and slots on ``cluster``, for every user (a team that books
    the cluster's seats must be seen by the others; issue 23, finding 2). From the last poll of
    ``qrstat`` (what the scheduler granted), one row per holder: a team (tco's bookings) or the
    owner of a reservation booked outside tco, ``{"holder", "team": bool, "seats_now", "slots_now",
    "seats_peak", "slots_peak", "reservations", "until"}``: held now, the most held at one moment
    from now on, how many reservations, and when the last one ends. Only totals: no names or times
    of another team's reservations. Sorted by most seats held."""
    now = now or timezone.now()
    teams = dict(Team.objects.values_list("project", "name"))
    groups: dict[tuple[bool, str], list[tuple[dt.datetime, dt.datetime, int, int]]] = {}
    for row in (cluster.status or {}).get("reservations") or []:
        start, end = parse_reservation_rows(row.get("start_at")), parse_reservation_rows(row.get("end_at"))
        if not isinstance(start, dt.datetime) or not isinstance(end, dt.datetime) or end <= now:
            continue
        team = row.get("team")
        key = (True, teams.get(team, team)) if team else (False, str(row.get("owner") or "?"))
        groups.setdefault(key, []).append((start, end, _seats_of(row), _slots_of(row)))
    out = []
    for (is_team, holder), rows in groups.items():
        latest = max(e for _, e, _, _ in rows)
        seats_peak, _ = _peak([(b, e, n) for b, e, n, _ in rows], now, latest)
        slots_peak, _ = _peak([(b, e, n) for b, e, _, n in rows], now, latest)
        out.append({"holder": holder, "team": is_team,
                    "seats_now": sum(n for b, e, n, _ in rows if b <= now < e),
                    "slots_now": sum(n for b, e, _, n in rows if b <= now < e),
                    "seats_peak": seats_peak, "slots_peak": slots_peak, "reservations": len(rows), "until": latest})
    out.sort(key=lambda h: (-h["seats_peak"], -h["slots_peak"], h["holder"]))
    return out


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
