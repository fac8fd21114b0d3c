"""Task counts per state for the live views: one read of the ``(campaign, state)`` index per change."""
from __future__ import annotations

import dataclasses
from typing import Iterable

from django.core.cache import cache
from django.db.models import Count, F

from dashboards.core.chunks import in_chunks
from dashboards.core.stages import iso as _iso
from dashboards.core.states import UNFINISHED_CAMPAIGN
from dashboards.models import Campaign, Cluster, Task
from schedulers.base import ACTIVE_STATES, LIFECYCLE_STATES


def state_counts(rows: Iterable[tuple[str, int]] = ()) -> dict[str, int]:
    counts = {state: 0 for state in LIFECYCLE_STATES}
    for state, n in rows:
        counts[state] = counts.get(state, 0) + n
    return counts


def add_counts(into: dict[str, int], counts: dict[str, int], only: Iterable[str] | None = None) -> None:
    for state in only if only is not None else counts:
        into[state] = into.get(state, 0) + counts.get(state, 0)


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
        row["id"]: {**row, "states": state_counts()}
        for row in Campaign.objects.filter(status__in=UNFINISHED_CAMPAIGN).values(
            "id", "cluster_id", "team_id", "queue", project=F("team__project"))
    }
    for chunk in in_chunks(sorted(campaigns)):
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


def finished_campaign_states(campaign: Campaign) -> dict[str, int]:
    """State counts of a campaign with no active task; cached (they no longer change)."""
    key = f"campaign-states:{campaign.pk}:{campaign.status}:{_iso(campaign.finished_at)}"
    counts = cache.get(key)
    if counts is None:
        counts = state_counts(campaign.tasks.values_list("state").annotate(n=Count("id")).order_by())
        cache.set(key, counts, 86400)
    return counts
