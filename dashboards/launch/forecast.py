"""When a campaign will likely start and finish, and how many slot-hours it takes (issue 16, feature 4).

The figures come from the scheduler's own numbers in the last cluster status
poll (``Cluster.status``: ``qstat -g c`` slots per cluster queue, the global
host's consumables from ``qhost -F`` and ``complex_values``, ``qquota``
rules, ``sge_share_mon`` share tree) and from tco's history (wall clock of
finished tasks; the tasks waiting now); only the chosen queue's slots are asked of the
scheduler at the time of the forecast (``qstat -g c``, :func:`fresh_queue_row`), the poll's
when it does not answer.

The model, stated on the page with every figure it used:

- **at once** (tasks of this campaign running together) is the smallest of:
  the task count, the concurrency cap (``-tc``), the queue's slots, the
  model API seats / seats per task, and each ``qquota`` limit that applies to
  the campaign (its filters name the submit user, the team's project or the
  queue, or name none), counted in tasks;
- **free now** is the same with what is free now (``available`` slots, seats
  left, quota headroom);
- the campaign **starts** at once when a task can start now and nothing
  waits ahead of it (tasks of tco campaigns on the same queue pending with the same or a higher
  priority: they take the free slots first); else after ``(ahead + 1) x d / (share x slots)`` seconds, where ``d`` is the
  median wall clock of the queue's finished tasks (the agent's own when none took time), ``slots`` how many
  run in the queue at once, and ``share`` the team's fraction of the share
  tree among the projects with work (1 without a share tree; then every task
  waiting is ahead, else only the team's own);
- it **finishes** ``ceil(tasks / at once) x`` the agent's wall clock per task
  later (median and 90th percentile), where at once is also cut to the
  team's share of the slots while other work waits.

- with a **predecessor** (``-hold_jid_ad``), task N starts only after task N of the predecessor
  job ends: the start is no earlier than its first task's likely end and the finish no earlier
  than its last task's likely end plus a task (:func:`predecessor_forecast`).

These are estimates for planning, not promises: the scheduler decides.
"""
from __future__ import annotations

import datetime as dt
import math
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.utils import timezone

from dashboards.core.stages import quantile
from dashboards.launch.inputs import INPUT_IDENTIFIERS
from dashboards.models import Cluster, Task

if TYPE_CHECKING:
    from dashboards.launch.request import LaunchRequest

#: Finished tasks read for the queue's typical wall clock (the newest first).
QUEUE_HISTORY = 2000


def _number(value: Any) -> float | None:
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) else None


def counted(n: float, word: str) -> str:
    """``n`` and ``word``, plural unless ``n`` is 1: ``"1 task"``, ``"0 tasks"``, ``"2.5 seats"`` (``n`` shown
    with ``:g``: a whole float without its ``.0``)."""
    return f"{n:g} {word}" if n == 1 else f"{n:g} {word}s"


def quota_applies(filters: dict[str, list[str]] | None, *, user: str, project: str, queue: str) -> bool:
    """Whether a ``qquota`` rule with ``filters`` (``{"users": [...], "xprojects": [...], ...}``,
    parse_qquota's shape) limits a job of ``user`` in ``project`` on ``queue``. ``*`` matches
    anything; hosts and PEs do not narrow it (a task may land on any host)."""
    facts = {"users": user, "projects": project, "queues": queue}
    for key, values in (filters or {}).items():
        bare = key[1:] if key.startswith("x") else key
        if bare not in facts:
            continue
        names = {v.strip() for v in values}
        hit = "*" in names or facts[bare] in names or facts[bare].split("@")[0] in names
        if key.startswith("x") and hit:
            return False
        if not key.startswith("x") and not hit:
            return False
    return True


def _share(status: dict[str, Any], project: str, busy_projects: set[str]) -> tuple[float | None, str]:
    """The team's fraction of the share tree among the projects with work; (None, why) without one."""
    nodes = [n for n in status.get("share_tree") or [] if n.get("project")]
    if not nodes:
        return None, "no share tree in the last status"
    mine = next((n for n in nodes if n.get("project") == project), None)
    if mine is None:
        return None, f"project {project} has no share-tree node"
    competing = [n for n in nodes if n.get("project") in busy_projects | {project}]
    total = sum(_number(n.get("shares")) or 0 for n in competing)
    shares = _number(mine.get("shares")) or 0
    if total <= 0 or shares <= 0:
        return None, "the share tree gives no shares here"
    return shares / total, f"{project} has {shares:g} of {counted(total, 'share')} among the projects with work"


