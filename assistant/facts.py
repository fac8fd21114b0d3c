"""The scheduler facts behind "why is this task pending": one provider per kind of fact.

A provider is a function ``(ctx: FactContext) -> value | None``; ``None``
(or an empty list) means "nothing to say" and the fact is left out of the
answer. ``PROVIDERS`` maps a fact's name to its provider, in the order the
answer lists them; another kind of fact (a new scheduler feature) is one more
entry, e.g. ``PROVIDERS["reservations"] = my_provider``.

The sources are what tco already holds: the cached ``qstat -j`` of the job
(``dashboards.core.scheduler_cache.job_detail_cached``, ``parse_job_detail``
shape) and the cluster's last status poll (``Cluster.status``:
``dashboards.clusters`` writes queues, hosts, quotas, global_capacity,
share_tree), read through ``dashboards.live.cluster.cluster_resources`` so the
share tree shows only the teams the caller may see, as on the queue page.
Reservations (``qrstat``) and queue calendars are read when the status poll
holds them (keys ``reservations`` and a queue's ``calendar``); until then
those facts are absent, never invented.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from django.db.models import Count, QuerySet

from dashboards.models import Task

__all__ = ["FactContext", "PROVIDERS", "pending_facts", "held_predecessor_reasons"]


@dataclass(frozen=True)
class FactContext:
    """What a provider may read.

    ``task``: the tco task (already scoped to the caller). ``detail``: its
    job's ``qstat -j`` (``parse_job_detail`` dict, JSON-ready) or None when
    the scheduler did not answer. ``status``: the cluster's last status poll
    (``Cluster.status`` dict). ``resources``: ``selectors.cluster_resources``
    for the caller (queues, seats, consumables, quotas, share_tree).
    ``position``: ``scheduler_cache.pending_position`` entries ``[{text, raw}]``.
    ``visible_tasks``: the tasks the caller may see (``selectors.tasks_visible_to``);
    a provider that looks at other jobs looks only through it.
    """

    task: Task
    detail: dict | None
    status: dict
    resources: dict
    position: list[dict]
    visible_tasks: QuerySet[Task]


def _requested(detail: dict | None) -> dict[str, str]:
    """The job's hard resource requests (``-l``) as ``{name: value}``; master/slave sets fill in the rest."""
    detail = detail or {}
    found = {str(k): str(v) for k, v in (detail.get("hard_resources") or {}).items()}
    for scoped in (detail.get("scoped_requests") or {}).values():
        for name, value in ((scoped or {}).get("hard_resources") or {}).items():
            found.setdefault(str(name), str(value))
    return found


def _queue_names(ctx: FactContext) -> set[str]:
    """Cluster queues the job may use: its ``-q`` list (queue part of ``q@host``), else its tco queue."""
    names = {q.split("@")[0] for q in (ctx.detail or {}).get("hard_queues") or []}
    if not names and ctx.task.campaign is not None and ctx.task.campaign.queue:
        names.add(ctx.task.campaign.queue)
    if not names and ctx.task.queue:
        names.add(ctx.task.queue.split("@")[0])
    return names


def dependencies(ctx: FactContext) -> dict | None:
    """``{"predecessors": [job numbers], "holds": {kind: [[first, last, step]]}, "predecessor_states":
    [{job_number, states: {lifecycle state: tasks}}]}`` (``-hold_jid``/``-hold_jid_ad``, ``-h``).

    ``predecessor_states``: what tco's last poll says of each predecessor's
    active tasks, for predecessors the caller may see (others are left out).
    """
    detail = ctx.detail or {}
    predecessors, holds = list(detail.get("predecessors") or []), dict(detail.get("holds") or {})
    if not predecessors and not holds:
        return None
    states: dict[int, dict[str, int]] = {}
    rows = (ctx.visible_tasks.filter(cluster=ctx.task.cluster, job_number__in=predecessors, active=True)
            .values_list("job_number", "state").annotate(n=Count("pk")).order_by())
    for job_number, state, n in rows:
        states.setdefault(job_number, {})[state] = n
    return {"predecessors": predecessors, "holds": holds,
            "predecessor_states": [{"job_number": j, "states": states[j]} for j in predecessors if j in states]}


