"""Control actions: campaign cancel, pause, resume; admin triage; their execution by the submit worker.

A request is checked (role, target, arguments; refusals audited) and then
recorded as a ``ControlRequest`` (state ``queued``) beside its audit entry;
``worker.tasks.control_job`` gets its id after commit. The worker claims it
(``queued -> claimed``, with time and owner), runs the scheduler's control
command as the submit account (an SGE operator) and records the result
(``done`` or ``failed``) in the request and its audit entry. States and
their moves: ``control_models.ControlState`` / ``CONTROL_TRANSITIONS``. A claim whose
worker died is put back to ``queued`` by :func:`reconcile_control_requests`
(Grid Engine's hold, release, delete, priority and clear-error are safe to
repeat), and given up after ``MAX_ATTEMPTS``.
"""
from __future__ import annotations

import datetime as dt

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from dashboards.control_models import CONTROL_TRANSITIONS, ControlState
from dashboards.core import clusters as core_clusters
from dashboards.core import enqueue, failures, limits
from dashboards.core.audit import audit, refused
from dashboards.core.errors import LaunchError
from dashboards.core.holds import WAITING, campaign_states, predecessor_campaign, waits_for_predecessor
from dashboards.core.ranges import numbers_in_ranges, ranges_text, task_ranges
from dashboards.core.roles import user_can
from dashboards.launch import submit
from dashboards.models import (
    CAMPAIGN_LIVE,
    AuditEntry,
    Campaign,
    Cluster,
    ControlRequest,
    Task,
    transition,
)
from schedulers.base import SchedulerCommandError, SchedulerUnavailable

CAMPAIGN_ACTIONS = {"cancel": "delete", "pause": "hold", "resume": "release"}
_ACTIVE_NOT_FINISHING = ("pending", "held", "starting", "running", "suspended", "error", "unknown")
TRIAGE_ACTIONS = ("hold", "release", "delete", "priority", "clear_error")
#: Claims (worker deaths) after which a request is given up.
MAX_ATTEMPTS = 5
_DONE_WORDS = {"delete": "deleted", "hold": "held", "release": "released", "priority": "priority set",
               "clear_error": "error state cleared"}


def _queue_control(*, user, action: str, target: str, cluster: Cluster, control: str, job_number: int,
                   ranges: list[list[int]] | None, priority: int | None = None,
                   campaign: Campaign | None = None) -> ControlRequest:
    """Record the request (queued) and its audit entry; hand it to the submit worker after commit."""
    from schedulers.base import InvalidSubmission
    from schedulers.gridengine.commands import control_argv

    try:
        argv = control_argv(control, job_number, numbers_in_ranges(ranges), priority)  # validates first
    except InvalidSubmission as exc:
        raise refused(user, action, target, {"job_number": job_number}, str(exc)) from None
    params = {"status": ControlState.QUEUED.value, "cluster": cluster.pk, "control": control,
              "job_number": job_number, "tasks": ranges, "priority": priority,
              "command": " ".join(argv[:4]) + (" ..." if len(argv) > 4 else "")}
    if campaign is not None:
        params["campaign"] = campaign.pk
    with transaction.atomic():
        entry = audit(user=user, action=action, target=target, params=params, ok=False,
                      result="queued for the submit worker")
        request = ControlRequest.objects.create(
            user=entry.user, audit=entry, cluster=cluster, campaign=campaign, action=action[:32], control=control,
            job_number=job_number, tasks=ranges, priority=priority)
        transaction.on_commit(lambda: enqueue.send(enqueue.CONTROL_JOB, request.pk))
    return request


