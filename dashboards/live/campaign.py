"""A campaign's page data: its counts, stages, controls and a page of its task table (sortable, filtered)."""
from __future__ import annotations

from typing import Any

from django.db.models import Count, F, Q, Value
from django.db.models.functions import NullIf
from django.utils import timezone

from dashboards.core.encoding import money_text
from dashboards.core.failures import failure_of, infrastructure_filter
from dashboards.core.health import task_note
from dashboards.core.scope import Who, campaign_for
from dashboards.core.stages import campaign_stages, submit_seconds, task_stages
from dashboards.core.stages import iso as _iso
from dashboards.core.states import FAILURE_STATES, TOKEN_FIELDS
from dashboards.launch.forecast_record import forecast_outcome, outcome_view
from dashboards.live.counts import state_counts
from dashboards.models import ModelRequest, Task
from schedulers.base import LIFECYCLE_STATES, TERMINAL_STATES

TASKS_PER_PAGE = 100


# --------------------------------------------------------------------------- campaign page

def tokens_of(task: Task | ModelRequest) -> int:
    return sum(getattr(task, f) for f in TOKEN_FIELDS)


def shown_state_code(task: Task) -> str:
    """qstat's state letters (``qw``, ``hqw``, ``r``...) while the task is in the scheduler, else "".

    The letters are the last poll's and mean nothing once the task has ended: a finished task
    never shows "done (hqw)" on the agent page or in a campaign's task table.
    """
    return task.state_code if task.active else ""


def _shown_as(row: dict[str, Any], held_as: str | None) -> dict[str, Any]:
    """``row`` with a ``held`` state shown as ``held_as`` (``waiting`` while the campaign waits for its
    predecessor: SGE shows a dependency wait as hqw, control.campaign_states); unchanged for None."""
    if held_as and row["state"] == "held":
        row["state"] = held_as
    return row


def failure_dict(task: Task) -> dict[str, str] | None:
    """Why ``task`` failed, in words, and whose failure it was (``core.failures``):
    ``{"kind": "infrastructure" | "agent" | "limit" | "ended", "text"}``, None when it did not fail."""
    found = failure_of(state=task.state, failed_code=task.failed_code, exit_status=task.exit_status, host=task.host,
                       runner=task.runner_record)
    return {"kind": found.kind, "text": found.text} if found is not None else None


def _task_row(t: Task) -> dict[str, Any]:
    return {
        "id": t.pk,
        "task_id": t.task_id,
        "task_number": t.task_number,
        "state": t.state,
        "state_code": shown_state_code(t),
        "runner_note": task_note(t),  # finished per its runner while the scheduler still lists it
        "host": t.host,
        "queue": t.queue,
        "submitted_at": _iso(t.submitted_at),
        "started_at": _iso(t.task_started_at or t.started_at),
        "ended_at": _iso(t.ended_at),
        **{f"{k}_s": v for k, v in task_stages(t).items()},
        "tokens": tokens_of(t),
        "cost_usd": money_text(t.cost_usd),
        "exit_status": t.exit_status,
        "failed_code": t.failed_code,
        "failure": failure_dict(t),
        "verdict": t.verdict,
        "flags": list(t.usage_flags or []),
    }


#: Sort keys of a campaign's task table: URL ``sort`` -> the Task field (the task number breaks ties).
TASK_SORTS = {"task": "task_number", "state": "state", "host": "host", "started": "started_at",
              "ended": "ended_at", "wallclock": "wallclock_s", "cost": "cost_usd", "exit": "exit_status",
              "verdict": "verdict"}


def task_table_choice(sort: str | None, direction: str | None, q: str | None) -> dict[str, Any]:
    """A task table's sort and search as given in a URL or a WebSocket message, checked:
    ``{"sort": key of TASK_SORTS | None, "descending": bool, "q": str (at most 100 characters)}``."""
    return {"sort": sort if sort in TASK_SORTS else None, "descending": direction == "desc",
            "q": (q or "").strip()[:100]}


