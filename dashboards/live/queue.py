"""The queue page's data: the user's campaigns, other jobs on the cluster, queue depth history.

Every read is scoped (``core.scope``). Nothing here loads every task: counts
come from the ``(campaign, state)`` index, task tables are paginated.
"""
from __future__ import annotations

import datetime as dt
from typing import Any

from django.db.models import Case, Count, IntegerField, Value, When
from django.utils import timezone

from dashboards.core.chunks import in_chunks
from dashboards.core.scope import (Scope, Who, campaigns_visible_to, tasks_visible_to, teams_visible_to,
                                   visible_team_ids)
from dashboards.core.stages import iso as _iso
from dashboards.core.stages import seconds_between as _seconds
from dashboards.core.states import QUEUED_STATES, UNFINISHED_CAMPAIGN
from dashboards.live import history
from dashboards.live.cluster import cluster_hosts, cluster_resources
from dashboards.live.counts import LiveCounts, add_counts, finished_campaign_states, live_counts, state_counts
from dashboards.live.tiles import scope_tiles
from dashboards.models import Campaign, Cluster, Task, Team
from schedulers.base import ACTIVE_STATES, LIFECYCLE_STATES, TERMINAL_STATES

RECENT_FINISHED = 20
CAMPAIGNS_PER_PAGE = 25
CAMPAIGNS_ON_QUEUE_PAGE = CAMPAIGNS_PER_PAGE  # kept for callers of the walking skeleton
OTHER_JOBS_SHOWN = 50


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


def queue_summary(user: Who, *, seat_resource: str = "anthropic_api", page: int = 1,
                  per_page: int = CAMPAIGNS_PER_PAGE, counts: LiveCounts | None = None,
                  tiles: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Everything the live queue page shows, scoped to ``user`` (a user or a ``core.scope.Scope``), as a
    JSON-ready dict. ``counts``: the live counts when the caller read them already (they are unscoped);
    ``tiles``: the audience's landing tiles when the caller built them already (``live.tiles.scope_tiles``).

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
    team_ids = visible_team_ids(user)
    admin = team_ids is None
    teams = {t.pk: t for t in (Team.objects.all() if admin else Team.objects.filter(pk__in=team_ids or []))}
    projects = {t.project: t for t in teams.values()}
    clusters = {c.pk: c for c in Cluster.objects.order_by("name")}
    counts = counts if counts is not None else live_counts()

    active_states = [s for s in LIFECYCLE_STATES if s in ACTIVE_STATES]
    totals = state_counts()
    by_cluster: dict[int, dict[str, int]] = {}
    by_queue: dict[tuple[int, str], dict[str, int]] = {}
    by_team: dict[str, dict[str, int]] = {}
    for c in counts.campaigns.values():
        if not admin and c["team_id"] not in team_ids:
            continue
        for bucket in (totals, by_cluster.setdefault(c["cluster_id"], state_counts()),
                       by_queue.setdefault((c["cluster_id"], c["queue"]), state_counts()),
                       by_team.setdefault(c["project"], state_counts())):
            add_counts(bucket, c["states"], active_states)
    other_jobs = None
    if admin:
        other_jobs = state_counts()
        for cluster_id, project, queue, state, n in counts.others:
            for bucket in (totals, other_jobs, by_cluster.setdefault(cluster_id, state_counts()),
                           by_queue.setdefault((cluster_id, queue), state_counts()),
                           by_team.setdefault(project or "", state_counts())):
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
        # The landing tiles of this audience (issue 24), built here once per change and audience, not per GET.
        "tiles": tiles if tiles is not None else scope_tiles(Scope(None if admin else frozenset(team_ids or ())),
                                                             seat_resource=seat_resource, now=now),
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


def campaign_list(user: Who, *, page: int = 1, per_page: int = CAMPAIGNS_PER_PAGE,
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
        rows.append(_campaign_row(c, live["states"] if live else finished_campaign_states(c)))
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
                                          "job_number": job_number, "tasks": n, "states": state_counts(),
                                          "name": "", "owner": "", "project": ""}
    numbers = sorted({j for _, j, _ in shown})
    for chunk in in_chunks(numbers):
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
                                     "owner": owner, "jobs": jobs, "tasks": n, "states": state_counts()}
    for cluster_id, owner, state, n in (base.values_list("cluster_id", "owner", "state")
                                        .annotate(n=Count("id")).order_by()):
        rows[(cluster_id, owner)]["states"][state] += n
    return sorted(rows.values(), key=lambda r: (-r["tasks"], r["cluster"], r["owner"]))


def queue_depth_history(user: Who, window: str = "hour") -> dict[str, Any]:
    """Queued (pending + held) and running tasks over the last hour or day, per team the user may see.

    Shape ``{"window": "hour"|"day", "t": [ISO, ...], "queued": {team: [n,
    ...]}, "running": [n, ...]}``; one point per stored sample (every
    ``TCO_DEPTH_SAMPLE_S`` for an hour, every minute for a day). Admins also
    see jobs tco did not launch (under their project, or "no project").
    """
    admin = visible_team_ids(user) is None
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
