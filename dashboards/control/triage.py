"""Triage reads for admins: the waiting jobs, error-state first, with the scheduler's reasons,
grouped by the reason that keeps them waiting (:func:`triage_groups`), filtered, searched and sorted;
and the tasks a limit stopped lately (:func:`limit_stopped`).

Reads only; the triage *actions* are ``dashboards.control.actions.triage_action``.
"""
from __future__ import annotations

import datetime as dt
from typing import Any

from django.db.models import Count, F, Max, Min, Q
from django.utils import timezone

from dashboards.core import clusters as core_clusters
from dashboards.core import scheduler_cache
from dashboards.core.holds import (
    held_at_words,
    held_relative,
    held_words,
    job_priorities,
    tco_holds,
    with_tco_hold,
)
from dashboards.core.ranges import ranges_text, task_ranges
from dashboards.launch.reservations import reservation_context
from dashboards.models import Campaign, Cluster, Task, Team
from schedulers.pending import position_rank, reason_kind

TRIAGE_STATES = ("error", "pending", "held")


def triage_overview(*, cluster: Cluster | None = None, scheduler=None, max_jobs: int = 50,
                    now: dt.datetime | None = None) -> dict[str, Any]:
    """Waiting jobs for admins: error-state jobs first, then by the longest wait.

    Each job: ``{"job_number", "name", "owner", "project", "campaign_id",
    "tasks": n waiting, "errors": n, "held": n, "ranges": {state: "1-3,5"},
    "submitted_at", "wait_s", "reasons": [{"text", "raw"}], "reason_error": str}``.
    Reasons come from ``qstat -j`` (``explain_pending``) with quotas, hosts and
    consumable capacities from the last cluster status. Returns ``{"jobs",
    "total_jobs", "total_tasks", "quotas", "limit_stopped" (:func:`limit_stopped`), "generated_at"}``.
    """
    from schedulers.pending import explain_pending

    cluster = cluster or core_clusters.cluster_get_default()
    now = now or timezone.now()
    waiting = Task.objects.filter(cluster=cluster, active=True, state__in=TRIAGE_STATES)
    jobs = list(
        waiting.values("job_number")
        .annotate(n=Count("id"), errors=Count("id", filter=Q(state="error")), held=Count("id", filter=Q(state="held")),
                  submitted=Min("submitted_at"), name=Max("name"), owner=Max("owner"), project=Max("project"),
                  campaign_id=Max("campaign_id"))
        .order_by()
    )
    far_future = dt.datetime.max.replace(tzinfo=dt.timezone.utc)
    jobs.sort(key=lambda j: (0 if j["errors"] else 1, j["submitted"] or far_future, j["job_number"]))
    total_tasks = sum(j["n"] for j in jobs)
    shown = jobs[:max_jobs]
    numbers_by_job: dict[int, dict[str, list[int]]] = {}
    for job_number, task_number, state in waiting.filter(job_number__in=[j["job_number"] for j in shown]).values_list(
            "job_number", "task_number", "state"):
        numbers_by_job.setdefault(job_number, {}).setdefault(state, []).append(task_number)
    status = cluster.status or {}
    # The admins' page: places among every waiting job (user None).
    positions = scheduler_cache.pending_positions(cluster, {j["job_number"]: j["project"] for j in shown}, user=None)
    out = []
    for job in shown:
        reasons: list[dict] = []
        reason_error = ""
        found = scheduler_cache.job_detail_cached(cluster, job["job_number"], scheduler=scheduler)
        try:
            if found["unknown_job"]:
                reason_error = "the scheduler no longer knows this job (it may have just started or ended)"
            elif found["detail"] is None:
                reason_error = f"reasons unavailable: {found['error']}"
            else:
                reasons = explain_pending(found["detail"], quota=status.get("quotas"), hosts=status.get("hosts"),
                                          capacities=status.get("global_capacity"), queues=status.get("queues"),
                                          **reservation_context(status))
                reasons += positions[job["job_number"]]
        except (ValueError, TypeError) as exc:
            reason_error = f"reasons unavailable: {exc}"
        submitted = job["submitted"]
        out.append({
            "job_number": job["job_number"], "name": job["name"], "owner": job["owner"], "project": job["project"],
            "campaign_id": job["campaign_id"], "tasks": job["n"], "errors": job["errors"], "held": job["held"],
            "ranges": {state: "not an array" if nums == [0] else f"tasks {ranges_text(task_ranges(nums))}"
                       for state, nums in sorted(numbers_by_job.get(job["job_number"], {}).items())},
            "submitted_at": submitted,
            "wait_s": (now - submitted).total_seconds() if submitted else None,
            "reasons": reasons, "reason_error": reason_error,
        })
    _annotate(cluster, out)
    return {"jobs": out, "total_jobs": len(jobs), "total_tasks": total_tasks, "quotas": status.get("quotas", []),
            "limit_stopped": limit_stopped(cluster=cluster, now=now), "generated_at": now}