def campaign_control(*, user: AbstractBaseUser, campaign: Campaign, action: str) -> ControlRequest:
    """Cancel (qdel the pending and running tasks), pause (qhold the pending ones) or resume
    (qrls the held ones) a campaign. Returns the queued request.

    Raises ActionRefused (no ``control`` role on the campaign's team) and
    LaunchError (unknown action, nothing to act on).
    """
    target = f"campaign:{campaign.pk}"
    if action not in CAMPAIGN_ACTIONS:
        raise refused(user, f"campaign_{action}"[:32], target, {}, f"unknown action {action!r}")
    audit_action = f"campaign_{action}"
    if not user_can(user, "control", campaign.team):
        raise refused(user, audit_action, target, {}, f"you may not control campaigns of team {campaign.team.name}")
    if campaign.job_number is None or campaign.status not in CAMPAIGN_LIVE:
        raise refused(user, audit_action, target, {},
                      f"campaign {campaign.pk} is {campaign.status}; there is nothing to {action}", error=LaunchError)
    active = Task.objects.filter(campaign=campaign, active=True)
    if action == "cancel":
        ranges = None
        if not active.exclude(state="finishing").exists():
            raise refused(user, audit_action, target, {}, "no pending or running tasks to cancel", error=LaunchError)
    else:
        waiting = waits_for_predecessor(campaign)
        # Pausing a campaign that waits for its predecessor holds the waiting tasks too, so that they
        # do not start when the predecessor's tasks end; a release does not move waiting tasks.
        if action == "pause":
            wanted = ("pending", "held") if waiting else ("pending",)
        else:
            wanted = () if waiting else ("held",)
        numbers = list(active.filter(state__in=wanted).values_list("task_number", flat=True))
        if not numbers:
            if action == "resume" and waiting:
                why = (f"no held tasks to resume: its tasks wait for predecessor job {campaign.predecessor_job} "
                       "(task by task); they start when its tasks end, not on a release")
            else:
                why = "no pending tasks to pause" if action == "pause" else "no held tasks to resume"
            raise refused(user, audit_action, target, {}, why, error=LaunchError)
        ranges = task_ranges(numbers)
        if len(ranges) > limits.MAX_RANGES:
            ranges = None  # running tasks put on hold keep running ("hr"); releasing the job is harmless
    return _queue_control(user=user, action=audit_action, target=target, cluster=campaign.cluster,
                          control=CAMPAIGN_ACTIONS[action], job_number=campaign.job_number, ranges=ranges,
                          campaign=campaign)


def triage_action(*, user: AbstractBaseUser, action: str, job_number: int, tasks: list[list[int]] | None = None,
                  priority: int | None = None, cluster: Cluster | None = None) -> ControlRequest:
    """An admin's hold, release, delete, priority change or error clearing on a waiting job.

    Admins only; the job must be one tco sees in the queue. Returns the
    queued request. Raises ActionRefused, LaunchError.
    """
    target = f"job:{job_number}"
    audit_action = f"triage_{action}"[:32]
    params = {"job_number": job_number, "tasks": tasks, "priority": priority}
    if not user_can(user, "triage"):
        raise refused(user, audit_action, target, params, "only admins may triage jobs")
    if action not in TRIAGE_ACTIONS:
        raise refused(user, audit_action, target, params, f"unknown action {action!r}")
    cluster = cluster or core_clusters.cluster_get_default()
    if not Task.objects.filter(cluster=cluster, job_number=job_number, active=True).exists():
        raise refused(user, audit_action, target, {}, f"job {job_number} is not in the queue", error=LaunchError)
    if action == "priority":
        if tasks is not None:
            raise refused(user, audit_action, target, {}, "priority applies to the whole job; leave tasks empty",
                          error=LaunchError)
        if priority is None or not limits.PRIORITY_MIN <= priority <= limits.PRIORITY_MAX:
            raise refused(user, audit_action, target, {}, f"priority: {limits.PRIORITY_MIN} to {limits.PRIORITY_MAX}",
                          error=LaunchError)
    elif priority is not None:
        priority = None
    return _queue_control(user=user, action=audit_action, target=target, cluster=cluster, control=action,
                          job_number=job_number, ranges=tasks, priority=priority)


