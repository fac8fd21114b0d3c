"""A campaign's status follows its tasks: pending, running, waiting, finished (and the launcher's notice)."""
from __future__ import annotations

import logging
from typing import Iterable

from django.db import transaction
from django.utils import timezone

from dashboards.core import enqueue
from dashboards.core.chunks import in_chunks
from dashboards.models import (
    CAMPAIGN_LIVE,
    CAMPAIGN_TRANSITIONS,
    Campaign,
    CampaignStatus,
    Cluster,
    Task,
    transition,
)

log = logging.getLogger(__name__)


def campaigns_by_job(cluster: Cluster, job_numbers: Iterable[int]) -> dict[int, int]:
    """Campaign ids of unfinished campaigns, by their array job number."""
    found: dict[int, int] = {}
    for chunk in in_chunks(sorted(set(job_numbers))):
        for pk, job in Campaign.objects.filter(cluster=cluster, job_number__in=chunk).exclude(
            status="finished"
        ).values_list("pk", "job_number"):
            found[job] = pk
    return found


#: Active task states in which a campaign counts as running (its job holds slots or is leaving them).
_RUNNING_STATES = frozenset({"starting", "running", "suspended", "deleting", "unknown", "finishing"})


def campaign_status_of(states: dict[str, int], *, waits_for_predecessor: bool = False) -> str | None:
    """A submitted campaign's status from its active tasks' states (``{state: n}``):
    ``running`` when one runs (or is finishing), else, when tasks are held and none is pending,
    ``waiting`` if they wait for the campaign's ``-hold_jid_ad`` predecessor
    (``waits_for_predecessor``: ``control.waits_for_predecessor``) or ``paused``, else
    ``submitted``; None when no task is active (finishing is ingest's)."""
    if not any(states.values()):
        return None
    if any(states.get(s) for s in _RUNNING_STATES):
        return CampaignStatus.RUNNING
    if states.get("held") and not states.get("pending"):
        return CampaignStatus.WAITING if waits_for_predecessor else CampaignStatus.PAUSED
    return CampaignStatus.SUBMITTED


def campaign_status_follow(campaign_ids: Iterable[int]) -> int:
    """Move submitted, running and paused campaigns to the status their active tasks imply
    (:func:`campaign_status_of`), through ``CAMPAIGN_TRANSITIONS``; returns how many moved."""
    ids = sorted(set(campaign_ids))
    moved = 0
    for chunk in in_chunks(ids):
        current = dict(Campaign.objects.filter(pk__in=chunk, status__in=CAMPAIGN_LIVE).values_list("pk", "status"))
        states: dict[int, dict[str, int]] = {}
        for pk, state in Task.objects.filter(campaign_id__in=list(current), active=True).values_list(
                "campaign_id", "state"):
            by = states.setdefault(pk, {})
            by[state] = by.get(state, 0) + 1
        waiting = _waiting_for_predecessor([pk for pk in current if states.get(pk, {}).get("held")])
        for pk, status in current.items():
            target = campaign_status_of(states.get(pk, {}), waits_for_predecessor=pk in waiting)
            if target is not None and target != status:
                moved += transition(Campaign.objects.filter(pk=pk), field="status", transitions=CAMPAIGN_TRANSITIONS,
                                    source=status, target=target)
    return moved


def _waiting_for_predecessor(campaign_ids: list[int]) -> set[int]:
    """Those of ``campaign_ids`` (campaigns with held tasks) whose held tasks wait for their
    ``-hold_jid_ad`` predecessor, not for a release (``control.waits_for_predecessor``)."""
    from dashboards.core.holds import tco_holds

    by_cluster: dict[int, list[Campaign]] = {}
    for campaign in (Campaign.objects.filter(pk__in=campaign_ids, predecessor_job__isnull=False,
                                             job_number__isnull=False).select_related("launched_by")):
        by_cluster.setdefault(campaign.cluster_id, []).append(campaign)
    out: set[int] = set()
    for cluster_id, campaigns in by_cluster.items():
        held = tco_holds(Cluster(pk=cluster_id), campaigns)
        out |= {c.pk for c in campaigns if c.job_number not in held}
    return out


def finish_campaigns(campaign_ids: set[int]) -> None:
    campaign_status_follow(campaign_ids)
    now = timezone.now()
    for campaign_id in campaign_ids:
        if not Task.objects.filter(campaign_id=campaign_id, active=True).exists():
            # The conditional update succeeds once per campaign: only that caller sends the notice.
            if transition(Campaign.objects.filter(pk=campaign_id), field="status", transitions=CAMPAIGN_TRANSITIONS,
                          source=CAMPAIGN_LIVE, target=CampaignStatus.FINISHED, finished_at=now):
                transaction.on_commit(lambda pk=campaign_id: _notify_finished(pk))


def _notify_finished(campaign_id: int) -> None:
    """Queue the "campaign finished" notice (e-mail, budget check) on the ingest workers."""
    try:
        enqueue.send(enqueue.NOTIFY_CAMPAIGN_FINISHED, campaign_id, queue="ingest")
    except Exception:  # noqa: BLE001 - the broker being down must not undo an ingest; the page shows it anyway
        log.warning("could not queue the finished notice of campaign %s", campaign_id, exc_info=True)
