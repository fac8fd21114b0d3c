"""Reads for pages, API, consumers and metrics; every read is scoped to what a user may see.

An admin (staff) sees every team and every job on the cluster; anyone else
sees the campaigns of the teams they may ``view`` (roles.py) and nothing of
jobs tco did not launch. Queue-wide numbers (slots, seats, quotas) are the
cluster's and are shown to every signed-in user; share-tree usage is shown
per team, for the teams the user may see.

Nothing here loads every task: counts come from the ``(campaign, state)``
index (campaigns that are not finished, plus the page of campaigns shown),
task tables are paginated, stage statistics read one row of floats per task
of one campaign and are cached for ``TCO_STAGE_CACHE_S`` (dashboards/stages.py).
Files of the spool are read by dashboards/spool_files.py.
"""
from __future__ import annotations

import dataclasses
import datetime as dt
import re
from decimal import Decimal
from typing import Any, Iterable

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.core.cache import cache
from django.db.models import Case, Count, F, IntegerField, Q, QuerySet, Sum, Value, When
from django.db.models.functions import NullIf
from django.utils import timezone

from execution.spool.contract import TOKEN_BUCKETS
from schedulers.base import ACTIVE_STATES, LIFECYCLE_STATES, SCHEDULER_STATES, TERMINAL_STATES
from schedulers.calendars import annotate_queues
from schedulers.hosts import QINSTANCE_LETTERS

from . import history
from .health import task_note
from .models import AccountingRecord, Campaign, Cluster, ModelRequest, Task, Team
from .roles import is_admin, teams_with
from .spool_files import read_spool_file, task_output_path, task_outputs
from .stages import campaign_stages, submit_seconds, task_stages, timeline
from .stages import iso as _iso
from .stages import seconds_between as _seconds

RECENT_FINISHED = 20
CAMPAIGNS_PER_PAGE = 25
CAMPAIGNS_ON_QUEUE_PAGE = CAMPAIGNS_PER_PAGE  # kept for callers of the walking skeleton
TASKS_PER_PAGE = 100
OTHER_JOBS_SHOWN = 50
REQUESTS_SHOWN = 200
FAILURE_STATES = ("error", "failed", "lost")
QUEUED_STATES = ("pending", "held")
UNFINISHED_CAMPAIGN = ("submitting", "submitted", "running", "paused", "waiting")
CHUNK = 900  # SQLite: at most 999 parameters in one IN (...)
TOKEN_FIELDS = TOKEN_BUCKETS  # the disjoint buckets (execution/spool.py); reasoning is inside output


# --------------------------------------------------------------------------- scope

def teams_visible_to(user: AbstractBaseUser) -> QuerySet[Team]:
    """Teams whose campaigns ``user`` may see (roles.py, capability ``view``)."""
    return teams_with(user, "view")


def visible_team_ids(user: AbstractBaseUser) -> set[int] | None:
    """Ids of the teams ``user`` may view; None means every team (an admin)."""
    if is_admin(user):
        return None
    return set(teams_visible_to(user).values_list("pk", flat=True))


def campaigns_visible_to(user: AbstractBaseUser) -> QuerySet[Campaign]:
    if is_admin(user):
        return Campaign.objects.all()
    return Campaign.objects.filter(team__in=teams_visible_to(user))


def tasks_visible_to(user: AbstractBaseUser) -> QuerySet[Task]:
    """Tasks of campaigns the user may see; admins also see jobs tco did not launch."""
    if is_admin(user):
        return Task.objects.all()
    return Task.objects.filter(campaign__team__in=teams_visible_to(user))


def campaign_for(user: AbstractBaseUser, campaign_id: int) -> Campaign:
    """The campaign, if ``user`` may view it. Raises ``Campaign.DoesNotExist`` otherwise."""
    return campaigns_visible_to(user).select_related("team", "cluster", "agent_definition").get(pk=campaign_id)


def task_for(user: AbstractBaseUser, task_id: int) -> Task:
    """The task, if ``user`` may view it. Raises ``Task.DoesNotExist`` otherwise."""
    return tasks_visible_to(user).select_related("cluster", "campaign", "campaign__team",
                                                 "campaign__agent_definition").get(pk=task_id)


def scope_key(user: AbstractBaseUser) -> str:
    """A string equal for users who see exactly the same teams: ``admin`` or ``teams:1,4``."""
    ids = visible_team_ids(user)
    return "admin" if ids is None else "teams:" + ",".join(str(i) for i in sorted(ids))


# --------------------------------------------------------------------------- helpers

def _money(value: Decimal | None) -> str | None:
    """USD as a string with 8 decimals (the models' precision); sums from SQLite carry more."""
    return None if value is None else format(Decimal(value).quantize(Decimal("1e-8")), "f")


def _state_counts(rows: Iterable[tuple[str, int]] = ()) -> dict[str, int]:
    counts = {state: 0 for state in LIFECYCLE_STATES}
    for state, n in rows:
        counts[state] = counts.get(state, 0) + n
    return counts


def _add_counts(into: dict[str, int], counts: dict[str, int], only: Iterable[str] | None = None) -> None:
    for state in only if only is not None else counts:
        into[state] = into.get(state, 0) + counts.get(state, 0)


def _chunks(items: list, size: int = CHUNK) -> Iterable[list]:
    for i in range(0, len(items), size):
        yield items[i:i + size]