def fresh_queue_row(cluster: Cluster, queue: str, scheduler=None) -> tuple[dict | None, str]:
    """The cluster queue ``queue``'s slots now, asked of the scheduler (``qstat -g c``,
    ``SchedulerAdapter.queue_summary``: ``{"name", "used", "available", "total", ...}``), and where
    the figures come from ("qstat -g c now" or, when the scheduler does not answer, "the last
    cluster poll"). ``(None, note)`` when neither has the queue."""
    from dashboards.core import clusters as core_clusters

    try:
        scheduler = scheduler or core_clusters.scheduler_for(cluster)
        rows = scheduler.queue_summary()
    except Exception as exc:  # noqa: BLE001 - the poll's figures stand in; the page says so
        rows, source = None, f"the last cluster poll (qstat -g c failed now: {str(exc)[:120]})"
    else:
        source = "qstat -g c now"
    if rows is None:
        rows = (cluster.status or {}).get("queues") or []
    row = next((q for q in rows if q.get("name") == queue), None)
    return row, source


def _median(values: list[float]) -> float | None:
    return quantile(sorted(values), 0.5) if values else None


def predecessor_forecast(cluster: Cluster, job_number: int, *, now: dt.datetime, user) -> dict[str, Any]:
    """When the tasks of ``job_number`` (a ``-hold_jid_ad`` predecessor) will likely end.

    Only a job ``user`` may hold on is told of (``launch.visible_predecessor``, the launch's own
    rule: a campaign on ``cluster`` of a team the user views, else rows tco recorded in such a
    team's project); any other job number, of another team or unknown alike, gets only
    "not a job of a team you can see" (attack review 5: its campaign name, task states and run
    time were shown to any launcher). From tco's rows of that job (running tasks: their start
    plus the median wall clock of the predecessor campaign's agent from its finished runs, every
    team's: a duration, no input or name; tasks still waiting: run in waves of as many as run
    now, or the campaign's concurrency cap) and its campaign. Returns ``{"job", "campaign": name
    | "", "tasks": its task count (visible jobs), "running": n, "waiting": n, "ended": bool, "visible": bool,
    "task_s": median seconds |
    None, "first_end_at": datetime | None (its first task to end: the earliest this campaign's
    task 1 can start), "last_end_at": datetime | None, "text": the wait in words}``.
    """
    from dashboards.launch.predecessor import predecessor_tasks, visible_predecessor

    campaign, rows = visible_predecessor(user, job_number, cluster)
    name = campaign.name if campaign else ""
    out: dict[str, Any] = {"job": job_number, "campaign": name, "running": 0, "waiting": 0, "ended": False,
                           "visible": campaign is not None or rows.exists(), "task_s": None, "first_end_at": None,
                           "last_end_at": None}
    if not out["visible"]:
        out["text"] = f"predecessor job {job_number}: not a job of a team you can see; no wait for it is counted"
        return out
    label = f"predecessor job {job_number}" + (f" (campaign {name})" if name else "")
    out["tasks"] = predecessor_tasks(campaign, rows)
    active = list(rows.filter(active=True).values_list("state", "started_at"))
    if not active:
        out["ended"] = True
        out["text"] = f"{label} has ended: no wait for it"
        return out
    if campaign is not None:
        runs = list(Task.objects.filter(campaign__agent_definition=campaign.agent_definition_id,
                                        state__in=("done", "failed"), wallclock_s__isnull=False)
                    .order_by("-ended_at", "-id").values_list("wallclock_s", flat=True)[:QUEUE_HISTORY])
        out["task_s"] = _median([float(w) for w in runs])
    running = [started for state, started in active if state in ("starting", "running", "suspended", "finishing",
                                                                 "deleting", "unknown")]
    out["running"] = len(running)
    out["waiting"] = len(active) - len(running)
    d = out["task_s"]
    if d is None:
        out["text"] = (f"waits for {label}: {out['running']} of its tasks running, {out['waiting']} waiting; "
                       "when they end is unknown (no finished runs of its agent)")
        return out
    ends = sorted(max(now, (started or now) + dt.timedelta(seconds=d)) for started in running)
    parallel = len(running) or min(out["waiting"], campaign.concurrency_cap or out["waiting"])
    first, last = (ends[0], ends[-1]) if ends else (None, now)
    if out["waiting"]:
        waves = math.ceil(out["waiting"] / max(1, parallel))
        base = ends[0] if ends else now
        last = max(last, base + dt.timedelta(seconds=waves * d))
        first = first or now + dt.timedelta(seconds=d)
    out["first_end_at"], out["last_end_at"] = first, last
    out["text"] = (f"waits for {label}, task by task: {out['running']} of its tasks running, {out['waiting']} "
                   f"waiting; its agent takes {d:.0f} s (median), so its first task likely ends at "
                   f"{first:%H:%M:%S} UTC and its last at {last:%H:%M:%S} UTC")
    return out


