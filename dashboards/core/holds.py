"""What tco itself holds on the scheduler: its holds and priorities per job, and what waits for a predecessor.

Read by ingest (to tell a tco hold from an outside one), by the pages and the
triage (to say "paused by <user>" or "waiting for its predecessor"), and by the
control actions. Source: ``ControlRequest`` rows (done), newest per job.
"""
from __future__ import annotations

import datetime as dt
from typing import Sequence

from dashboards.core.clock import ago, clock_text, relative

from dashboards.control_models import ControlState
from dashboards.models import (
    Campaign,
    Cluster,
    ControlRequest,
)


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


def held_words(hold: dict, now: dt.datetime | None = None) -> str:
    """``paused by launcher in tco 36 s ago (06:41:02 UTC)``: a :func:`tco_holds` entry in words (``now``
    defaults to the clock; ``core.clock.ago``). Its relative part is :func:`held_relative` with the same ``now``."""
    return f"{hold['verb']} by {hold['who']} in tco {ago(hold['at'], now)}"


def held_relative(hold: dict, now: dt.datetime | None = None) -> dict:
    """The relative part of :func:`held_words` with its instant (``core.clock.relative``: ``{"at": epoch
    seconds, "text": "36 s ago"}``), for a page that keeps it moving."""
    return relative(hold["at"], now)


def held_at_words(hold: dict, now: dt.datetime | None = None) -> str:
    """``paused by launcher in tco at 06:41:02 UTC``: :func:`held_words` with no relative part, for text
    that cannot move once shown (a message after an action, a choice in a list)."""
    return f"{hold['verb']} by {hold['who']} in tco at {clock_text(hold['at'], now)}"


#: What lets a job tco holds run, said after its hold where the reader may not be on the triage page.
RELEASE_HINT = "a Release (the triage page, or the campaign's Resume) lets it run"


def with_tco_hold(reasons: list[dict], hold: dict | None, *, hint: str = "",
                  now: dt.datetime | None = None) -> list[dict]:
    """``reasons`` (``schedulers.pending.explain_pending``'s ``[{text, raw}]``) with tco's hold on the job
    said once, first, instead of the scheduler's "held by ..." line: Grid Engine calls a ``qhold`` by the
    submit account a user hold ("held by user (tasks 2-6)", or "held by user/operator/system" when SGE
    8.1.9 lists no ranges), which names neither who held it in tco nor when. ``hold``: the job's
    :func:`tco_holds` entry (None: ``reasons`` unchanged, the hold is not tco's). ``hint`` follows the
    words after a colon (:data:`RELEASE_HINT`). Used by the task page, the triage rows and the assistant.
    The hold's reason carries ``relative`` (:func:`held_relative`: the part of its text a page keeps moving)."""
    if hold is None:
        return list(reasons)
    now = now or dt.datetime.now(dt.timezone.utc)
    text = held_words(hold, now) + (f": {hint}" if hint else "")
    said = {"text": text, "raw": f"tco: {hold['action']} by {hold['who']} at {hold['at']:%Y-%m-%d %H:%M:%S}",
            "relative": held_relative(hold, now)}
    return [said] + [r for r in reasons if not r["text"].startswith("held by ")]


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