def campaign_whole(user: Who, campaign_id: int) -> dict[str, Any]:
    """What a campaign page shows whatever its page and filters: ``{"campaign": Campaign, "states",
    "waiting", "ended", "failures", "infrastructure", "hosts": [(host, n)], "stages", "outcome":
    launch.forecast_record.outcome_view (None for a campaign that kept no forecast)}``. Raises
    ``Campaign.DoesNotExist`` when the campaign is not visible to ``user``. The live producer reads it
    once per campaign and pass, for all the views of that campaign (pages, filters, sorts)."""
    from dashboards.core.holds import WAITING, campaign_states

    campaign = campaign_for(user, campaign_id)
    tasks = Task.objects.filter(campaign=campaign)
    states = state_counts(tasks.values_list("state").annotate(n=Count("id")).order_by())
    states = campaign_states(campaign, states)  # held -> waiting while they wait for the predecessor
    failures = sum(states[s] for s in FAILURE_STATES)
    return {
        "campaign": campaign,
        "states": states,
        "waiting": WAITING in states,  # the task rows say so too (qstat's hqw reads "held")
        "ended": sum(states[s] for s in TERMINAL_STATES),
        "failures": failures,
        "infrastructure": tasks.filter(infrastructure_filter()).count() if failures else 0,
        "hosts": list(tasks.exclude(host="").values_list("host").annotate(n=Count("id")).order_by("host")),
        "stages": campaign_stages(campaign, states),
        "outcome": outcome_view(forecast_outcome(campaign)),
    }


