"""Control actions: campaign cancel, pause, resume; admin triage; their execution by the submit worker.

A request is checked (role, target, arguments; refusals audited) and then
recorded as a ``ControlRequest`` (state ``queued``) beside its audit entry;
``worker.tasks.control_job`` gets its id after commit. The worker claims it
(``queued -> claimed``, with time and owner), runs the scheduler's control
command as the submit account (an SGE operator) and records the result
(``done`` or ``failed``) in the request and its audit entry. States and
their moves: ``models.ControlState`` / ``CONTROL_TRANSITIONS``. A claim whose
worker died is put back to ``queued`` by :func:`reconcile_control_requests`
(Grid Engine's hold, release, delete, priority and clear-error are safe to
repeat), and given up after ``MAX_ATTEMPTS``.
"""
from __future__ import annotations

import datetime as dt
import re
from typing import Sequence

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction
from django.db.models import F
from django.utils import timezone

from schedulers.base import SchedulerCommandError, SchedulerUnavailable

from . import clusters, enqueue, limits, services
from .audit import audit, refused
from .models import (
    CAMPAIGN_LIVE,
    CONTROL_TRANSITIONS,
    AuditEntry,
    Campaign,
    Cluster,
    ControlRequest,
    ControlState,
    Task,
    transition,
)
from .roles import user_can
from .services import LaunchError

CAMPAIGN_ACTIONS = {"cancel": "delete", "pause": "hold", "resume": "release"}
_ACTIVE_NOT_FINISHING = ("pending", "held", "starting", "running", "suspended", "error", "unknown")
TRIAGE_ACTIONS = ("hold", "release", "delete", "priority", "clear_error")
#: Claims (worker deaths) after which a request is given up.
MAX_ATTEMPTS = 5
_DONE_WORDS = {"delete": "deleted", "hold": "held", "release": "released", "priority": "priority set",
               "clear_error": "error state cleared"}


def _ranges(numbers: Sequence[int]) -> list[list[int]]:
    ranges: list[list[int]] = []
    for n in sorted(set(numbers)):
        if ranges and n == ranges[-1][1] + 1:
            ranges[-1][1] = n
        else:
            ranges.append([n, n])
    return ranges


def ranges_text(ranges: Sequence[Sequence[int]] | None) -> str:
    """``[[1, 3], [5, 5]]`` -> ``"1-3,5"``; None -> ``"all"``."""
    if ranges is None:
        return "all"
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in ranges)


def parse_task_ranges(text: str, *, limit: int = limits.MAX_TASKS_PER_CAMPAIGN) -> list[list[int]] | None:
    """``"1-3,5"`` -> ``[[1, 3], [5, 5]]``; empty -> None (the whole job). Raises LaunchError."""
    text = (text or "").strip()
    if not text:
        return None
    numbers: list[int] = []
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d{1,9})(?:-(\d{1,9}))?", part)
        if not m:
            raise LaunchError(f"tasks: {part!r} is not a task number or range like 1-5")
        first, last = int(m.group(1)), int(m.group(2) or m.group(1))
        if first < 1 or last < first:
            raise LaunchError(f"tasks: {part} is not a range of positive task numbers")
        if len(numbers) + last - first + 1 > limit:
            raise LaunchError(f"tasks: at most {limit} task numbers")
        numbers.extend(range(first, last + 1))
    return _ranges(numbers)


def _task_numbers(ranges: list[list[int]] | None) -> list[int] | None:
    return None if ranges is None else [n for a, b in ranges for n in range(a, b + 1)]


def _queue_control(*, user, action: str, target: str, cluster: Cluster, control: str, job_number: int,
                   ranges: list[list[int]] | None, priority: int | None = None,
                   campaign: Campaign | None = None) -> ControlRequest:
    """Record the request (queued) and its audit entry; hand it to the submit worker after commit."""
    from schedulers.base import InvalidSubmission
    from schedulers.gridengine.commands import control_argv

    try:
        argv = control_argv(control, job_number, _task_numbers(ranges), priority)  # validates first
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
        ranges = _ranges(numbers)
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
    cluster = cluster or clusters.cluster_get_default()
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


def job_priorities(cluster: Cluster, job_numbers) -> dict[int, int]:
    """Each job's POSIX priority (``-p``, -1023..1024) as tco last set it: ``{job_number: priority}``.

    The newest ``priority`` control request the scheduler carried out (``done``)
    wins; else the priority the campaign was launched with; jobs tco knows
    nothing about are left out. One query each.
    """
    numbers = sorted(set(job_numbers))
    out: dict[int, int] = dict(Campaign.objects.filter(cluster=cluster, job_number__in=numbers)
                               .order_by("launched_at").values_list("job_number", "priority"))
    for job_number, priority in (ControlRequest.objects.filter(
            cluster=cluster, job_number__in=numbers, control="priority", state=ControlState.DONE,
            priority__isnull=False).order_by("finished_at", "pk").values_list("job_number", "priority")):
        out[job_number] = priority
    return out


def campaign_priority(campaign: Campaign) -> int:
    """The campaign's job priority now (an admin's change included; see :func:`job_priorities`)."""
    if campaign.job_number is None:
        return campaign.priority
    return job_priorities(campaign.cluster, [campaign.job_number]).get(campaign.job_number, campaign.priority)


#: Display state of the held tasks of a campaign that wait for their ``-hold_jid_ad`` predecessor tasks
#: (trial 4, finding 2): not a hold tco or anyone put on them, so never "held" or "paused".
WAITING = "waiting"