def campaign_controls(campaign: Campaign, states: dict[str, int]) -> dict[str, dict]:
    """Which controls can act on the campaign now, from its task counts (``{state: n}``, all tasks).

    ``{action: {"count": tasks it would act on, "why": "" | why it is not offered}}``
    for pause (pending tasks, and the tasks that wait for the predecessor), resume (held
    tasks; never tasks that wait for the predecessor: a release does not move them), cancel
    (pending, held, waiting, running; not once finished), retry (failed or lost tasks) and
    retry_infrastructure (those of them the infrastructure failed: ``core.failures``);
    ``pause`` also has ``"pending"`` and ``"waiting"`` (:func:`campaign_states`); while tasks wait
    for the predecessor, ``"waiting": {"count", "why": "", "job", "campaign" (its name or ""),
    "campaign_id"}`` says for what (no control: the predecessor's tasks ending moves them). The same
    conditions :func:`campaign_control` and ``launch.campaign_retry`` enforce.
    """
    live = campaign.job_number is not None and campaign.status in CAMPAIGN_LIVE
    not_live = f"the campaign is {campaign.get_status_display()}"
    states = campaign_states(campaign, states)
    waiting = states.get(WAITING, 0)
    active = sum(n for s, n in states.items() if s in _ACTIVE_NOT_FINISHING or s == WAITING)
    failed = states.get("failed", 0) + states.get("lost", 0)
    infrastructure = failures.infrastructure_failed(campaign) if failed else 0
    counts = {"pause": states.get("pending", 0) + waiting, "resume": states.get("held", 0), "cancel": active,
              "retry": failed, "retry_infrastructure": infrastructure}
    empty = {"pause": "no pending tasks", "resume": "no held tasks", "cancel": "no pending or running tasks",
             "retry": "no failed tasks", "retry_infrastructure": "no task failed by the infrastructure"}
    if waiting:
        empty["resume"] = (f"its {waiting} waiting task{'s' if waiting != 1 else ''} wait for predecessor job "
                           f"{campaign.predecessor_job}, task by task; they start when its tasks end, "
                           "not on a release")
    out = {}
    for action, count in counts.items():
        why = not_live if not action.startswith("retry") and not live else ("" if count else empty[action])
        out[action] = {"count": count, "why": why}
    out["pause"]["waiting"] = waiting
    out["pause"]["pending"] = states.get("pending", 0)
    if waiting and live:
        predecessor = predecessor_campaign(campaign)
        out["waiting"] = {"count": waiting, "why": "", "job": campaign.predecessor_job,
                          "campaign": predecessor.name if predecessor else "",
                          "campaign_id": predecessor.pk if predecessor else None}
    return out


def campaign_actions(campaign: Campaign, *, limit: int = 50) -> list[AuditEntry]:
    """The campaign's launches and control actions, newest first: those on ``campaign:<pk>`` and
    an admin's triage actions on its job (``job:<job_number>``, while it was this campaign's)."""
    from django.db.models import Q

    where = Q(target=f"campaign:{campaign.pk}")
    if campaign.job_number is not None:
        where |= Q(target=f"job:{campaign.job_number}", at__gte=campaign.launched_at)
    return list(AuditEntry.objects.filter(where).select_related("user").order_by("-at", "-id")[:limit])


# --------------------------------------------------------------------------- execution (submit worker)

def _move(request_id: int, source, target: str, *, where: dict | None = None, **changes) -> int:
    return transition(ControlRequest.objects.filter(pk=request_id, **(where or {})), field="state",
                      transitions=CONTROL_TRANSITIONS, source=source, target=target, **changes)


def _finish(request: ControlRequest, state: str, result: str) -> None:
    """claimed -> done/failed/given_up, with the result in the request and its audit entry."""
    result = result[:4000]
    source = (ControlState.CLAIMED, ControlState.QUEUED) if state == ControlState.GIVEN_UP else ControlState.CLAIMED
    with transaction.atomic():
        if not _move(request.pk, source, state, result=result, finished_at=timezone.now()):
            return
        if request.audit_id:
            entry = AuditEntry.objects.filter(pk=request.audit_id).first()
            if entry is not None:
                AuditEntry.objects.filter(pk=entry.pk).update(
                    ok=state == ControlState.DONE, result=result, params={**entry.params, "status": str(state)})