def timing_forecast(request: LaunchRequest, *, cluster: Cluster, duration_s: dict[str, float] | None,
                    user=None, now: dt.datetime | None = None, scheduler=None,
                    ask_scheduler: bool = True) -> dict[str, Any]:
    """Start, finish and slot-hours of the campaign ``request`` would launch (module doc for the model).

    From ``request`` (the launch service's :class:`~dashboards.launch.service.LaunchRequest`,
    passed whole): its team, task count (``len(inputs)``), queue, seats per task,
    concurrency cap (``-tc``), priority, agent definition and predecessor job.

    ``duration_s``: the agent's wall clock per task ``{p10, p50, p90}`` in seconds (from
    ``billing.forecast``: its finished runs on any queue), None without history;
    ``agent_definition`` names the queues that history comes from. The queue's slots free now
    are asked of the scheduler (:func:`fresh_queue_row`, ``scheduler`` for tests), the poll's
    figures when it does not answer or ``ask_scheduler`` is False (the launch itself: a launch never
    waits for ``qstat``). Waiting ahead counts only ``queue``'s work: pending tasks of
    tco campaigns on it (and campaigns on it still being submitted); pending jobs not launched
    by tco, whose queue tco does not know, are counted apart. ``predecessor_job``
    (``-hold_jid_ad``): the start is no earlier than its first task's likely end and the finish
    no earlier than its last task's likely end plus a task (:func:`predecessor_forecast`), told
    only of a job ``user`` (the launcher; required with ``predecessor_job``) may see.
    Returns ``{"at_once": int, "free_now": int, "limits": [{"what": str, "tasks": int}] (the
    smallest first), "ahead": tasks waiting ahead, "ahead_all", "ahead_unknown": pending tasks
    of jobs not launched by tco, "queue_task_s": seconds (the queue's median task) | None,
    "queue_task_note": str, "history_queues": [(queue, runs)], "share": float | None,
    "share_note": str, "wait_s": float | None, "start_at": datetime | None, "start_note": str,
    "finish_at": {p50, p90} | None, "run_s": {p50, p90} | None, "slot_hours": {p10, p50, p90}
    | None, "predecessor": predecessor_forecast(...) | None, "slots_source": str, "status_at":
    datetime | None, "notes": [str], "queue": queue}``. Times are None when history is missing.
    """
    from dashboards.models import Campaign, CampaignStatus

    team, count, queue = request.team, len(request.inputs), request.queue
    seats_per_task, concurrency_cap, priority = request.seats_per_task, request.concurrency_cap, request.priority
    agent_definition, predecessor_job = request.agent_definition, request.predecessor_job
    now = now or timezone.now()
    status = cluster.status or {}
    submit_user = settings.TCO_SUBMIT_USER
    seat = settings.TCO_SEAT_RESOURCE
    notes: list[str] = []
    limits: list[dict[str, Any]] = [{"what": f"{counted(count, 'task')} in the campaign", "tasks": count}]
    free: list[int] = [count]
    if concurrency_cap:
        limits.append({"what": f"concurrency cap -tc {concurrency_cap}", "tasks": concurrency_cap})
        free.append(concurrency_cap)
    if ask_scheduler:
        row, slots_source = fresh_queue_row(cluster, queue, scheduler)
    else:
        row = next((q for q in status.get("queues") or [] if q.get("name") == queue), None)
        slots_source = "the last cluster poll"
    queue_slots = None
    if row is not None and _number(row.get("total")):
        queue_slots = int(_number(row["total"]) or 0)
        available = int(_number(row.get("available")) or 0)
        limits.append({"what": f"{queue}: {counted(queue_slots, 'slot')} (qstat -g c)", "tasks": queue_slots})
        free.append(available)
        notes.append(f"{queue}: {available} of {counted(queue_slots, 'slot')} free ({slots_source})")
    else:
        notes.append(f"no slot figures for {queue} ({slots_source})")
    seat_capacity = _number((status.get("global_capacity") or {}).get(seat))
    seats_free = None
    for host in status.get("hosts") or []:
        if host.get("name") == "global":
            value = (host.get("resources") or {}).get(seat)
            seats_free = _number(value.get("value") if isinstance(value, dict) else value)
    if seats_per_task > 0 and seat_capacity:
        limits.append({"what": f"{seat}: {counted(seat_capacity, 'seat')} / {seats_per_task} per task",
                       "tasks": int(seat_capacity // seats_per_task)})
        if seats_free is not None:
            free.append(int(seats_free // seats_per_task))
            notes.append(f"{seat}: {seats_free:g} of {counted(seat_capacity, 'seat')} free")
    for quota in status.get("quotas") or []:
        limit, used = _number(quota.get("limit")), _number(quota.get("used")) or 0.0
        resource = quota.get("resource")
        if limit is None or not quota_applies(quota.get("filters"), user=submit_user, project=team.project,
                                                    queue=queue):
            continue
        per_task = 1 if resource == "slots" else (seats_per_task if resource == seat else None)
        if not per_task:
            continue
        amount = counted(limit, "slot") if resource == "slots" else f"{limit:g} {resource}"
        limits.append({"what": f"quota {quota.get('rule')}: {amount}", "tasks": int(limit // per_task)})
        free.append(max(0, int((limit - used) // per_task)))
        notes.append(f"quota {quota.get('rule')}: {used:g} of {amount} in use")
    limits.sort(key=lambda item: item["tasks"])
    at_once = max(1, min(item["tasks"] for item in limits))
    free_now = max(0, min(free))

    all_pending = Task.objects.filter(cluster=cluster, active=True, state="pending")
    # Only this queue's work is ahead: tco's campaigns on it (a pending task's own queue is empty until
    # it starts); jobs not launched by tco may ask for any queue, which tco does not know.
    waiting = all_pending.filter(campaign__queue=queue)
    ahead_unknown = all_pending.filter(campaign__isnull=True).count()
    submitting = list(Campaign.objects.filter(cluster=cluster, queue=queue, status=CampaignStatus.SUBMITTING)
                      .exclude(priority__lt=priority).values_list("team__project", "task_count"))
    ahead_all = waiting.exclude(campaign__priority__lt=priority).count() + sum(n for _, n in submitting)
    # The share tree is the cluster's: every project with work competes, whatever its queue.
    busy = set(all_pending.values_list("project", flat=True).distinct()[:100])
    busy |= set(Task.objects.filter(cluster=cluster, active=True, state="running")
                .values_list("project", flat=True).distinct()[:100])
    share, share_note = _share(status, team.project, {p for p in busy if p})
    ahead = ahead_all
    if share is not None:
        ahead = (waiting.filter(project=team.project).exclude(campaign__priority__lt=priority).count()
                 + sum(n for p, n in submitting if p == team.project))
    queue_history = [float(w) for w in Task.objects.filter(cluster=cluster, queue=queue, state__in=("done", "failed"),
                                                            wallclock_s__isnull=False)
                     .order_by("-ended_at", "-id").values_list("wallclock_s", flat=True)[:QUEUE_HISTORY]]
    queue_task_s = _median(queue_history)
    queue_task_note = f"median of the last {len(queue_history)} finished tasks on {queue}"
    if not queue_task_s and duration_s:  # none ran there, or they took no time: the agent's own run time
        queue_task_s = duration_s.get("p50")
        queue_task_note = "this agent's median run time (no finished tasks on %s that took time)" % queue
    history_queues: list[tuple[str, int]] = []
    if agent_definition is not None:
        from django.db.models import Count

        history_queues = [(q or "?", n) for q, n in Task.objects.filter(
            campaign__agent_definition=agent_definition, state__in=("done", "failed"), wallclock_s__isnull=False)
            .values_list("queue").annotate(n=Count("id")).order_by("-n", "queue")]
    running_slots = queue_slots or at_once
    if seat_capacity and seats_per_task:
        running_slots = min(running_slots, int(seat_capacity // seats_per_task) or 1)
    contention = ahead_all > 0 or free_now < 1
    if contention and share is not None:
        fair = max(1, int(share * running_slots))
        if fair < at_once:
            limits.insert(0, {"what": f"share tree: {share:.0%} of {counted(running_slots, 'slot')} while others wait",
                              "tasks": fair})
            at_once = fair

    # The tasks ahead take the free slots first: only what is left could start now.
    free_now = max(0, free_now - ahead)
    result: dict[str, Any] = {"at_once": at_once, "free_now": free_now, "limits": limits, "ahead": ahead,
                              "ahead_all": ahead_all, "ahead_unknown": ahead_unknown, "queue_task_s": queue_task_s,
                              "queue_task_note": queue_task_note, "history_queues": history_queues, "share": share,
                              "share_note": share_note, "wait_s": None, "start_at": None, "start_note": "",
                              "finish_at": None, "run_s": None, "slot_hours": None, "predecessor": None,
                              "slots_source": slots_source, "status_at": cluster.status_at, "notes": notes,
                              "queue": queue}
    if free_now >= 1:
        result["wait_s"] = 0.0
    elif queue_task_s is not None:
        result["wait_s"] = (ahead + 1) * queue_task_s / ((share or 1.0) * max(1, running_slots))
    if result["wait_s"] is not None:
        result["start_at"] = now + dt.timedelta(seconds=result["wait_s"])
    task_s = (duration_s or {}).get("p50")
    if predecessor_job:
        if user is None:
            raise ValueError("timing_forecast: a predecessor job needs the user it is forecast for")
        before = result["predecessor"] = predecessor_forecast(cluster, predecessor_job, now=now, user=user)
        if before["visible"] and before.get("tasks") and before["tasks"] != count:
            from dashboards.launch.predecessor import mismatch_text

            # Said before Launch, which refuses it (launch.check_predecessor, the same words).
            before["text"] = (f"{mismatch_text(predecessor_job, before['tasks'], count)} Launch refuses it as it "
                              f"is. {before['text']}")
        if before["first_end_at"] is not None:
            if result["start_at"] is None or before["first_end_at"] > result["start_at"]:
                result["start_at"] = before["first_end_at"]
                result["wait_s"] = max(0.0, (before["first_end_at"] - now).total_seconds())
                result["start_note"] = f"when the first task of predecessor job {predecessor_job} likely ends"
        elif not before["ended"] and before["running"] + before["waiting"]:
            result["start_at"] = result["wait_s"] = None  # it waits for tasks whose end is unknown
            result["start_note"] = f"the end of predecessor job {predecessor_job}'s tasks is unknown"
    if duration_s:
        waves = math.ceil(count / at_once)
        result["run_s"] = {q: waves * duration_s[q] for q in ("p50", "p90")}
        result["slot_hours"] = {q: count * duration_s[q] / 3600 for q in ("p10", "p50", "p90")}
        if result["start_at"] is not None:
            result["finish_at"] = {q: result["start_at"] + dt.timedelta(seconds=result["run_s"][q])
                                   for q in ("p50", "p90")}
            before = result["predecessor"]
            if before and before["last_end_at"] is not None and task_s is not None:
                # Task N starts only after task N of the predecessor: the last one ends after its last.
                floor = {q: before["last_end_at"] + dt.timedelta(seconds=duration_s[q]) for q in ("p50", "p90")}
                result["finish_at"] = {q: max(result["finish_at"][q], floor[q]) for q in ("p50", "p90")}
    return result


def budget_headroom(verdict: dict[str, Any], expected_usd) -> list[dict[str, Any]]:
    """Each budget of the team before the launch: ``{"budget", "first", "spent_usd", "left_usd"
    (amount - spent), "after_usd" (left - expected; None when the cost is unknown), "unpriced_tasks",
    "places" (decimal places that show every amount as itself, ``billing.usd_places``)}``."""
    from dashboards.billing import budgets
    from dashboards.core import encoding

    rows = []
    for status in verdict.get("budgets") or []:
        amount = status["budget"].amount_usd
        left = amount - status["spent_usd"]
        after = left - expected_usd if expected_usd is not None and not status["unpriced_tasks"] else None
        shown = [amount, status["spent_usd"], left] + ([after] if after is not None else [])
        places = encoding.usd_places([abs(a) for a in shown])
        rows.append({"budget": status["budget"], "first": status["first"], "spent_usd": status["spent_usd"],
                     "left_usd": left, "after_usd": after, "unpriced_tasks": status["unpriced_tasks"],
                     "text": {"amount": encoding.usd_text(amount, places),
                              "spent": encoding.usd_text(status["spent_usd"], places),
                              "left": budgets.headroom_text(left, places),
                              "after": budgets.headroom_text(after, places) if after is not None else None}})
    return rows


#: How many of the agent's latest campaigns with finished tasks :func:`history_basis` reads the inputs of.
BASIS_CAMPAIGNS = 5
#: How many differing input names, and values of each, the forecast names.
_BASIS_SHOWN = 3


class _Seen:
    """The values one input took: its numbers as their span (lowest, highest) and every other value as
    JSON text (so 40 and "40" differ only when the inputs do)."""

    __slots__ = ("texts", "low", "high")

    def __init__(self) -> None:
        self.texts: set[str] = set()
        self.low: float | None = None
        self.high: float | None = None

    def add_number(self, value: float) -> None:
        if self.low is None or value < self.low:
            self.low = value
        if self.high is None or value > self.high:
            self.high = value

    def covers(self, value: float) -> bool:
        return self.low is not None and self.low <= value <= self.high

    def span(self) -> list[str]:
        """The numbers' span as the note says it: ``["3.1 to 14.9"]``, ``["40"]``, ``[]`` without numbers."""
        if self.low is None:
            return []
        return [_number_text(self.low) if self.low == self.high
                else f"{_number_text(self.low)} to {_number_text(self.high)}"]

    def shown(self) -> list[str]:
        """What the history had, for the note: its numbers' span, then the other values, at most
        ``_BASIS_SHOWN`` in all."""
        return (self.span() + sorted(self.texts))[:_BASIS_SHOWN]


def _number_text(value: float) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _input_values(items: list[dict[str, Any]]) -> dict[str, _Seen]:
    """``[{"duration_s": 40, "mode": "fast"}, …]`` -> ``{"duration_s": _Seen(40 to 40), "mode": _Seen({'"fast"'})}``.
    Numbers are compared, never encoded; each other value object is encoded once: the tasks of a
    parameter-list range share their line's fixed values, which must not cost a ``json.dumps`` per task
    (attack review 5)."""
    import json

    texts: dict[int, str] = {}  # id(value) -> its text; every value stays alive in ``items`` meanwhile
    values: dict[str, _Seen] = {}
    for item in items:
        for name, value in item.items():
            seen = values.get(str(name))
            if seen is None:
                seen = values[str(name)] = _Seen()
            if _is_number(value):
                seen.add_number(value)
                continue
            text = texts.get(id(value))
            if text is None:
                text = texts[id(value)] = json.dumps(value, sort_keys=True)[:200]
            seen.texts.add(text)
    return values


def _outside_ratio(now: _Seen, before: _Seen | None) -> float | None:
    """How many times beyond the history's span an input's numbers here reach: the highest here over the
    history's highest, the history's lowest over the lowest here, the larger (``duration_s`` 60 against a
    history of 5 to 10: 6.0). None when no number lies outside or no ratio can be taken (the history had
    no number for it, or the values are zero or negative)."""
    if before is None or before.low is None or now.low is None:
        return None
    ratios = []
    if now.high > before.high > 0:
        ratios.append(now.high / before.high)
    if 0 < now.low < before.low:
        ratios.append(before.low / now.low)
    return max(ratios) if ratios else None


def _not_covered(now: _Seen, before: _Seen | None) -> list[str]:
    """The values of an input here that its history does not cover, as the note says them (at most
    ``_BASIS_SHOWN``): a number fits inside the span of the history's numbers for that input (the agent
    ran with values below and above it: ``duration_s=5`` against a history of 3.1 to 14.9 s is no
    misfit, where a value-by-value match called it one), any other value must be one the history had."""
    before = before or _Seen()
    out = sorted(t for t in now.texts if t not in before.texts)
    if now.low is not None and not (before.covers(now.low) and before.covers(now.high)):
        out = now.span() + out   # the span is whole: both its ends inside cover every number between
    return out[:_BASIS_SHOWN]


def history_basis(*, agent_definition, inputs: list[dict[str, Any]], forecast: dict[str, Any],
                  user) -> dict[str, Any]:
    """What the launch forecast's history is, and whether it fits these ``inputs``.

    ``forecast`` is ``billing.forecast`` output for ``agent_definition`` (its history is the
    agent definition's, this version's, finished tasks). The inputs of the agent's latest
    :data:`BASIS_CAMPAIGNS` campaigns with finished tasks of teams ``user`` may view
    (``launch.campaign_inputs``; one that cannot be read is skipped) are compared with ``inputs``
    input by input. Only those teams' campaigns: the values are shown, and an agent definition
    is shared by teams (attack review 5: engineering's run paths were shown to a research
    launcher). The run count and median run time stay every team's (``forecast``): durations,
    with no input, name or team in them.
    Returns ``{"runs": n finished tasks, "median_s": seconds | None, "agent": "name v2",
    "campaigns": n campaigns read, "differs": [{"name", "now": [values], "history": [values],
    "ratio": float | None}], "outside_ratio": float | None}``,
    ``differs`` listing (at most 3, values as text, at most 3 each) the inputs with values here the
    history does not cover (:func:`_not_covered`: a number outside the span of the history's numbers,
    another value it never had; the keys that only name a task's item, ``inputs.INPUT_IDENTIFIERS``,
    are not compared); ``now`` says those values, ``history`` what it had, numbers as their span
    ("3.1 to 14.9"), empty when it never had that input; ``ratio`` how many times beyond the history's
    numbers the input's reach (:func:`_outside_ratio`), ``outside_ratio`` the largest over every differing
    input (also those past the 3 named).
    """
    from dashboards.core.errors import LaunchError
    from dashboards.core.roles import teams_with
    from dashboards.launch.spool import campaign_inputs
    from dashboards.models import Campaign

    duration = forecast.get("duration_s") or {}
    basis: dict[str, Any] = {"runs": forecast.get("history") or 0, "median_s": duration.get("p50"),
                             "agent": f"{agent_definition.name} v{agent_definition.version}", "campaigns": 0,
                             "differs": [], "outside_ratio": None}
    if not basis["runs"]:
        return basis
    teams = teams_with(user, "view")
    ids: list[int] = []
    for campaign_id in (Task.objects.filter(campaign__agent_definition=agent_definition, campaign__team__in=teams,
                                            state__in=("done", "failed"))
                        .order_by("-ended_at", "-id").values_list("campaign_id", flat=True)[:1000]):
        if campaign_id not in ids:
            ids.append(campaign_id)
        if len(ids) == BASIS_CAMPAIGNS:
            break
    before: list[dict[str, Any]] = []
    for campaign in Campaign.objects.filter(pk__in=ids, team__in=teams):
        try:
            before.extend(campaign_inputs(campaign))
        except (LaunchError, ValueError):
            continue
        basis["campaigns"] += 1
    if not basis["campaigns"]:
        return basis
    old, new = _input_values(before), _input_values(inputs)
    names = INPUT_IDENTIFIERS.get(agent_definition.name, frozenset())
    for name in sorted(set(new) - names):
        outside = _not_covered(new[name], old.get(name))
        if outside:
            ratio = _outside_ratio(new[name], old.get(name))
            basis["differs"].append({"name": name, "now": outside,
                                     "history": old[name].shown() if name in old else [], "ratio": ratio})
            if ratio is not None and ratio > (basis["outside_ratio"] or 0):
                basis["outside_ratio"] = ratio
    basis["differs"] = basis["differs"][:_BASIS_SHOWN]
    return basis


#: How much wider the ranges grow when the history may not fit the inputs (``TCO_FORECAST_MISFIT_FACTOR``):
#: the 10th percentiles are divided by it, the 90th multiplied.
MISFIT_FACTOR = 2.0


def misfit_factor() -> float:
    return max(1.0, float(getattr(settings, "TCO_FORECAST_MISFIT_FACTOR", MISFIT_FACTOR)))


def widen_for_misfit(forecast: dict[str, Any], basis: dict[str, Any]) -> tuple[dict[str, Any], dict | None]:
    """The cost forecast (``billing.costs.forecast``) with its ranges widened when ``basis``
    (:func:`history_basis`) finds inputs the history never had, and what was done: ``(forecast,
    {"factor", "inputs", "text"} | None)``. The medians stay; each 10th percentile (tokens, dollars, run
    time) is divided by the factor and each 90th multiplied, so the finish and cost a campaign is held
    to are honest about the history not fitting. The factor is :func:`misfit_factor`, or how many times
    beyond the history's values an input reaches (``basis["outside_ratio"]``, rounded up to a tenth)
    when that is more: a range twice as wide was kept by a campaign whose input was 6 times the
    history's and which ran about 6 times as long (issue 24: it finished past the widened 90th
    percentile). Unchanged, with None, when the history fits or is none."""
    if not basis.get("differs") or forecast.get("no_history"):
        return forecast, None
    ratio = basis.get("outside_ratio")
    factor = max(misfit_factor(), math.ceil(ratio * 10) / 10 if ratio else 1.0)
    if factor == 1.0:
        return forecast, None
    big = Decimal(str(factor))
    cents = Decimal("0.000001")

    def wide(q: dict | None, kind):
        if not q:
            return q
        if kind is Decimal:
            return {"p10": (q["p10"] / big).quantize(cents), "p50": q["p50"], "p90": (q["p90"] * big).quantize(cents)}
        if kind is int:
            return {"p10": int(round(q["p10"] / factor)), "p50": q["p50"], "p90": int(round(q["p90"] * factor))}
        return {**q, "p10": q["p10"] / factor, "p90": q["p90"] * factor}

    out = dict(forecast)
    out["duration_s"] = wide(forecast.get("duration_s"), float)
    for key in ("tokens", "tokens_per_task"):
        out[key] = wide(forecast.get(key), int)
    for key in ("cost_usd", "cost_per_task"):
        out[key] = wide(forecast.get(key), Decimal)
    names = ", ".join(d["name"] for d in basis["differs"])
    why = f"since the history's inputs differ in {names}"
    if ratio and factor > misfit_factor():
        why += f", up to {ratio:.3g} times beyond the history's values"
    widened = {"factor": factor, "inputs": [d["name"] for d in basis["differs"]],
               "text": f"10th percentiles divided by {factor:g} and 90th percentiles multiplied by {factor:g}, {why}"}
    return out, widened



def complete_preview(*, user, request: LaunchRequest, preview: dict[str, Any],
                     ask_scheduler: bool = True) -> dict[str, Any]:
    """``preview`` (``service.launch_preview``) with ``count`` (tasks), ``basis``
    (:func:`history_basis`), the forecast widened when the history may not fit (``widened``,
    :func:`widen_for_misfit`), ``timing`` (:func:`timing_forecast` on the request's cluster, else
    the default, from the widened run times) and ``headroom`` (:func:`budget_headroom`). The launch
    keeps what this gives (``forecast_record``), with ``ask_scheduler`` False."""
    from dashboards.core.clusters import cluster_get_default

    preview["count"] = len(request.inputs)
    preview["basis"] = history_basis(agent_definition=request.agent_definition, inputs=list(request.inputs),
                                     forecast=preview["forecast"], user=user)
    preview["forecast"], preview["widened"] = widen_for_misfit(preview["forecast"], preview["basis"])
    preview["timing"] = timing_forecast(request, cluster=request.cluster or cluster_get_default(),
                                        duration_s=preview["forecast"]["duration_s"], user=user,
                                        ask_scheduler=ask_scheduler)
    preview["headroom"] = budget_headroom(preview["verdict"], preview["expected_usd"])
    return preview
