"""The reservation part of the cluster's status poll: ``qrstat``'s list in ``Cluster.status["reservations"]``."""
from __future__ import annotations

import datetime as dt

from django.db.models import Count

from dashboards.core import realtime
from dashboards.models import Cluster, Reservation, Task
from schedulers.base import SchedulerError

#: At most this many pending ``-R y`` candidates are asked about (``qstat -j``) per poll.
MAX_RESERVING_PROBES = 10


# --------------------------------------------------------------------------- status poll

def poll_status(scheduler, cluster: Cluster, status: dict) -> None:
    """Add the reservation parts to a status poll's ``status`` (in place):

    ``reservations``: ``scheduler.reservations()`` (JSON-ready: ISO times),
    each with ``team`` (the team's project) and ``booked_by`` (tco user name)
    where tco booked it; ``reserving_jobs``: pending ``-R y`` jobs,
    ``[{"job_number", "slots", "pe", "queues", "owner", "name"}]``, looked up
    (``qstat -j``) among the pending jobs asking for more than one slot, at
    most ``MAX_RESERVING_PROBES`` of them. A part that fails stores
    ``<part>_error`` instead; the rest of the status is kept.
    """
    from dashboards.core.encoding import jsonable

    reader = getattr(scheduler, "reservations", None)
    if reader is not None:
        try:
            status["reservations"] = jsonable(annotate(cluster, reader()))
        except SchedulerError as exc:
            status["reservations_error"] = str(exc)[:500]
    try:
        status["reserving_jobs"] = reserving_jobs(scheduler, cluster)
    except SchedulerError as exc:
        status["reserving_jobs_error"] = str(exc)[:500]


def reserving_jobs(scheduler, cluster: Cluster) -> list[dict]:
    """Pending jobs with ``-R y`` (``JB_reserve``) among those waiting for more than one slot.

    Raises SchedulerError (UnknownJob for a job that just started is skipped).
    """
    from schedulers.base import UnknownJob

    candidates = list(Task.objects.filter(cluster=cluster, active=True, state="pending", slots__gt=1)
                      .values("job_number").annotate(n=Count("id")).order_by("job_number")
                      .values_list("job_number", flat=True)[:MAX_RESERVING_PROBES])
    found = []
    for job_number in candidates:
        try:
            detail = scheduler.job_detail(job_number, timeout=5)
        except UnknownJob:
            continue
        if detail.get("reserve"):
            found.append({"job_number": job_number, "slots": detail.get("pe_slots") or 1, "pe": detail.get("pe"),
                          "queues": list(detail.get("hard_queues") or []), "owner": detail.get("owner", ""),
                          "name": detail.get("name", "")})
    return found


def annotate(cluster: Cluster, rows: list[dict]) -> list[dict]:
    """qrstat rows with ``team`` (project) and ``booked_by`` (user name) from tco's bookings."""
    ids = [r["id"] for r in rows]
    records = {}
    for record in (Reservation.objects.filter(cluster=cluster, ar_id__in=ids, deleted_at__isnull=True)
                   .select_related("team", "booked_by").order_by("created_at")):
        records[record.ar_id] = record
    out = []
    for row in rows:
        record = records.get(row["id"])
        out.append({**row, "team": record.team.project if record else None,
                    "booked_by": record.booked_by.get_username() if record and record.booked_by else None})
    return out


def refresh_status(cluster: Cluster, scheduler) -> None:
    """Re-read the reservations into the stored status now (after a booking or deletion), so the
    queue page shows the change before the next poll. A scheduler error leaves the status."""
    status = dict(Cluster.objects.filter(pk=cluster.pk).values_list("status", flat=True).first() or {})
    poll_status(scheduler, cluster, status)
    Cluster.objects.filter(pk=cluster.pk).update(status=status)
    realtime.queue_changed(cluster.name)


def parse_reservation_rows(value):
    if isinstance(value, str):
        try:
            return dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    return value