def tco_holds(cluster: Cluster, campaigns: Sequence[Campaign] = (), job_numbers: Sequence[int] = ()
              ) -> dict[int, dict]:
    """The jobs tco holds now, by job number: ``{job_number: {"who": username, "at": datetime,
    "verb": "paused" | "held" | "launched on hold", "action": audit action}}``.

    tco's own record decides, not the scheduler (SGE 8.1.9's ``qstat -j -xml`` lists neither the
    held task ranges nor the hold kinds of tasks not yet started, and ``qstat`` shows ``hqw`` both
    for a hold and for a ``-hold_jid_ad`` wait): the newest hold or release control request the
    scheduler carried out (``done``) on the job wins (a hold: held; a release: not); without one,
    a campaign submitted on hold (``Campaign.submit_on_hold``, a budget's ``hold``) is held by its
    launcher since its submission. ``campaigns`` (their jobs) and ``job_numbers`` are read in one
    query each; a hold put on outside tco is not known here.
    """
    numbers = sorted({c.job_number for c in campaigns if c.job_number is not None} | set(job_numbers))
    out: dict[int, dict] = {}
    for campaign in campaigns:
        if campaign.job_number is not None and campaign.submit_on_hold:
            out[campaign.job_number] = {"who": campaign.launched_by.get_username(),
                                        "at": campaign.submitted_at or campaign.launched_at,
                                        "verb": "launched on hold", "action": "launch"}
    newest: dict[int, ControlRequest] = {}
    for request in (ControlRequest.objects.filter(cluster=cluster, job_number__in=numbers,
                                                  control__in=("hold", "release"), state=ControlState.DONE)
                    .select_related("user").order_by("finished_at", "pk")):
        newest[request.job_number] = request
    for job_number, request in newest.items():
        if request.control == "release":
            out.pop(job_number, None)
            continue
        out[job_number] = {"who": request.user.get_username() if request.user else "an admin",
                           "at": request.finished_at or request.created_at,
                           "verb": "paused" if request.action.startswith("campaign_") else "held",
                           "action": request.action}
    return out


def waits_for_predecessor(campaign: Campaign, held: dict[int, dict] | None = None) -> bool:
    """Whether the campaign's held tasks wait for its ``-hold_jid_ad`` predecessor's tasks rather
    than for a release: it has a predecessor job and tco does not hold it (:func:`tco_holds`;
    ``held``: its answer for this campaign's job, read when None). A campaign paused by its
    launcher that also has a predecessor stays paused."""
    if not campaign.predecessor_job or campaign.job_number is None:
        return False
    if held is None:
        held = tco_holds(campaign.cluster, [campaign])
    return campaign.job_number not in held


def campaign_states(campaign: Campaign, states: dict[str, int], held: dict[int, dict] | None = None
                    ) -> dict[str, int]:
    """``states`` (``{task state: n}``) as shown for ``campaign``: the held tasks of a campaign
    that waits for its predecessor (:func:`waits_for_predecessor`) count as :data:`WAITING`, not
    ``held`` (task by task: -hold_jid_ad starts task N when task N of the predecessor ends)."""
    if not states.get("held") or not waits_for_predecessor(campaign, held):
        return dict(states)
    out = {}
    for state, n in states.items():
        if state == "held":
            out[WAITING] = out.get(WAITING, 0) + n
        else:
            out[state] = out.get(state, 0) + n
    return out


def predecessor_campaign(campaign: Campaign) -> Campaign | None:
    """The tco campaign whose job is ``campaign``'s predecessor (the newest launched with that job
    number on the same cluster), None without one."""
    if not campaign.predecessor_job:
        return None
    return (Campaign.objects.filter(cluster=campaign.cluster_id, job_number=campaign.predecessor_job)
            .order_by("-launched_at").first())


def campaign_controls(campaign: Campaign, states: dict[str, int]) -> dict[str, dict]:
    """Which controls can act on the campaign now, from its task counts (``{state: n}``, all tasks).

    ``{action: {"count": tasks it would act on, "why": "" | why it is not offered}}``
    for pause (pending tasks, and the tasks that wait for the predecessor), resume (held
    tasks; never tasks that wait for the predecessor: a release does not move them), cancel
    (pending, held, waiting, running; not once finished) and retry (failed or lost tasks);
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
    counts = {"pause": states.get("pending", 0) + waiting, "resume": states.get("held", 0), "cancel": active,
              "retry": states.get("failed", 0) + states.get("lost", 0)}
    empty = {"pause": "no pending tasks", "resume": "no held tasks", "cancel": "no pending or running tasks",
             "retry": "no failed tasks"}
    if waiting:
        empty["resume"] = (f"its {waiting} waiting task{'s' if waiting != 1 else ''} wait for predecessor job "
                           f"{campaign.predecessor_job}, task by task; they start when its tasks end, "
                           "not on a release")
    out = {}
    for action, count in counts.items():
        why = not_live if action != "retry" and not live else ("" if count else empty[action])
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
                    claimed_by=services.claim_owner(), attempts=F("attempts") + 1)
    request = ControlRequest.objects.select_related("cluster", "audit").get(pk=request_id)
    if not claimed:
        return request
    try:
        scheduler = scheduler or clusters.scheduler_for(request.cluster)
        scheduler.control(request.control, request.job_number, _task_numbers(request.tasks), request.priority)
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
    from .ingest import campaign_status_follow

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
        if not services.claim_is_stale(request.claimed_by, request.claimed_at, now=now, grace_s=grace_s):
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