#: The triage page lists the tasks a limit stopped in this many seconds before now, at most
#: LIMIT_SHOWN of them (newest first), read from at most LIMIT_SCAN failed tasks.
LIMIT_WINDOW_S = 86400
LIMIT_SHOWN = 50
LIMIT_SCAN = 5000


def limit_stopped(*, cluster: Cluster, now: dt.datetime | None = None, window_s: float = LIMIT_WINDOW_S,
                  shown: int = LIMIT_SHOWN) -> dict[str, Any]:
    """The tasks of ``cluster`` that a limit stopped (failure kind ``limit``,
    ``core.failures.failure_of``: a sandbox limit in the runner record, or the qmaster's h_rt/h_cpu/
    h_vmem, accounting ``failed 37``) and that ended in the ``window_s`` seconds before ``now``.

    Returns ``{"tasks": [{"task_id", "campaign_id", "campaign_name", "team", "launcher",
    "job_number", "task_number", "host", "ended_at", "reason" ("memory limit 4 GiB reached"),
    "text" (failure_of's words: reason, host, exit status)}] (newest first, at most ``shown``),
    "reasons": [{"reason", "tasks"}] (most first), "total": n, "window_s"}``. Only the runner
    record's ``flags`` and ``error`` are read, never the whole record.
    """
    from dashboards.core.failures import FAILED_CODES, LIMIT, failure_of
    from dashboards.core.sandbox_limits import limit_reached

    now = now or timezone.now()
    since = now - dt.timedelta(seconds=window_s)
    rows = (Task.objects.filter(cluster=cluster, state="failed")
            .filter(Q(ended_at__gte=since) | Q(ended_at__isnull=True, updated_at__gte=since))
            .order_by(F("ended_at").desc(nulls_last=True), "-id")
            .values("id", "campaign_id", "campaign__name", "campaign__team__name", "campaign__launched_by__username",
                    "job_number", "task_number", "host", "ended_at", "failed_code", "exit_status",
                    "runner_record__flags", "runner_record__error")[:LIMIT_SCAN])
    found, counts = [], {}
    for row in rows:
        flags, error = row["runner_record__flags"], row["runner_record__error"]
        # A record without flags or error reads as no record: failure_of may then call another kind by
        # another name (agent or infrastructure), but never "limit", the only kind kept here.
        record = None if flags is None and error is None else {"flags": flags if isinstance(flags, list) else [],
                                                               "error": error}
        failure = failure_of(state="failed", failed_code=row["failed_code"], exit_status=row["exit_status"],
                             host=row["host"], runner=record)
        if failure is None or failure.kind != LIMIT:
            continue
        reason = limit_reached(record) or FAILED_CODES.get(row["failed_code"], "a limit")
        counts[reason] = counts.get(reason, 0) + 1
        if len(found) < shown:
            found.append({"task_id": row["id"], "campaign_id": row["campaign_id"],
                          "campaign_name": row["campaign__name"] or "", "team": row["campaign__team__name"] or "",
                          "launcher": row["campaign__launched_by__username"] or "", "job_number": row["job_number"],
                          "task_number": row["task_number"], "host": row["host"], "ended_at": row["ended_at"],
                          "reason": reason, "text": failure.text})
    reasons = [{"reason": r, "tasks": n} for r, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
    return {"tasks": found, "reasons": reasons, "total": sum(counts.values()), "window_s": window_s}


#: Sort keys of the job table: the URL's ``sort`` value -> (job field, reverse by default).
SORTS = {"wait": ("wait_s", True), "tasks": ("tasks", True), "priority": ("priority", True),
         "job": ("job_number", False), "owner": ("owner", False), "team": ("team", False)}
#: What would move a group of waiting jobs: group kind -> (triage action, button label, what it does).
GROUP_ACTIONS = {
    "error": ("clear_error", "Clear the error state", "the tasks go back to pending and are scheduled again"),
    "held_tco": ("release", "Release", "the held tasks become pending again"),
    "held": ("release", "Release", "the hold (user, operator or system) is removed"),
    "dependency": ("delete", "Delete", "they wait for other jobs to finish; delete them if those never will"),
    # -hold_jid_ad of a tco campaign: a dependency, not a hold; its predecessor's tasks ending moves them.
    "predecessor": ("", "", "task N starts when task N of the predecessor job ends (-hold_jid_ad); a release "
                            "does not move them (it is not a hold), the predecessor's tasks ending does"),
    "consumable": ("priority", "Raise the priority", "they start first when a seat frees up"),
    "quota": ("priority", "Raise the priority", "they start first when the quota has room again"),
    "share_tree": ("priority", "Raise the priority", "a -p above the other teams' jobs outweighs the share tree"),
    # A full queue instance: every job of the group waits for the same slots, so one raise for all of
    # them changes nothing; the row's own action can still move one job ahead of the others.
    "queue_full": ("", "", "they start as the tasks running there end; a higher priority only changes which "
                           "waiting job takes the next free slot (each row's action can move one job), not when "
                           "one frees; more slots need the queue's configuration (qconf -mq)"),
    "resource": ("priority", "Raise the priority", "they start first when a host or queue has the resource free"),
    "queue": ("", "", "the queue instances they may use are disabled, suspended, in alarm or unreachable: an "
                      "admin on the cluster fixes those (qmod -e, or the host); a higher priority does not"),
    "scheduling": ("priority", "Raise the priority", "they are next in the scheduler's order"),
    "next": ("", "", "first in the scheduler's order, nothing else named: it starts when the scheduler next finds "
                     "room; a higher priority cannot move it further up"),
    "reservation": ("hold", "Hold", "they wait for a reservation (an advance reservation's start, or slots the "
                                    "scheduler keeps for a -R y job); hold them to keep them aside"),
    "unknown": ("hold", "Hold", "the scheduler gives no reason yet"),
    # No tco control changes -a or -tc of a submitted job: nothing to press, say what moves them.
    "start_time": ("", "", "they start on their own at the start time they were submitted with (-a); "
                           "no control in tco changes it"),
    "task_limit": ("", "", "more start as the running ones finish; tco has no control to raise the cap of a "
                           "launched campaign"),
    "other": ("", "", "see each job's reasons below"),
}


def _annotate(cluster: Cluster, jobs: list[dict]) -> None:
    """Add to each job: ``team`` (name), ``launcher`` (tco user who launched it, "" if not tco's),
    ``queue``, ``priority`` (-p as tco last set it, None if unknown), ``state`` (error, held,
    waiting (for its -hold_jid_ad predecessor) or pending: the job's most pressing), ``group``
    (``{"key", "kind", "label"}``) and ``predecessor`` (job number or None); who holds a job in
    tco is said in its reasons in its group's words, and the reasons that cannot hold back a held
    or waiting job (full or closed queue instances) are marked ``secondary``."""
    numbers = [j["job_number"] for j in jobs]
    campaigns = {c.job_number: c for c in Campaign.objects.filter(cluster=cluster, job_number__in=numbers)
                 .select_related("launched_by", "team").order_by("launched_at")}
    predecessors = {c.job_number: c for c in Campaign.objects.filter(
        cluster=cluster, job_number__in=[c.predecessor_job for c in campaigns.values() if c.predecessor_job])
        .order_by("launched_at")}
    teams = dict(Team.objects.values_list("project", "name"))
    priorities = job_priorities(cluster, numbers)
    holds = tco_holds(cluster, list(campaigns.values()), numbers)
    for job in jobs:
        campaign = campaigns.get(job["job_number"])
        job["launcher"] = campaign.launched_by.get_username() if campaign else ""
        # A campaign's team is its own (qstat may not say the project of a job it has just seen); another
        # job's is the team of its project (-P), else the project's name, else "" (no project).
        job["team"] = campaign.team.name if campaign else teams.get(job["project"] or "", job["project"] or "")
        job["queue"] = campaign.queue if campaign else ""
        job["campaign_name"] = campaign.name if campaign else ""
        job["priority"] = priorities.get(job["job_number"])
        hold = holds.get(job["job_number"])
        job["predecessor"] = campaign.predecessor_job if campaign else None
        waiting = bool(job["held"] and campaign is not None and campaign.predecessor_job and hold is None)
        job["state"] = "error" if job["errors"] else (
            ("waiting" if waiting else "held") if job["held"] == job["tasks"] else "pending")
        if waiting:
            # qstat says "held" (hqw) for a dependency wait too: the row says what it is.
            job["ranges"] = {("waiting" if state == "held" else state): text
                             for state, text in (job.get("ranges") or {}).items()}
            before = predecessors.get(campaign.predecessor_job)
            job["group"] = _predecessor_group(campaign.predecessor_job, before.name if before else "")
            job["reasons"] = [{"text": "waits" + job["group"]["label"][len("wait"):] + ", task by task: task N "
                                       f"starts when task N of job {campaign.predecessor_job} ends (not held)",
                               "raw": f"campaign {campaign.pk}: -hold_jid_ad {campaign.predecessor_job}, "
                                      "not held in tco"}] + [
                r for r in job["reasons"] if not r["text"].startswith("held by user/operator/system")]
        else:
            job["group"] = _group_of(job, hold)
            if job["held"]:
                job["reasons"] = with_tco_hold(job["reasons"], hold)
        if job["state"] in ("held", "waiting"):
            for reason in job["reasons"]:
                if reason["text"].startswith(_QUEUE_REASONS) or " opens at " in reason["text"]:
                    reason["secondary"] = True


#: Reasons about queue instances and hosts: they do not hold back a job whose every task is held.
_QUEUE_REASONS = ("queue instance", "queue ", "host ")


def _predecessor_group(job_number: int, campaign_name: str) -> dict[str, str]:
    label = f"wait for predecessor job {job_number}" + (f" (campaign {campaign_name})" if campaign_name else "")
    return {"key": f"predecessor:{job_number}", "kind": "predecessor", "label": label}


def _group_of(job: dict, hold: dict | None) -> dict[str, str]:
    """The reason that keeps ``job`` waiting, as a group: ``{"key", "kind", "label"}`` (label: what
    its tasks wait for, said after the count, e.g. "wait for anthropic_api seats"). ``hold``: tco's
    hold on it (:func:`control.tco_holds`), None when tco does not hold it."""
    texts = [r["text"] for r in job["reasons"] if not r.get("secondary")]
    if job["errors"]:
        return {"key": "error", "kind": "error", "label": "are in the error state"}
    if job["held"]:
        if hold is not None:
            now = dt.datetime.now(dt.timezone.utc)
            # "label" says the hold relative to now; its "relative" part is what a page keeps moving, and
            # "fixed" says it with the clock time alone, for text that stays as it was shown (a message).
            return {"key": f"held_tco:{hold['who']}:{hold['verb']}", "kind": "held_tco",
                    "label": f"are {held_words(hold, now)}", "relative": held_relative(hold, now),
                    "fixed": f"are {held_at_words(hold, now)}"}
        if not any(t.startswith("held by ") for t in texts) and any(_is_dependency(t) for t in texts):
            return {"key": "dependency", "kind": "dependency", "label": "wait for other jobs to finish"}
        return {"key": "held", "kind": "held", "label": "are held outside tco (user, operator or system hold)"}
    for text in texts:
        if _is_dependency(text):
            return {"key": "dependency", "kind": "dependency", "label": "wait for other jobs to finish"}
    kinds = [reason_kind(t) for t in texts]
    for found in kinds:  # a start time (-a) or a -tc cap: raising the priority moves neither
        if found["kind"] == "start_time":
            when = found["value"]
            return {"key": f"start_time:{when}", "kind": "start_time",
                    "label": f"start at {when} (requested start time)" if when else "wait for their requested "
                                                                                    "start time (-a)"}
        if found["kind"] == "task_limit":
            cap = found["value"]
            return {"key": f"task_limit:{cap}", "kind": "task_limit",
                    "label": f"are limited to {cap} running at once by the campaign's concurrency cap (-tc)" if cap
                    else "wait for the array task limit (max_aj_instances or -tc)"}
    for text in texts:  # issue 17: an advance reservation not started yet, or slots kept for a -R y job
        if text.startswith("waits for advance reservation") or " (-R y)" in text and " are reserved for " in text:
            ar = text.split("advance reservation ", 1)[1].split(" ", 1)[0] if "advance reservation" in text else ""
            job = text.split("reserved for job ", 1)[1].split(" ", 1)[0] if "reserved for job" in text else "?"
            return ({"key": f"reservation:ar{ar}", "kind": "reservation",
                     "label": f"wait for advance reservation {ar} to start"} if ar else
                    {"key": f"reservation:job{job}", "kind": "reservation",
                     "label": f"wait behind the slots reserved for job {job} (-R y)"})
    for text in texts:
        if "(consumable " in text:
            resource = text.split("(consumable ", 1)[1].split(",")[0].split(")")[0]
            return {"key": f"consumable:{resource}", "kind": "consumable", "label": f"wait for {resource} seats"}
    for text in texts:
        if text.startswith("agent quota reached"):
            rqs = text.rsplit("(RQS ", 1)[-1].rstrip(")") if "(RQS " in text else "a quota"
            return {"key": f"quota:{rqs}", "kind": "quota", "label": f"wait for the quota {rqs}"}
    # The binding constraint first: a full or closed queue instance holds a job back whatever its
    # place; the share tree only orders the jobs that wait, so it binds only a job behind others.
    closed = [t for t in texts if t.startswith("queue instance ") and not t.endswith(" is full")]
    full = [t for t in texts if t.startswith("queue instance ") and t.endswith(" is full")]
    if full and not closed:
        instances = sorted({t[len("queue instance "):-len(" is full")] for t in full})
        queues = sorted({i.split("@")[0] for i in instances})
        where = instances[0] if len(instances) == 1 else f"{', '.join(queues)} ({len(instances)} instances)"
        return {"key": f"queue_full:{','.join(queues)}", "kind": "queue_full",
                "label": f"wait for a free slot in {where}, full"}
    if closed:
        return {"key": "queue", "kind": "queue", "label": "wait for a disabled or unavailable queue instance"}
    short = [t for t in texts if t.startswith(("host ", "queue ")) and " has only " in t]
    if short:  # "host node01 has only 2.000G h_vmem free, 4G requested"
        resource = short[0].split(" has only ", 1)[1].split(" free", 1)[0].split(" ")[-1]
        return {"key": f"resource:{resource}", "kind": "resource",
                "label": f"wait for {resource} on a host or queue"}
    rank = next((r for r in map(position_rank, texts) if r is not None), None)
    if rank != 1 and any(k["kind"] == "share_tree" for k in kinds):
        return {"key": "share_tree", "kind": "share_tree", "label": "wait for the share tree"}
    others = [t for t, k in zip(texts, kinds) if k["kind"] not in ("priority_order", "note", "share_tree")]
    if others:  # a reason not grouped above: its own group, never "their turn"
        return {"key": f"other:{others[0][:80]}", "kind": "other", "label": f"wait: {others[0]}"}
    if texts and rank == 1:
        return {"key": "next", "kind": "next", "label": "are first in the priority order"}
    if texts:
        return {"key": "scheduling", "kind": "scheduling", "label": "wait their turn in the priority order"}
    return {"key": "unknown", "kind": "unknown", "label": "wait without a reason from the scheduler"}


def _is_dependency(text: str) -> bool:
    """A reason of ``explain_pending`` that says the job waits for other jobs (-hold_jid, -hold_jid_ad)."""
    return text.startswith(("waiting for job", "waiting for the jobs", "waiting for its predecessor"))


_SINGULAR = {"are ": "is ", "wait ": "waits ", "start ": "starts "}


def _title(tasks: int, label: str) -> str:
    """``183 tasks wait for anthropic_api seats`` / ``1 task waits for ...`` (the verb agrees)."""
    if tasks == 1:
        for plural, singular in _SINGULAR.items():
            if label.startswith(plural):
                label = singular + label[len(plural):]
                break
        return f"1 task {label}"
    return f"{tasks} tasks {label}"


def triage_groups(jobs: list[dict]) -> list[dict]:
    """The jobs grouped by ``job["group"]["key"]``, biggest first: ``[{"key", "kind", "label",
    "title" ("12 tasks wait for the share tree"), "tasks": n, "jobs": [job_number], "oldest_wait_s",
    "oldest_submitted_at" (the submission that wait runs from, aware datetime | None), "action": {"action",
    "label", "why"}}]``; a group of jobs tco holds also has ``relative`` (the part of its label and title
    that says how long ago, ``core.clock.relative``) and ``fixed`` (its label with the clock time alone)."""
    groups: dict[str, dict] = {}
    for job in jobs:
        g = job["group"]
        group = groups.get(g["key"])
        if group is None:
            action, label, why = GROUP_ACTIONS[g["kind"]]
            group = groups[g["key"]] = {**g, "tasks": 0, "jobs": [], "oldest_wait_s": None,
                                        "oldest_submitted_at": None,
                                        "action": {"action": action, "label": label, "why": why}}
        group["tasks"] += job["tasks"]
        group["jobs"].append(job["job_number"])
        group["title"] = _title(group["tasks"], group["label"])
        if job["wait_s"] is not None and (group["oldest_wait_s"] is None or job["wait_s"] > group["oldest_wait_s"]):
            group["oldest_wait_s"] = job["wait_s"]
            group["oldest_submitted_at"] = job.get("submitted_at")
    return sorted(groups.values(), key=lambda g: (g["kind"] != "error", -g["tasks"], g["key"]))


def confirmed_in_group(group_jobs: list[int], confirmed: list[str]) -> dict[str, list[int]]:
    """Which of a reason group's jobs a confirmed group action acts on.

    ``group_jobs``: the group's job numbers now (:func:`triage_groups`); ``confirmed``: the job
    numbers the confirmation page listed (as posted, strings). Returns ``{"act": jobs both
    confirmed and still in the group, "left": confirmed jobs no longer in it (started, ended, or
    waiting for something else now), "joined": jobs in it now that were not confirmed}``, each in
    ``group_jobs``'s order (``left``: as posted). A job that joined after the confirmation page
    was shown is never acted on: the admin did not see it. Raises ``ValueError`` when a posted
    job number is not a whole number."""
    wanted = list(dict.fromkeys(int(n) for n in confirmed))
    now = set(group_jobs)
    return {"act": [j for j in group_jobs if j in set(wanted)], "left": [j for j in wanted if j not in now],
            "joined": [j for j in group_jobs if j not in set(wanted)]}


def triage_filter(jobs: list[dict], *, team: str = "", owner: str = "", queue: str = "", reason: str = "",
                  state: str = "", q: str = "", sort: str = "wait", descending: bool | None = None) -> list[dict]:
    """The jobs that match every given filter (exact: team name or project, owner or launcher,
    queue, group key, state; ``q``: a job number, or text in the name, campaign, owner or
    launcher), sorted by ``sort`` (a key of :data:`SORTS`; unknown keys sort by wait)."""
    needle = q.strip().lower()
    out = []
    for job in jobs:
        if team and team not in (job["team"], job["project"]):
            continue
        if owner and owner not in (job["launcher"], job["owner"]):
            continue
        if queue and job["queue"] != queue:
            continue
        if reason and job["group"]["key"] != reason:
            continue
        if state and job["state"] != state:
            continue
        if needle and not (needle == str(job["job_number"]) or any(
                needle in (job[f] or "").lower() for f in ("name", "campaign_name", "owner", "launcher"))):
            continue
        out.append(job)
    field, default_reverse = SORTS.get(sort, SORTS["wait"])
    reverse = default_reverse if descending is None else descending
    present = [j for j in out if j[field] is not None]
    missing = [j for j in out if j[field] is None]  # unknown values last, whichever the direction
    present.sort(key=lambda j: (j[field], -j["job_number"] if reverse else j["job_number"]), reverse=reverse)
    return present + missing