def held_predecessor_reasons(dependencies_fact: dict | None) -> list[dict]:
    """``[{text, raw}]``: one reason per predecessor the caller may see whose active tasks are all held
    (the job waits for a job that cannot start until someone releases it)."""
    reasons = []
    for row in (dependencies_fact or {}).get("predecessor_states") or []:
        states = row["states"]
        if states and set(states) == {"held"}:
            reasons.append({"text": f"job {row['job_number']}, which it waits for, is held: it starts only "
                                    f"when released (qrls)",
                            "raw": f"predecessor {row['job_number']}: {states['held']} task(s) held"})
    return reasons


def requests(ctx: FactContext) -> dict | None:
    """What the job asked for: ``{"resources": {name: value}, "queues": [-q]}``."""
    detail = ctx.detail or {}
    resources, queues = _requested(detail), list(detail.get("hard_queues") or [])
    if not resources and not queues:
        return None
    return {"resources": resources, "queues": queues}


def consumables(ctx: FactContext) -> list[dict] | None:
    """Global consumables the job requests: ``[{resource, requested, capacity, used, free}]`` (counts)."""
    wanted = _requested(ctx.detail)
    rows = []
    for row in ctx.resources.get("consumables") or []:
        if row["resource"] in wanted:
            rows.append({"resource": row["resource"], "requested": wanted[row["resource"]],
                         "capacity": row["capacity"], "used": row["used"],
                         "free": round(row["capacity"] - row["used"], 6)})
    return rows or None


def quotas(ctx: FactContext) -> list[dict] | None:
    """Resource quota (RQS) limits in force, from ``qquota``: ``[{rule, resource, limit, used, filters}]``."""
    return list(ctx.resources.get("quotas") or []) or None


def share_tree(ctx: FactContext) -> list[dict] | None:
    """The share-tree node(s) of the task's project (sge_share_mon), when the caller may see that team."""
    project = ctx.task.project
    return [node for node in ctx.resources.get("share_tree") or [] if node.get("project") == project] or None


def queues(ctx: FactContext) -> list[dict] | None:
    """The cluster queues the job may use, as the last poll saw them (slots used/total, states, calendar)."""
    names = _queue_names(ctx)
    return [q for q in ctx.resources.get("queues") or [] if q.get("name") in names] or None


def calendars(ctx: FactContext) -> list[dict] | None:
    """``[{queue, calendar, ...}]`` for the job's queues whose poll entry names a calendar (calendar_conf(5))."""
    names = _queue_names(ctx)
    rows = []
    for q in ctx.status.get("queues") or []:
        if q.get("name") in names and q.get("calendar") not in (None, "", "NONE"):
            rows.append({"queue": q.get("name"), **{k: v for k, v in q.items() if k.startswith("calendar")}})
    return rows or None


def reservations(ctx: FactContext) -> list[dict] | None:
    """The advance reservation the job was submitted into (``-ar``), from the poll's ``qrstat`` list.

    Only the job's own reservation: other reservations may belong to teams the
    caller cannot see.
    """
    detail = ctx.detail or {}
    ar = detail.get("advance_reservation") or detail.get("ar")
    if ar in (None, "", 0):
        return None
    found = [r for r in ctx.status.get("reservations") or [] if str(r.get("id")) == str(ar)]
    return found or [{"id": ar, "known": False}]


def position(ctx: FactContext) -> list[dict] | None:
    """The job's place in the cluster's priority order and its team's share standing (``policy_position``)."""
    return ctx.position or None


def scheduler_messages(ctx: FactContext) -> list[str] | None:
    """What ``qstat -j`` said about this job, as the scheduler wrote it (``schedd_job_info``)."""
    return list((ctx.detail or {}).get("scheduler_messages") or []) or None


PROVIDERS: dict[str, Callable[[FactContext], Any]] = {
    "dependencies": dependencies,
    "requests": requests,
    "consumables": consumables,
    "quotas": quotas,
    "share_tree": share_tree,
    "queues": queues,
    "calendars": calendars,
    "reservations": reservations,
    "position": position,
    "scheduler_messages": scheduler_messages,
}


def pending_facts(ctx: FactContext) -> dict[str, Any]:
    """``{fact name: value}`` for every provider in ``PROVIDERS`` that has something to say."""
    out = {}
    for name, provider in PROVIDERS.items():
        value = provider(ctx)
        if value not in (None, [], {}):
            out[name] = value
    return out