def jsonable(value: Any) -> Any:
    """``value`` with datetimes as ISO strings (UTC, ``Z``), Decimals as strings, tuples and sets as lists."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if isinstance(value, dt.datetime):
        return _iso(value.astimezone(dt.timezone.utc) if value.tzinfo else value)
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value


# --------------------------------------------------------------------------- live counts

@dataclasses.dataclass
class LiveCounts:
    """Task counts of the queue right now, unscoped (scoping is the caller's).

    ``campaigns``: id -> ``{"id", "cluster_id", "team_id", "project", "queue",
    "states": {state: n}}`` for every campaign that is not finished (all its
    tasks, terminal ones included). ``others``: ``[(cluster_id, project,
    queue, state, n)]`` for active tasks of jobs tco did not launch.
    """

    campaigns: dict[int, dict]
    others: list[tuple[int, str, str, str, int]]


def live_counts() -> LiveCounts:
    """Counts from the ``(campaign, state)`` index: unfinished campaigns and jobs tco did not launch."""
    campaigns = {
        row["id"]: {**row, "states": _state_counts()}
        for row in Campaign.objects.filter(status__in=UNFINISHED_CAMPAIGN).values(
            "id", "cluster_id", "team_id", "queue", project=F("team__project"))
    }
    for chunk in _chunks(sorted(campaigns)):
        for campaign_id, state, n in (Task.objects.filter(campaign_id__in=chunk)
                                      .values_list("campaign_id", "state").annotate(n=Count("id"))
                                      .order_by()):
            campaigns[campaign_id]["states"][state] += n
    others = list(
        Task.objects.filter(campaign__isnull=True, active=True)
        .values_list("cluster_id", "project", "queue", "state").annotate(n=Count("id")).order_by()
    )
    return LiveCounts(campaigns=campaigns, others=others)


def depth_counts(counts: LiveCounts | None = None) -> dict[str, dict[str, dict[str, int]]]:
    """Active tasks per cluster name, project and state: what a queue-depth sample stores.

    Shape ``{"dev": {"research": {"pending": 120, "running": 96}}}``; jobs
    without a project are under ``""``; states with no task are left out.
    """
    counts = counts or live_counts()
    names = dict(Cluster.objects.values_list("pk", "name"))
    out: dict[str, dict[str, dict[str, int]]] = {}

    def add(cluster_id: int, project: str, state: str, n: int) -> None:
        if n and state in ACTIVE_STATES:
            per_state = out.setdefault(names.get(cluster_id, str(cluster_id)), {}).setdefault(project or "", {})
            per_state[state] = per_state.get(state, 0) + n

    for c in counts.campaigns.values():
        for state, n in c["states"].items():
            add(c["cluster_id"], c["project"], state, n)
    for cluster_id, project, _queue, state, n in counts.others:
        add(cluster_id, project, state, n)
    return out


def _finished_campaign_states(campaign: Campaign) -> dict[str, int]:
    """State counts of a campaign with no active task; cached (they no longer change)."""
    key = f"campaign-states:{campaign.pk}:{campaign.status}:{_iso(campaign.finished_at)}"
    counts = cache.get(key)
    if counts is None:
        counts = _state_counts(campaign.tasks.values_list("state").annotate(n=Count("id")).order_by())
        cache.set(key, counts, 86400)
    return counts


# --------------------------------------------------------------------------- cluster resources

def cluster_resources(cluster: Cluster, seat_resource: str, projects: set[str] | None = None) -> dict[str, Any]:
    """Slots per cluster queue, model API seats, consumables, RQS limits and share tree from the last status poll.

    Returns ``{"queues": [{name, used, resv, available, total, ..., and for a queue with a
    calendar: calendar, calendar_state, calendar_next_change, calendar_text}], "slots":
    [queue_slots() rows], "seats":
    {resource, used, capacity} | None, "consumables": [{resource, used,
    capacity}], "quotas": [{rule, resource, limit, used, filters}],
    "share_tree": [{node, project, shares, job_count, actual_share,
    long_target_share, usage, ...}], "share_tree_error", "status_at": ISO}``.
    Consumables are the global host's: capacity from its ``complex_values``
    and what ``qhost -F`` says is left. ``projects``: the share-tree nodes
    shown (None: every node, for admins).
    """
    status = cluster.status or {}
    free: dict[str, float] = {}
    for host in status.get("hosts", []):
        if host.get("name") == "global":
            for name, value in (host.get("resources") or {}).items():
                if isinstance(value, dict):  # {"value": "13.000000", "dominance": "gc"}
                    value = value.get("value")
                try:
                    free[name] = float(value)
                except (TypeError, ValueError):
                    continue
    consumables = []
    for resource, capacity in sorted((status.get("global_capacity") or {}).items()):
        if resource in free:
            consumables.append({"resource": resource, "capacity": capacity,
                                "used": round(capacity - free[resource], 6)})
    seats = next((c for c in consumables if c["resource"] == seat_resource), None)
    share_tree = [
        node for node in status.get("share_tree", [])
        if projects is None or (node.get("project") in projects)
    ]
    return {
        # Calendar state and next change worked out now from the stored definitions (schedulers.calendars).
        "queues": annotate_queues(status.get("queues", []), None, timezone.now()),
        "slots": queue_slots(status.get("queues", []), status.get("queue_instances") or []),
        "seats": seats,
        "consumables": consumables,
        "quotas": status.get("quotas", []),
        "share_tree": share_tree,
        "share_tree_error": status.get("share_tree_error") if projects is None else None,
        "status_at": _iso(cluster.status_at),
    }


#: Queue instance state letters under which Grid Engine starts no new task there (qstat(1): the
#: letters qstat -g c counts as aoACDS "temporarily disabled" and cdsuE "manual intervention").
NO_DISPATCH_LETTERS = frozenset("aoACDScdsuE")


def queue_slots(queues: list[dict], instances: list[dict]) -> list[dict]:
    """One definition of a cluster queue's slots for the queue page, as parts that add up to the total.

    ``queues``: ``qstat -g c -xml`` rows (``parse_cluster_queue_summary``);
    ``instances``: ``qstat -f -explain aAcE -xml`` rows (``schedulers.hosts.
    parse_queue_instances``), [] when the poll has none. Returns, per cluster
    queue in ``queues``' order, ``{"name", "total", "in_use", "reserved",
    "unavailable", "free", "unavailable_instances": [{"name", "states",
    "meanings", "slots"}], "source"}`` (slots, ints) where:

    - ``in_use``: slots held by tasks placed there (running, suspended or
      ending), the ``used`` of qstat -f / -g c, on every instance;
    - ``reserved``: slots held by advance reservations now (``resv``);
    - ``unavailable``: the other slots of instances in a state that stops
      dispatch (:data:`NO_DISPATCH_LETTERS`: disabled, unknown, alarm,
      suspended, calendar, error ...): they exist but no task can start there;
    - ``free``: the other slots of instances that take work.

    ``in_use + reserved + unavailable + free == total`` (an instance holding
    more than its slots counts none free). A resource quota (RQS) may
    still cap the queue below its free slots; qquota's ``used`` counts only
    the tasks its rule's filters match. Without instances the split comes
    from qstat -g c alone (``source`` "qstat -g c": its ``available`` is the
    free slots, the rest of the total not in use or reserved is unavailable).
    """
    by_queue: dict[str, list[dict]] = {}
    for qi in instances:
        by_queue.setdefault(qi.get("queue", ""), []).append(qi)
    out = []
    for q in queues:
        mine = by_queue.get(q["name"])
        if mine:
            row = {"name": q["name"], "total": 0, "in_use": 0, "reserved": 0, "unavailable": 0, "free": 0,
                   "unavailable_instances": [], "source": "queue instances"}
            for qi in mine:
                total, used, resv = int(qi["slots_total"]), int(qi["slots_used"]), int(qi["slots_resv"])
                rest = max(0, total - used - resv)
                row["total"] += total
                row["in_use"] += used
                row["reserved"] += resv
                blocking = [letter for letter in qi.get("states", "") if letter in NO_DISPATCH_LETTERS]
                if blocking:
                    row["unavailable"] += rest
                    row["unavailable_instances"].append({
                        "name": qi["name"], "states": "".join(blocking), "slots": rest,
                        "meanings": [QINSTANCE_LETTERS.get(letter, "state not known to tco") for letter in blocking]})
                else:
                    row["free"] += rest
        else:
            total, used, resv = int(q.get("total", 0)), int(q.get("used", 0)), int(q.get("resv", 0))
            free = max(0, min(int(q.get("available", 0)), total - used - resv))
            row = {"name": q["name"], "total": total, "in_use": used, "reserved": resv,
                   "unavailable": max(0, total - used - resv - free), "free": free,
                   "unavailable_instances": [], "source": "qstat -g c"}
        out.append(row)
    return out


HOST_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")  # a host name (RFC 1123 letters), as a filter


def host_filter(value: object) -> str | None:
    """A host-name filter from a request: the name, or None for anything that is not one."""
    return value if isinstance(value, str) and HOST_RE.fullmatch(value) else None


HOST_TASKS_SHOWN = 12  # task links per host on the queue page (the count is always whole)


def cluster_hosts(cluster: Cluster, user: AbstractBaseUser) -> dict[str, Any]:
    """The cluster's execution hosts from the last status poll, with the active tasks ``user`` may see on each.

    Returns ``{"hosts": [...], "problems": [...]}``: ``hosts`` as
    ``schedulers.hosts.host_states`` (name, state up/unreachable/error/alarm/closed/
    disabled, why, load_avg, num_proc, mem_total_bytes, mem_used_bytes,
    slots_used, slots_total, queues) with ``tasks``: ``{"count": n,
    "shown": [{id, task_id, campaign_id, state}]}`` (at most
    ``HOST_TASKS_SHOWN``); ``problems``: queue instances in any state (alarm,
    unknown, disabled, error ...) with what the letters mean and the
    scheduler's reasons (``schedulers.hosts.instance_problems``).
    """
    from schedulers.hosts import host_states, instance_problems

    status = cluster.status or {}
    instances = status.get("queue_instances") or []
    visible = tasks_visible_to(user).filter(cluster=cluster, active=True).exclude(host="")
    counts = dict(visible.values_list("host").annotate(n=Count("id")).order_by())
    hosts = host_states(status.get("hosts") or [], instances)
    for host in hosts:  # one query per host that has tasks (a cluster has tens of hosts, not thousands)
        shown = visible.filter(host=host["name"]).order_by("job_number", "task_number")[:HOST_TASKS_SHOWN]
        host["tasks"] = {"count": counts.get(host["name"], 0),
                         "shown": [{"id": t.pk, "task_id": t.task_id, "campaign_id": t.campaign_id, "state": t.state}
                                   for t in shown] if counts.get(host["name"]) else []}
    return {"hosts": hosts, "problems": instance_problems(instances)}


# --------------------------------------------------------------------------- queue page

def _campaign_row(c: Campaign, states: dict[str, int]) -> dict[str, Any]:
    ended = sum(states.get(s, 0) for s in TERMINAL_STATES)
    return {
        "id": c.pk,
        "name": c.name,
        "team": c.team.name,
        "project": c.team.project,
        "cluster": c.cluster.name,
        "queue": c.queue,
        "job_number": c.job_number,
        "task_count": c.task_count,
        "tasks": f"1-{c.task_count}" if c.task_count > 1 else "1",
        "status": c.status,
        "urgent": c.urgent,
        "launched_at": _iso(c.launched_at),
        "progress_pct": round(100.0 * ended / c.task_count, 1) if c.task_count else 0.0,
        "states": states,
    }


def queue_summary(user: AbstractBaseUser, *, seat_resource: str = "anthropic_api", page: int = 1,
                  per_page: int = CAMPAIGNS_PER_PAGE) -> dict[str, Any]:
    """Everything the live queue page shows, scoped to ``user``, as a JSON-ready dict.

    Shape::

        {"generated_at": ISO, "states": [lifecycle states],
         "clusters": [{name, polled_at, poll_age_s, poll_error, accounting_error, flavour, accounting_path, queues, seats,
                       consumables, quotas, share_tree, status_at,
                       hosts, problems}],            # cluster_hosts()
         "totals": {state: n}                 # active tasks the user may see
         "by_cluster": [{cluster, states}], "by_queue": [{cluster, queue, states}],
         "by_team": [{team, project, states}],  # active states only
         "campaigns": [{id, name, team, project, cluster, queue, job_number,
                        task_count, tasks, status, urgent, launched_at,
                        progress_pct, states}],  # one page, unfinished first
         "campaigns_page": {page, pages, per_page, total},
         "other_jobs": {state: n} | None,      # admins: jobs tco did not launch
         "other_job_rows": [{cluster, job_number, name, owner, project,
                             tasks, states}] | None, "other_jobs_more": int,
         "other_owner_rows": [{cluster, owner, jobs, tasks, states}] | None,  # one line per owner
         "recent_finished": [{id, task_id, name, campaign, campaign_id, state,
                              project, host, wallclock_s, exit_status,
                              failed_code, ended_at}]}

    Counts are aggregated in the database; no task row is loaded except the
    newest finished ones and the first jobs tco did not launch.
    """
    admin = is_admin(user)
    team_ids = visible_team_ids(user)
    teams = {t.pk: t for t in (Team.objects.all() if admin else Team.objects.filter(pk__in=team_ids or []))}
    projects = {t.project: t for t in teams.values()}
    clusters = {c.pk: c for c in Cluster.objects.order_by("name")}
    counts = live_counts()

    active_states = [s for s in LIFECYCLE_STATES if s in ACTIVE_STATES]
    totals = _state_counts()
    by_cluster: dict[int, dict[str, int]] = {}
    by_queue: dict[tuple[int, str], dict[str, int]] = {}
    by_team: dict[str, dict[str, int]] = {}
    for c in counts.campaigns.values():
        if not admin and c["team_id"] not in team_ids:
            continue
        for bucket in (totals, by_cluster.setdefault(c["cluster_id"], _state_counts()),
                       by_queue.setdefault((c["cluster_id"], c["queue"]), _state_counts()),
                       by_team.setdefault(c["project"], _state_counts())):
            _add_counts(bucket, c["states"], active_states)
    other_jobs = None
    if admin:
        other_jobs = _state_counts()
        for cluster_id, project, queue, state, n in counts.others:
            for bucket in (totals, other_jobs, by_cluster.setdefault(cluster_id, _state_counts()),
                           by_queue.setdefault((cluster_id, queue), _state_counts()),
                           by_team.setdefault(project or "", _state_counts())):
                bucket[state] = bucket.get(state, 0) + n

    campaign_rows, campaigns_page = campaign_list(user, page=page, per_page=per_page, counts=counts)

    other_rows = other_owners = None
    other_more = 0
    if admin:
        other_rows, other_more = _other_job_rows(clusters)
        other_owners = _other_owner_rows(clusters)

    finished = (
        tasks_visible_to(user).filter(state__in=TERMINAL_STATES, ended_at__isnull=False)
        .select_related("campaign")
        .order_by("-ended_at", "-id")[:RECENT_FINISHED]
    )
    now = timezone.now()
    cluster_rows = []
    for cluster in clusters.values():
        cluster_rows.append({
            "name": cluster.name,
            "polled_at": _iso(cluster.polled_at),
            "poll_age_s": _seconds(cluster.polled_at, now),
            "poll_error": cluster.poll_error,
            "accounting_error": cluster.accounting_error,
            "flavour": cluster.flavour,
            "accounting_path": cluster.accounting_path,
            **cluster_resources(cluster, seat_resource, None if admin else set(projects)),
            **cluster_hosts(cluster, user),
        })

    def team_label(project: str) -> str:
        team = projects.get(project)
        return team.name if team else (f"project {project}" if project else "no project")

    return {
        "generated_at": _iso(now),
        "states": list(LIFECYCLE_STATES),
        "active_states": active_states,
        "clusters": cluster_rows,
        "totals": totals,
        "by_cluster": [{"cluster": clusters[k].name if k in clusters else str(k), "states": v}
                       for k, v in sorted(by_cluster.items())],
        "by_queue": [{"cluster": clusters[k[0]].name if k[0] in clusters else str(k[0]), "queue": k[1] or "",
                      "states": v} for k, v in sorted(by_queue.items())],
        "by_team": [{"team": team_label(p), "project": p, "states": v} for p, v in sorted(by_team.items())],
        "campaigns": campaign_rows,
        "campaigns_page": campaigns_page,
        "other_jobs": other_jobs,
        "other_job_rows": other_rows,
        "other_jobs_more": other_more,
        "other_owner_rows": other_owners,
        "recent_finished": [
            {
                "id": t.pk,
                "task_id": t.task_id,
                "name": t.name,
                "campaign": t.campaign.name if t.campaign else None,
                "campaign_id": t.campaign_id,
                "state": t.state,
                "project": t.project,
                "host": t.host,
                "wallclock_s": t.wallclock_s,
                "exit_status": t.exit_status,
                "failed_code": t.failed_code,
                "ended_at": _iso(t.ended_at),
            }
            for t in finished
        ],
    }


def campaign_list(user: AbstractBaseUser, *, page: int = 1, per_page: int = CAMPAIGNS_PER_PAGE,
                  counts: LiveCounts | None = None, status: str | None = None) -> tuple[list[dict], dict]:
    """One page of the campaigns ``user`` may see, unfinished first, then newest first, with state counts.

    Returns ``(rows, {"page", "pages", "per_page", "total"})``; rows as in
    ``queue_summary``'s ``campaigns``. ``status`` filters on the campaign
    status. Counts of unfinished campaigns come from ``counts`` (read when
    None), those of finished ones from a cache.
    """
    visible = campaigns_visible_to(user)
    if status:
        visible = visible.filter(status=status)
    total = visible.count()
    pages = max(1, -(-total // per_page))
    page = min(max(page, 1), pages)
    first = (page - 1) * per_page
    on_page = list(
        visible.select_related("team", "cluster")
        .annotate(finished_rank=Case(When(status__in=UNFINISHED_CAMPAIGN, then=Value(0)), default=Value(1),
                                     output_field=IntegerField()))
        .order_by("finished_rank", "-launched_at", "-pk")[first:first + per_page]
    )
    if counts is None and any(c.status in UNFINISHED_CAMPAIGN for c in on_page):
        counts = live_counts()
    rows = []
    for c in on_page:
        live = counts.campaigns.get(c.pk) if counts else None
        rows.append(_campaign_row(c, live["states"] if live else _finished_campaign_states(c)))
    return rows, {"page": page, "pages": pages, "per_page": per_page, "total": total}


def _other_job_rows(clusters: dict[int, Cluster]) -> tuple[list[dict], int]:
    """Jobs tco did not launch, one row per (array) job with its state counts; the first OTHER_JOBS_SHOWN."""
    base = Task.objects.filter(campaign__isnull=True, active=True)
    jobs = list(base.values_list("cluster_id", "job_number").annotate(n=Count("id"))
                .order_by("cluster_id", "job_number"))
    shown = jobs[:OTHER_JOBS_SHOWN]
    if not shown:
        return [], 0
    rows: dict[tuple[int, int], dict] = {}
    for cluster_id, job_number, n in shown:
        rows[(cluster_id, job_number)] = {"cluster": clusters[cluster_id].name if cluster_id in clusters else "",
                                          "job_number": job_number, "tasks": n, "states": _state_counts(),
                                          "name": "", "owner": "", "project": ""}
    numbers = sorted({j for _, j, _ in shown})
    for chunk in _chunks(numbers):
        for cluster_id, job_number, name, owner, project, state, n in (
                base.filter(job_number__in=chunk)
                .values_list("cluster_id", "job_number", "name", "owner", "project", "state")
                .annotate(n=Count("id")).order_by()):
            row = rows.get((cluster_id, job_number))
            if row is not None:
                row.update(name=name, owner=owner, project=project)
                row["states"][state] += n
    return list(rows.values()), max(0, len(jobs) - len(shown))


def _other_owner_rows(clusters: dict[int, Cluster]) -> list[dict]:
    """Active jobs tco did not launch, one line per (cluster, owner): ``{"cluster", "owner",
    "jobs", "tasks", "states"}`` (counts), most tasks first (issue 16: collapsed per owner).
    Two aggregate queries, whatever the number of jobs."""
    base = Task.objects.filter(campaign__isnull=True, active=True)
    rows: dict[tuple[int, str], dict] = {}
    for cluster_id, owner, jobs, n in (base.values_list("cluster_id", "owner")
                                       .annotate(jobs=Count("job_number", distinct=True), n=Count("id")).order_by()):
        rows[(cluster_id, owner)] = {"cluster": clusters[cluster_id].name if cluster_id in clusters else "",
                                     "owner": owner, "jobs": jobs, "tasks": n, "states": _state_counts()}
    for cluster_id, owner, state, n in (base.values_list("cluster_id", "owner", "state")
                                        .annotate(n=Count("id")).order_by()):
        rows[(cluster_id, owner)]["states"][state] += n
    return sorted(rows.values(), key=lambda r: (-r["tasks"], r["cluster"], r["owner"]))


def queue_depth_history(user: AbstractBaseUser, window: str = "hour") -> dict[str, Any]:
    """Queued (pending + held) and running tasks over the last hour or day, per team the user may see.

    Shape ``{"window": "hour"|"day", "t": [ISO, ...], "queued": {team: [n,
    ...]}, "running": [n, ...]}``; one point per stored sample (every
    ``TCO_DEPTH_SAMPLE_S`` for an hour, every minute for a day). Admins also
    see jobs tco did not launch (under their project, or "no project").
    """
    admin = is_admin(user)
    teams = Team.objects.all() if admin else teams_visible_to(user)
    names = {t.project: t.name for t in teams}
    samples = history.depth_samples(window)
    times: list[str] = []
    running: list[int] = []
    queued: dict[str, list[int]] = {}
    for i, sample in enumerate(samples):
        times.append(_iso(dt.datetime.fromtimestamp(sample["t"], dt.timezone.utc)))
        run_n = 0
        seen: dict[str, int] = {}
        for per_project in (sample.get("c") or {}).values():
            for project, per_state in per_project.items():
                if project in names:
                    label = names[project]
                elif admin:
                    label = f"project {project}" if project else "no project"
                else:
                    continue
                seen[label] = seen.get(label, 0) + sum(per_state.get(s, 0) for s in QUEUED_STATES)
                run_n += per_state.get("running", 0)
        for label in seen:
            queued.setdefault(label, [0] * i)
        for label, series in queued.items():
            series.append(seen.get(label, 0))
        running.append(run_n)
    return {"window": window, "t": times, "queued": queued, "running": running}


# --------------------------------------------------------------------------- campaign page

def _tokens(task: Task | ModelRequest) -> int:
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
        "tokens": _tokens(t),
        "cost_usd": _money(t.cost_usd),
        "exit_status": t.exit_status,
        "failed_code": t.failed_code,
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


def campaign_detail(user: AbstractBaseUser, campaign_id: int, *, page: int = 1, per_page: int = TASKS_PER_PAGE,
                    state: str | None = None, sort: str | None = None, descending: bool = False,
                    q: str = "", host: str | None = None) -> dict[str, Any]:
    """One campaign's progress, a page of its tasks (failures and errors first) and its stage table.

    Raises ``Campaign.DoesNotExist`` when the campaign is not visible to
    ``user``; ``ValueError`` for an unknown ``state`` filter. JSON-ready::

        {"generated_at", "campaign": {id, name, team, project, cluster, queue,
          job_number, task_count, status, submit_error, urgent, priority,
          agent, model, seats_per_task, concurrency_cap, launched_at,
          submitted_at, finished_at, submit_s},
         "states": {state: n}, "ended": n, "failures": n, "progress_pct": float,
         "tasks": [{id, task_id, task_number, state, state_code, host, queue,
                    submitted_at, started_at, ended_at, queue_wait_s,
                    sandbox_start_s, agent_work_s, integration_overhead_s,
                    tokens, cost_usd, exit_status, failed_code, verdict, flags}],
         "page", "pages", "per_page", "state_filter", "host_filter",
         "hosts": [{"host", "tasks"}],   # execution hosts of its tasks, with counts
         "stages": campaign_stages(...)}

    With no ``state`` filter and no ``sort`` the pages list errors, failures
    and lost tasks first, then the others by task number; both parts come
    from indexes. ``sort`` (a key of :data:`TASK_SORTS`, ``descending``)
    orders every task instead; ``q`` keeps the tasks whose number is ``q`` or
    whose host or verdict contains it. The answer repeats ``sort``,
    ``descending``, ``q`` and counts the matches in ``matching``.
    ``host`` keeps only the tasks on that execution host (their latest
    attempt's host), with any of the above.
    """
    from .control import WAITING, campaign_states

    if state == WAITING:  # tasks that wait for the -hold_jid_ad predecessor are held (hqw) in the scheduler
        state = "held"
    if state is not None and state not in LIFECYCLE_STATES:
        raise ValueError(f"unknown state {state!r}")
    campaign = campaign_for(user, campaign_id)
    tasks = Task.objects.filter(campaign=campaign)
    states = _state_counts(tasks.values_list("state").annotate(n=Count("id")).order_by())
    states = campaign_states(campaign, states)  # held -> waiting while they wait for the predecessor
    waiting = WAITING in states  # the task rows say so too (qstat's hqw reads "held")
    ended = sum(states[s] for s in TERMINAL_STATES)
    failures = sum(states[s] for s in FAILURE_STATES)
    if sort not in TASK_SORTS:
        sort = None
    q = (q or "").strip()[:100]
    hosts = list(tasks.exclude(host="").values_list("host").annotate(n=Count("id")).order_by("host"))
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
        "stages": campaign_stages(campaign, states),
    }


# --------------------------------------------------------------------------- agent page



def _policy(task: Task) -> dict[str, Any]:
    record = task.runner_record or {}
    if isinstance(record.get("policy"), str) and record["policy"].strip():
        return {"text": record["policy"], "source": "runner record"}
    campaign = task.campaign
    if campaign is not None and campaign.policy.strip():
        return {"text": campaign.policy, "source": "campaign"}
    if campaign is not None and campaign.agent_definition.default_policy.strip():
        return {"text": campaign.agent_definition.default_policy,
                "source": f"agent definition {campaign.agent_definition}"}
    return {"text": "", "source": None}


def _task_requests(task: Task) -> dict[str, Any]:
    qs = ModelRequest.objects.filter(task=task)
    totals = qs.aggregate(n=Count("id"), cost=Sum("cost_usd"), **{f: Sum(f) for f in (*TOKEN_FIELDS,
                                                                                          "reasoning_tokens")})
    rows = []
    for r in qs.order_by("seq")[:REQUESTS_SHOWN]:
        rows.append({
            "seq": r.seq, "at": _iso(r.at), "provider": r.provider, "method": r.method, "path": r.path,
            "status": r.status, "requested_model": r.requested_model, "model": r.model,
            **{f: getattr(r, f) for f in (*TOKEN_FIELDS, "reasoning_tokens")},
            "tokens": _tokens(r), "cost_usd": _money(r.cost_usd), "complete": r.complete,
            "latency_ms": r.latency_ms, "flags": list(r.flags or []),
        })
    return {
        "rows": rows,
        "count": totals["n"] or 0,
        "shown": len(rows),
        "totals": {**{f: totals[f] or 0 for f in (*TOKEN_FIELDS, "reasoning_tokens")},
                   "cost_usd": _money(totals["cost"])},
    }


def task_detail(user: AbstractBaseUser, task_id: int, *, with_scheduler: bool = True) -> dict[str, Any]:
    """Everything the agent page shows about one task, JSON-ready. Raises ``Task.DoesNotExist``.

    Shape::

        {"generated_at", "task": {id, task_id, job_number, task_number, name,
           owner, project, state, state_code, restarted, active, queue, host,
           slots, priority, submitted_at, started_at, ended_at, wallclock_s,
           cpu_s, maxvmem_bytes, failed_code, exit_status, verdict, flags,
           tokens: {bucket: n, total}, cost_usd,
           accounting_check: {status: "confirmed"|"differs", buckets, message} | None},
         "campaign": {id, name, team} | None,
         "timeline": [{stage, label, start, end, seconds, overhead}],
         "stages": {queue_wait, sandbox_start, agent_work, integration_overhead} (s),
         "policy": {text, source}, "requests": {rows, count, shown, totals},
         "stdout": read_spool_file, "stderr": read_spool_file,
         "outputs": {dir, files, more, error},
         "runner": {exit_status, signal, flags, error, hostname} | None,
         "accounting": [accounting record dicts],
         "scheduler": job_detail_cached | None   # while the task is in qstat
         "pending_reasons": [{text, raw}] | None}  # while pending, held or in error
    """
    from schedulers.pending import explain_pending

    from .scheduler_cache import job_detail_cached, pending_position

    task = task_for(user, task_id)
    record = task.runner_record or None
    accounting = [
        jsonable({k: v for k, v in row.items() if k not in ("id", "cluster_id", "task_id")})
        for row in AccountingRecord.objects.filter(task=task).order_by("end_us").values()[:20]
    ]
    scheduler = None
    reasons = None
    in_qstat = task.active and task.state in SCHEDULER_STATES
    if with_scheduler and in_qstat:
        scheduler = job_detail_cached(task.cluster, task.job_number)
        if task.state in ("pending", "held", "error") and scheduler["detail"]:
            status = task.cluster.status or {}
            from .reservations import reservation_context
            reasons = explain_pending(scheduler["detail"], status.get("quotas"), status.get("hosts"),
                                      status.get("global_capacity"), queues=status.get("queues"),
                                      **reservation_context(status))
            reasons += pending_position(task.cluster, task.job_number, task.project)
    tokens = {f: getattr(task, f) for f in (*TOKEN_FIELDS, "reasoning_tokens")}
    tokens["total"] = _tokens(task)
    campaign = task.campaign
    return {
        "generated_at": _iso(timezone.now()),
        "task": {
            "id": task.pk, "task_id": task.task_id, "job_number": task.job_number,
            "task_number": task.task_number, "name": task.name, "owner": task.owner, "project": task.project,
            "state": task.state, "state_code": shown_state_code(task), "restarted": task.restarted,
            "runner_note": task_note(task),
            "active": task.active, "queue": task.queue, "host": task.host, "slots": task.slots,
            "priority": task.priority, "submitted_at": _iso(task.submitted_at),
            "started_at": _iso(task.started_at), "ended_at": _iso(task.ended_at),
            "wallclock_s": task.wallclock_s, "cpu_s": task.cpu_s, "maxvmem_bytes": task.maxvmem_bytes,
            "failed_code": task.failed_code, "exit_status": task.exit_status, "verdict": task.verdict,
            "flags": list(task.usage_flags or []), "tokens": tokens, "cost_usd": _money(task.cost_usd),
            "accounting_check": task.accounting_check,
        },
        "campaign": ({"id": campaign.pk, "name": campaign.name, "team": campaign.team.name}
                     if campaign is not None else None),
        "timeline": timeline(task),
        "stages": task_stages(task),
        "policy": _policy(task),
        "requests": _task_requests(task),
        "stdout": read_spool_file(task_output_path(task, "stdout")),
        "stderr": read_spool_file(task_output_path(task, "stderr")),
        "outputs": task_outputs(task),
        "runner": ({k: record.get(k) for k in ("exit_status", "signal", "flags", "error", "hostname",
                                                 "stdout_truncated", "stderr_truncated")}
                   if isinstance(record, dict) else None),
        "accounting": accounting,
        "accounting_rows": [accounting_fields(row) for row in accounting],
        "scheduler": scheduler,
        "pending_reasons": reasons,
        "progress": task_progress(task),
        "neighbours": task_neighbours(user, task),
    }


#: Accounting record fields as people read them: field -> (label, unit kind).
ACCOUNTING_LABELS = {
    "job_number": ("job", ""), "task_number": ("array task", ""), "pe_taskid": ("parallel task", ""),
    "submitted_at": ("submitted (UTC)", "time"), "started_at": ("started (UTC)", "time"),
    "ended_at": ("ended (UTC)", "time"), "job_name": ("job name", ""), "owner": ("owner", ""),
    "group": ("group", ""), "project": ("project", ""), "department": ("department", ""),
    "account": ("account", ""), "queue": ("queue", ""), "hostname": ("host", ""), "slots": ("slots", ""),
    "wallclock_s": ("wall clock", "s"), "wallclock_exact_s": ("wall clock, exact", "s"),
    "cpu_s": ("CPU time", "s"), "maxvmem_bytes": ("peak virtual memory", "bytes"),
    "failed": ("failed code (0: none)", ""), "exit_status": ("exit status", ""), "category": ("requests (-l, -q, -P)", ""),
}
_HIDDEN_ACCOUNTING = {"submission_us", "start_us", "end_us", "usage"}


def _bytes_text(value: float) -> str:
    """Bytes in binary units: ``1.50 GiB (1610612736 bytes)``."""
    n = float(value)
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.2f} {unit} ({n:.0f} bytes)"
    return f"{n:.0f} bytes"


def accounting_fields(row: dict[str, Any]) -> list[list[str]]:
    """One accounting record (``AccountingRecord`` values, JSON-ready) as ``[[label, text]]``:
    plain names, seconds with ``s`` (and minutes or hours past a minute), memory in KiB/MiB/GiB,
    times in UTC without the zone letter; empty and internal fields left out."""
    out = []
    for key, value in row.items():
        if key in _HIDDEN_ACCOUNTING or value is None or value == "":
            continue
        label, kind = ACCOUNTING_LABELS.get(key, (key.replace("_", " "), ""))
        if kind == "s":
            seconds = float(value)
            text = f"{seconds:.3f} s" if seconds < 60 else f"{seconds:.0f} s ({_duration_text(seconds)})"
        elif kind == "bytes":
            text = _bytes_text(value)
        elif kind == "time":
            text = str(value).replace("T", " ").replace("Z", "").split("+")[0]
        else:
            text = str(value)
        out.append([label, text])
    return out


def _duration_text(seconds: float) -> str:
    total = int(round(seconds))
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours} h {minutes:02d} min" if hours else f"{minutes} min {secs:02d} s"


def task_progress(task: Task, *, now: dt.datetime | None = None) -> dict[str, Any] | None:
    """While a task runs: ``{"started_at": ISO, "elapsed_s", "expected_s", "expected_from",
    "timeout_s", "pct"}`` (None otherwise). ``expected_s`` is the campaign's median run time
    (scheduler start to end, finished tasks) when at least one task ended, else the agent's
    timeout; ``pct`` is elapsed over expected, at most 99 while it still runs."""
    start = task.task_started_at or task.started_at
    if not task.active or task.state not in ("running", "starting", "suspended", "finishing") or start is None:
        return None
    now = now or timezone.now()
    elapsed = max((now - start).total_seconds(), 0.0)
    campaign = task.campaign
    timeout = campaign.agent_definition.timeout_s if campaign is not None else None
    expected, source = None, ""
    if campaign is not None:
        walls = sorted(Task.objects.filter(campaign=campaign, state="done", wallclock_s__isnull=False)
                       .values_list("wallclock_s", flat=True)[:1000])
        if walls:
            from .stages import quantile

            expected, source = quantile(walls, 0.5), f"median of {len(walls)} finished task(s)"
    if expected is None and timeout:
        expected, source = float(timeout), "the agent's timeout"
    pct = None if not expected else round(min(99.0, 100.0 * elapsed / expected), 1)
    return {"started_at": _iso(start), "elapsed_s": round(elapsed, 3), "expected_s": expected,
            "expected_from": source, "timeout_s": timeout, "pct": pct}


def task_neighbours(user: AbstractBaseUser, task: Task) -> dict[str, Any]:
    """The previous and next task of the same campaign by task number, that ``user`` may see:
    ``{"previous": {id, task_id} | None, "next": {id, task_id} | None}`` (both None outside a campaign)."""
    out: dict[str, Any] = {"previous": None, "next": None}
    if task.campaign_id is None:
        return out
    siblings = tasks_visible_to(user).filter(campaign_id=task.campaign_id)
    before = siblings.filter(task_number__lt=task.task_number).order_by("-task_number", "-id").first()
    after = siblings.filter(task_number__gt=task.task_number).order_by("task_number", "id").first()
    for key, found in (("previous", before), ("next", after)):
        if found is not None:
            out[key] = {"id": found.pk, "task_id": found.task_id}
    return out


def task_logs(user: AbstractBaseUser, task_id: int) -> dict[str, Any]:
    """The live tail of a task's stdout and stderr: ``{"stdout": read_spool_file, "stderr": ...,
    "active": bool, "generated_at"}``. Raises ``Task.DoesNotExist``."""
    task = task_for(user, task_id)
    return {"stdout": read_spool_file(task_output_path(task, "stdout")),
            "stderr": read_spool_file(task_output_path(task, "stderr")),
            "active": task.active, "generated_at": _iso(timezone.now())}


# --------------------------------------------------------------------------- usage

# --------------------------------------------------------------------------- metrics

USAGE_FIELDS = (*TOKEN_FIELDS, "reasoning_tokens", "cost_usd")


def _campaign_usage(campaign_ids: list[int]) -> dict[int, dict[str, Any]]:
    """Token and cost sums per campaign: ``{id: {input_tokens, ..., cost_usd (Decimal)}}``."""
    found: dict[int, dict[str, Any]] = {}
    for chunk in _chunks(campaign_ids):
        for row in (Task.objects.filter(campaign_id__in=chunk).values("campaign_id")
                    .annotate(**{f: Sum(f) for f in USAGE_FIELDS}).order_by()):
            found[row.pop("campaign_id")] = row
    return found


def usage_by_project() -> list[dict[str, Any]]:
    """Every campaign task's token and cost totals per project, for /metrics (unscoped).

    ``[{"project", "input_tokens", ..., "reasoning_tokens", "cost_usd" (Decimal)}]``.
    Only tco's campaigns are metered. A finished campaign's sums no longer
    change and are cached per campaign for a day, so a scrape reads the tasks
    of unfinished campaigns only (after the first).
    """
    campaigns = list(Campaign.objects.values_list("pk", "status", "finished_at", "team__project"))
    keys = {pk: f"campaign-usage:{pk}:{_iso(finished_at)}" for pk, status, finished_at, _ in campaigns
            if status not in UNFINISHED_CAMPAIGN}
    cached = cache.get_many(list(keys.values())) if keys else {}
    sums: dict[int, dict[str, Any]] = {pk: cached[key] for pk, key in keys.items() if key in cached}
    missing = [pk for pk, *_ in campaigns if pk not in sums]
    fresh = _campaign_usage(missing)
    to_cache = {keys[pk]: fresh.get(pk, {}) for pk in missing if pk in keys}
    if to_cache:
        cache.set_many(to_cache, 86400)
    sums.update(fresh)
    per_project: dict[str, dict[str, Any]] = {}
    for pk, _status, _finished, project in campaigns:
        row = sums.get(pk) or {}
        total = per_project.setdefault(project, {"project": project, **{f: 0 for f in USAGE_FIELDS}})
        for f in USAGE_FIELDS:
            total[f] += row.get(f) or 0
    return [per_project[p] for p in sorted(per_project)]


def metrics_snapshot() -> dict[str, Any]:
    """Unscoped numbers for /metrics (its access is checked by the view).

    ``{"depth": depth_counts(), "clusters": [Cluster], "checkpoints":
    [IngestCheckpoint], "usage": usage_by_project()}``.
    """
    from .models import IngestCheckpoint

    return {
        "depth": depth_counts(),
        "clusters": list(Cluster.objects.order_by("name")),
        "checkpoints": list(IngestCheckpoint.objects.select_related("cluster")),
        "usage": usage_by_project(),
    }


# --------------------------------------------------------------------------- audit log (admins)

AUDIT_PER_PAGE = 50
#: Sort keys of the audit table: URL ``sort`` -> the ordering (newest first by default).
AUDIT_SORTS = {"at": ("at", "id"), "who": ("user__username", "at"), "action": ("action", "at"),
               "target": ("target", "at"), "ok": ("ok", "at")}
AUDIT_FILTERS = ("action", "who", "ok", "q", "since", "until")
_PARAM_LABELS = {"job_number": "job", "tasks": "tasks", "priority": "priority", "status": "status",
                 "cluster": "cluster", "campaign": "campaign", "control": "scheduler action", "command": "command",
                 "count": "tasks", "period": "period", "amount_usd": "amount (USD)", "path": "page"}


def audit_search(user: AbstractBaseUser, *, action: str = "", who: str = "", ok: str = "", q: str = "",
                 since: dt.date | None = None, until: dt.date | None = None, sort: str = "at",
                 descending: bool = True) -> QuerySet:
    """Audit entries an admin asked for: exact ``action``, ``who`` (user name), ``ok`` ("yes"/"no"),
    ``q`` (text in the target or result), days ``since``..``until`` (UTC, inclusive), ordered by
    ``sort`` (a key of :data:`AUDIT_SORTS`). Raises ``audit.ActionRefused`` for non-admins."""
    from .audit import ActionRefused
    from .models import AuditEntry

    if not is_admin(user):
        raise ActionRefused("only admins may read the audit log")
    entries = AuditEntry.objects.select_related("user")
    if action:
        entries = entries.filter(action=action)
    if who:
        entries = entries.filter(user__username=who)
    if ok in ("yes", "no"):
        entries = entries.filter(ok=ok == "yes")
    if q:
        entries = entries.filter(Q(target__icontains=q) | Q(result__icontains=q))
    if since:
        entries = entries.filter(at__gte=dt.datetime.combine(since, dt.time.min, tzinfo=dt.timezone.utc))
    if until:
        entries = entries.filter(at__lt=dt.datetime.combine(until + dt.timedelta(days=1), dt.time.min,
                                                            tzinfo=dt.timezone.utc))
    order = AUDIT_SORTS.get(sort, AUDIT_SORTS["at"])
    return entries.order_by(*(f"-{f}" if descending else f for f in order), "-id" if descending else "id")


def audit_params_text(params: dict) -> list[tuple[str, str]]:
    """An audit entry's parameters as ``[(label, text)]`` people read: task ranges as ``1-3,5``
    (``all`` for the whole job), lists joined, None as ``—``; known keys get plain names."""
    out = []
    for key, value in (params or {}).items():
        if key == "tasks" and (value is None or (isinstance(value, list) and all(
                isinstance(r, list) and len(r) == 2 for r in value))):
            from .control import ranges_text

            text = ranges_text(value)
        elif value is None or value == "":
            text = "—"
        elif isinstance(value, bool):
            text = "yes" if value else "no"
        elif isinstance(value, list):
            text = ", ".join(str(v) for v in value)
        elif isinstance(value, dict):
            text = ", ".join(f"{k}={v}" for k, v in value.items())
        else:
            text = str(value)
        out.append((_PARAM_LABELS.get(key, key.replace("_", " ")), text))
    return out


def audit_target_link(target: str) -> str:
    """The page of an audit target (``campaign:12``, ``job:812``, ``team:research``, ``agent:x:v1``),
    or "" when it has none."""
    from django.urls import NoReverseMatch, reverse

    kind, _, rest = (target or "").partition(":")
    try:
        if kind == "campaign" and rest.isdigit():
            return reverse("ops-campaign", args=[int(rest)])
        if kind == "job" and rest.isdigit():
            return reverse("ops-triage") + f"?q={rest}"
        if kind == "team" and rest:
            return reverse("ops-audit") + f"?q=team:{rest}"
        if kind == "agent":
            return reverse("ops-agents")
    except NoReverseMatch:
        return ""
    return ""