def campaign_detail(user: Who, campaign_id: int, *, page: int = 1, per_page: int = TASKS_PER_PAGE,
                    state: str | None = None, sort: str | None = None, descending: bool = False,
                    q: str = "", host: str | None = None, whole: dict[str, Any] | None = None) -> dict[str, Any]:
    """One campaign's progress, a page of its tasks (failures and errors first) and its stage table.

    Raises ``Campaign.DoesNotExist`` when the campaign is not visible to
    ``user``; ``ValueError`` for an unknown ``state`` filter. JSON-ready::

        {"generated_at", "campaign": {id, name, team, project, cluster, queue,
          job_number, task_count, status, submit_error, urgent, priority,
          agent, model, seats_per_task, concurrency_cap, launched_at,
          submitted_at, finished_at, submit_s},
         "states": {state: n}, "ended": n, "failures": n, "infrastructure_failures": n,
         "progress_pct": float,
         "tasks": [{id, task_id, task_number, state, state_code, host, queue,
                    submitted_at, started_at, ended_at, queue_wait_s,
                    sandbox_start_s, agent_work_s, integration_overhead_s,
                    tokens, cost_usd, exit_status, failed_code, failure: {kind, text} | None,
                    verdict, flags}],
         "page", "pages", "per_page", "state_filter", "host_filter",
         "hosts": [{"host", "tasks"}],   # execution hosts of its tasks, with counts
         "stages": campaign_stages(...),
         "outcome": forecast_record.outcome_view(...) | None}  # the launch forecast beside the outcome

    With no ``state`` filter and no ``sort`` the pages list errors, failures
    and lost tasks first, then the others by task number; both parts come
    from indexes. ``sort`` (a key of :data:`TASK_SORTS`, ``descending``)
    orders every task instead; ``q`` keeps the tasks whose number is ``q`` or
    whose host or verdict contains it. The answer repeats ``sort``,
    ``descending``, ``q`` and counts the matches in ``matching``.
    ``host`` keeps only the tasks on that execution host (their latest
    attempt's host), with any of the above.
    """
    from dashboards.core.holds import WAITING

    if state == WAITING:  # tasks that wait for the -hold_jid_ad predecessor are held (hqw) in the scheduler
        state = "held"
    if state is not None and state not in LIFECYCLE_STATES:
        raise ValueError(f"unknown state {state!r}")
    if whole is None or whole["campaign"].pk != int(campaign_id):
        whole = campaign_whole(user, campaign_id)
    campaign, states, waiting = whole["campaign"], whole["states"], whole["waiting"]
    ended, failures, infrastructure, hosts = whole["ended"], whole["failures"], whole["infrastructure"], whole["hosts"]
    tasks = Task.objects.filter(campaign=campaign)
    if sort not in TASK_SORTS:
        sort = None
    q = (q or "").strip()[:100]
    if host:
        tasks = tasks.filter(host=host)
        failures_here = tasks.filter(state__in=FAILURE_STATES).count()
    else:
        failures_here = failures
    chosen = tasks.filter(state=state) if state else tasks
    if q:
        chosen = chosen.filter(Q(host__icontains=q) | Q(verdict__icontains=q)
                               | (Q(task_number=int(q)) if q.isdigit() else Q(pk__in=[])))
    if q or sort or host:
        total = chosen.count()
    else:
        total = states.get(state, states.get(WAITING, 0) if state == "held" else 0) if state else sum(states.values())
    pages = max(1, -(-total // per_page))
    page = min(max(page, 1), pages)
    first = (page - 1) * per_page
    if q or sort:
        field = TASK_SORTS[sort or "task"]
        # An empty host or verdict (not yet known) sorts with the unknowns: last, either way.
        value = NullIf(F(field), Value("")) if field in ("host", "verdict") else F(field)
        order = value.desc(nulls_last=True) if descending else value.asc(nulls_last=True)
        tie = "-task_number" if descending else "task_number"
        rows = list(chosen.order_by(order, tie, "id")[first:first + per_page])
    elif state:
        rows = list(tasks.filter(state=state).order_by("task_number")[first:first + per_page])
    else:
        rows = []
        if first < failures_here:
            rows = list(tasks.filter(state__in=FAILURE_STATES).order_by("task_number")[first:first + per_page])
        room = per_page - len(rows)
        if room > 0:
            offset = max(0, first - failures_here)
            rows += list(tasks.exclude(state__in=FAILURE_STATES).order_by("task_number")[offset:offset + room])
    agent = campaign.agent_definition
    return {
        "generated_at": _iso(timezone.now()),
        "campaign": {
            "id": campaign.pk,
            "name": campaign.name,
            "team": campaign.team.name,
            "project": campaign.team.project,
            "cluster": campaign.cluster.name,
            "queue": campaign.queue,
            "job_number": campaign.job_number,
            "task_count": campaign.task_count,
            "status": campaign.status,
            "submit_error": campaign.submit_error,
            "urgent": campaign.urgent,
            "priority": campaign.priority,
            "agent": f"{agent.name} v{agent.version}",
            "model": campaign.model or agent.default_model,
            "seats_per_task": campaign.seats_per_task,
            "concurrency_cap": campaign.concurrency_cap,
            "launched_at": _iso(campaign.launched_at),
            "submitted_at": _iso(campaign.submitted_at),
            "finished_at": _iso(campaign.finished_at),
            "submit_s": submit_seconds(campaign),
        },
        "states": states,
        "ended": ended,
        "done": ended,  # the walking skeleton's name
        "failures": failures,
        # Of the failures, the infrastructure's (a host lost, the shepherd failed): retried in one action.
        "infrastructure_failures": infrastructure,
        "progress_pct": round(100.0 * ended / campaign.task_count, 1) if campaign.task_count else 0.0,
        "tasks": [_shown_as(_task_row(t), WAITING if waiting else None) for t in rows],
        "page": page,
        "pages": pages,
        "per_page": per_page,
        "state_filter": state,
        "sort": sort,
        "descending": bool(descending),
        "q": q,
        "matching": total,
        "host_filter": host,
        "hosts": [{"host": h, "tasks": n} for h, n in hosts],
        "stages": whole["stages"],
        "outcome": whole["outcome"],
    }