def control_execute(*, request_id: int, scheduler=None, after_control=None) -> ControlRequest:
    """Run a queued control request and record its result.

    Claimed with a conditional update (queued -> claimed), so a duplicated
    delivery acts once. ``SchedulerUnavailable`` puts it back to queued and
    propagates, for the caller to retry; a refusal by the scheduler is
    recorded (``failed``, its message). ``after_control`` (tests) is called
    between the scheduler's command and the commit of the result.
    """
    claimed = _move(request_id, ControlState.QUEUED, ControlState.CLAIMED, claimed_at=timezone.now(),
                    claimed_by=submit.claim_owner(), attempts=F("attempts") + 1)
    request = ControlRequest.objects.select_related("cluster", "audit").get(pk=request_id)
    if not claimed:
        return request
    try:
        scheduler = scheduler or core_clusters.scheduler_for(request.cluster)
        scheduler.control(request.control, request.job_number, numbers_in_ranges(request.tasks), request.priority)
        if after_control is not None:
            after_control(request)
    except SchedulerUnavailable:
        _move(request_id, ControlState.CLAIMED, ControlState.QUEUED, claimed_at=None, claimed_by="",
              result="queued (scheduler unavailable, retrying)")
        raise
    except SchedulerCommandError as exc:
        message = (exc.stderr or str(exc)).strip()
        if request.control == "delete" and request.attempts > 1 and "does not exist" in message:
            # A worker died after its qdel: the job it deleted is gone, which is what was asked.
            _finish(request, ControlState.DONE, f"deleted: job {request.job_number} (gone already: deleted by an "
                                                "earlier attempt)")
        else:
            _finish(request, ControlState.FAILED, f"failed: {message}")
    except (ValueError, KeyError) as exc:
        _finish(request, ControlState.FAILED, f"failed: {exc}")
    else:
        _finish(request, ControlState.DONE, f"{_DONE_WORDS.get(request.control, 'done')}: job {request.job_number} "
                                            f"tasks {ranges_text(request.tasks)}")
        if request.control in ("hold", "release"):
            _follow_status(request)
    request.refresh_from_db()
    return request


def _follow_status(request: ControlRequest) -> None:
    """After tco's hold or release of a campaign's job, its status follows at once: a hold of tasks
    that wait for their predecessor changes no task state (they stay ``hqw``), only who holds them
    (:func:`tco_holds`), so ingest would not move the campaign between ``waiting`` and ``paused``."""
    from dashboards.ingest.campaign_status import campaign_status_follow

    ids = [request.campaign_id] if request.campaign_id else list(
        Campaign.objects.filter(cluster=request.cluster_id, job_number=request.job_number).values_list("pk", flat=True))
    campaign_status_follow(ids)


def control_give_up(*, request_id: int, message: str) -> None:
    """Record that a control request was never run (the scheduler stayed unreachable)."""
    request = ControlRequest.objects.filter(pk=request_id).first()
    if request is not None:
        _finish(request, ControlState.GIVEN_UP, f"given up: scheduler unavailable: {message}")


def reconcile_control_requests(*, now: dt.datetime | None = None, grace_s: float | None = None) -> dict[str, list[int]]:
    """Put back requests whose worker died while it held them, and re-send lost ones.

    A ``claimed`` request whose claim is stale (``services.claim_is_stale``;
    ``grace_s`` defaults to ``TCO_CONTROL_CLAIM_GRACE_S``) goes back to
    ``queued`` and is sent again, or is given up after ``MAX_ATTEMPTS``
    claims; a ``queued`` request older than ``grace_s`` is sent again.
    Returns ``{"released": [ids], "requeued": [ids], "given_up": [ids]}``.
    """
    now = now or timezone.now()
    grace_s = float(getattr(settings, "TCO_CONTROL_CLAIM_GRACE_S", 300) if grace_s is None else grace_s)
    out: dict[str, list[int]] = {"released": [], "requeued": [], "given_up": []}
    for request in ControlRequest.objects.filter(state=ControlState.CLAIMED):
        if not submit.claim_is_stale(request.claimed_by, request.claimed_at, now=now, grace_s=grace_s):
            continue
        if request.attempts >= MAX_ATTEMPTS:
            _finish(request, ControlState.GIVEN_UP, f"given up: its worker died {request.attempts} times")
            out["given_up"].append(request.pk)
        elif _move(request.pk, ControlState.CLAIMED, ControlState.QUEUED, where={"claimed_at": request.claimed_at},
                   claimed_at=None, claimed_by=""):
            transaction.on_commit(lambda pk=request.pk: enqueue.send(enqueue.CONTROL_JOB, pk))
            out["released"].append(request.pk)
    stale = now - dt.timedelta(seconds=grace_s)
    for pk in ControlRequest.objects.filter(state=ControlState.QUEUED, created_at__lte=stale).values_list(
            "pk", flat=True):
        if pk not in out["released"]:
            enqueue.send(enqueue.CONTROL_JOB, pk)
            out["requeued"].append(pk)
    return out
