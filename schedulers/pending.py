"""Why a job is still pending, in plain words.

Input is ``qstat_xml.parse_job_detail`` output (``qstat -j ID -xml``), and
optionally ``parse_qquota`` and ``parse_qhost`` output to put numbers on a
quota or a consumable. The scheduler texts recognised here are those of
SGE 8.1.9 and OCS 9 ``msg_schedd.h`` (the ``MSG_SCHEDD_INFO_*`` messages);
they are only recorded when the scheduler configuration has
``schedd_job_info true`` (sched_conf(5)). A message not recognised is passed
through unchanged, so nothing the scheduler says is hidden.

Each reason is ``{"text": plain words, "raw": what Grid Engine said}``.
"""
from __future__ import annotations

import datetime as dt
import re
from typing import Iterable

from schedulers.calendars import queue_opening_reason
from schedulers.durations import duration_text

__all__ = ["explain_pending", "reservation_reasons", "reason_kind", "share_tree_standing", "position_rank",
           "RESOURCE_LABELS"]

#: The texts of the reasons that :func:`reason_kind` sorts out (kept here beside the code that writes them).
START_TIME_TEXT = "waiting for its requested start time (-a)"
TASK_LIMIT_TEXT = "array task limit reached (max_aj_instances or -tc)"
HARD_QUEUE_TEXT = "only runs in the queues it requested (-q)"
_TASK_CAP = re.compile(r"limited to (\d+) running at once")
_STARTS_AT = re.compile(r": starts at (.+)$")

# Consumables that tco uses for model API seats; anything else is named as is.
RESOURCE_LABELS = {
    "anthropic_api": "a model API seat",
    "openai_api": "a model API seat",
    "model_api": "a model API seat",
    "slots": "a free slot",
}

_RQS_GLOBAL = re.compile(r'cannot run because it exceeds limit "([^"]*)" in rule "([^"/]*)/?([^"]*)"')
_RQS_QUEUE = re.compile(r'Job cannot run in queue instance "([^"]*)" because exceeds limit in rule (\S+)')
_OFFERS_GLOBAL = re.compile(r"\(-l ([^)]*)\) cannot run globally because it offers only (\w+):([^=\s]+)=(\S+)")
_OFFERS_HOST = re.compile(r'\(-l ([^)]*)\) cannot run at host "([^"]+)" because it offers only (\w+):([^=\s]+)=(\S+)')
_OFFERS_QUEUE = re.compile(r'\(-l ([^)]*)\) cannot run in queue "([^"]+)" because it offers only (\w+):([^=\s]+)=(\S+)')
_HARD_QUEUE = re.compile(r'cannot run in queue "([^"]+)" because it is not contained in its hard queue list')
_QI_DROPPED = re.compile(r'queue instance "([^"]+)" dropped because it is (full|disabled|suspended|overloaded|'
                         r'temporarily not available)')
_PE_SLOTS = re.compile(r'cannot run in PE "([^"]+)" because it only offers (\d+) slots')
_NO_PERMISSION = re.compile(r'has no permission for (cluster queue|queue instance|host|queue) "([^"]+)"')
_TURNED_OFF = "Collecting of scheduler job information is turned off"
_DUE_TO_RESERVATION = re.compile(r'cannot run (?:in queue|at host) "([^"]+)" because it offers only \S+ due to a '
                                 r'reservation')


def _number(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def _fmt(value: float | int | None) -> str:
    if value is None:
        return "?"
    value = float(value)
    return str(int(value)) if value.is_integer() else f"{value:g}"


def _requests(text: str) -> dict[str, str]:
    """``anthropic_api=1,h_rt=60`` -> {"anthropic_api": "1", "h_rt": "60"}."""
    result = {}
    for item in text.split(","):
        name, _, value = item.partition("=")
        if name.strip():
            result[name.strip()] = value.strip()
    return result


def _waiting_for(predecessors: list[int]) -> str:
    noun = "job" if len(predecessors) == 1 else "jobs"
    return f"waiting for {noun} {', '.join(str(p) for p in predecessors)} to finish"


_QIM_PREFIX = re.compile(r"^.*?\[[^\]]*\]:\s*(?:error:\s*)?")


def _error_text(job_detail: dict) -> str:
    """'in error state: <execd's reason>; …' (JAT_message_list, qstat's "error reason")."""
    errors = job_detail.get("errors") or []
    why = "the job could not be started"
    if errors:
        # "11/29/2026 16:25:16 [1001:26716]: error: can't chdir to /x: No such file"
        why = _QIM_PREFIX.sub("", errors[0]["message"]).strip() or errors[0]["message"]
    return (f"in error state: {why}; fix the cause, then clear it with "
            f"qmod -cj {job_detail.get('job_number')} (or delete it)")


def _ranges_text(ranges: list[list[int]]) -> str:
    parts = []
    for first, last, step in ranges:
        if first == last:
            parts.append(str(first))
        elif step == 1:
            parts.append(f"{first}-{last}")
        else:
            parts.append(f"{first}-{last}:{step}")
    return ",".join(parts)


def _rue_filters(rue: str) -> str:
    """Describe an RQS usage key ``user/project/pe/queue/host`` (rqs_get_rue_string
    in sge_resource_quota.c: empty parts count for the whole set)."""
    labels = ("user", "project", "pe", "queue", "host")
    parts = [f"{label} {value}" for label, value in zip(labels, rue.split("/")) if value]
    return ", ".join(parts) if parts else "cluster-wide"


def _quota_numbers(rule: str, quota: Iterable[dict] | None, rue: str) -> str | None:
    """'slots 8 of 8' for the qquota entry of ``rule`` that matches ``rue``."""
    if not quota:
        return None
    wanted = dict(zip(("users", "projects", "pes", "queues", "hosts"), rue.split("/")))
    best = None
    for entry in quota:
        if entry.get("rule") != rule:
            continue
        filters = entry.get("filters") or {}
        if all(not value or value in filters.get(key, [value]) for key, value in wanted.items()):
            best = entry
            break
        best = best or entry
    if best is None:
        return None
    return f"{best.get('resource')} {_fmt(_number(str(best.get('used'))))} of {_fmt(_number(str(best.get('limit'))))}"


def _global_free(resource: str, offered: str | None, hosts: Iterable[dict] | None) -> float | None:
    for host in hosts or ():
        if host.get("name") == "global":
            value = (host.get("resources") or {}).get(resource)
            if value is not None:
                return _number(str(value.get("value") if isinstance(value, dict) else value))
    return _number(offered) if offered is not None else None


def explain_pending(job_detail: dict, quota: list | None = None, hosts: list | None = None,
                    capacities: dict | None = None, queues: list | None = None, *,
                    reservations: list | None = None, reserving_jobs: list | None = None,
                    queue_instances: list | None = None,
                    now: dt.datetime | None = None) -> list[dict]:
    """Plain-words reasons a job (or some of its tasks) is not running.

    ``job_detail``: ``parse_job_detail`` output. ``quota``: ``parse_qquota``
    output, used to print "N of M" for a resource quota. ``hosts``:
    ``parse_qhost`` output (``qhost -F``); the ``global`` pseudo-host gives
    what is still free of a global consumable. ``capacities``: configured
    totals of global consumables (``complex_values`` of ``qconf -se
    global``, e.g. ``{"anthropic_api": 96}``), which qhost does not show.
    ``queues``: the status poll's queue entries (``schedulers.calendars.annotate_queues``):
    a queue instance "dropped because it is disabled/suspended" whose queue's calendar
    closes it at ``now`` (default: the current time) reads ``agent.q opens at 18:00 UTC
    (calendar after_hours)`` instead (calendar_conf(5)).

    Returns ``[{"text": str, "raw": str}]``, a reason that says a time relative to ``now`` also
    ``"relative": {"at": epoch seconds, "text": "in 41 min"}`` (that part of ``text``, for a page that
    keeps it moving): errors, holds and dependencies
    first; then the scheduler's messages for this job in its order; then,
    while the job waits, its global messages about queue instances the job
    may use (``hard_queues``; qstat -j prints those with every job); last,
    one line for all the "not in its hard queue list" messages. Duplicates
    are removed.
    Examples of ``text``: ``held by user (tasks 1-10)``, ``waiting for job
    812 to finish``, ``agent quota reached: slots 8 of 8 for user tco (RQS
    agent_cap)``, ``waiting for a model API seat: the job asks 1 (-l anthropic_api=1); 96 of 96
    in use, 0 free (consumable anthropic_api, global)``. Unknown messages: text = the message.

    Reservations (issue 17; see :func:`reservation_reasons`): ``reservations``
    is the poll's ``qrstat`` list, ``reserving_jobs`` the pending ``-R y`` jobs
    and ``queue_instances`` the poll's queue instances (their ``slots_resv``);
    ``now`` (aware UTC) defaults to the clock.
    """
    reasons: list[dict] = []
    seen: set[str] = set()

    def add(text: str, raw: str) -> None:
        if text not in seen:
            seen.add(text)
            reasons.append({"text": text, "raw": raw})

    tasks = job_detail.get("tasks") or []
    if any(task.get("state") == "error" for task in tasks):
        numbers = [str(task["task_number"]) for task in tasks if task.get("state") == "error"]
        add(_error_text(job_detail), f"JAT_status error bit, tasks {','.join(numbers)}")
    for kind, ranges in (job_detail.get("holds") or {}).items():
        if kind == "dependency":
            continue
        add(f"held by {kind} (tasks {_ranges_text(ranges)})", f"hold {kind}: {_ranges_text(ranges)}")
    predecessors = job_detail.get("predecessors") or []
    if predecessors:
        add(_waiting_for(predecessors), f"predecessors: {', '.join(str(p) for p in predecessors)}")
    elif "dependency" in (job_detail.get("holds") or {}):
        add("waiting for its predecessor tasks to finish (-hold_jid_ad)",
            f"hold dependency: {_ranges_text(job_detail['holds']['dependency'])}")

    messages = list(job_detail.get("scheduler_messages") or [])
    # qstat -j prints the scheduler's global messages with every job; keep
    # those that concern this job: a queue instance it may run in, or the
    # scheduler not recording reasons at all.
    wanted = set(job_detail.get("hard_queues") or [])
    waiting = bool(messages) or not tasks or any(
        task.get("state") not in ("running", "suspended", "deleting") for task in tasks)
    for message in job_detail.get("global_messages") or []:
        match = _QI_DROPPED.search(message)
        if _TURNED_OFF in message or (waiting and match and (not wanted or match.group(1).split("@")[0] in wanted)):
            messages.append(message)
    hard_queue: list[str] = []
    reserved_hosts: list[str] = []  # "… because it offers only qc:slots=0.000000 due to a reservation"
    for message in messages:
        match = _DUE_TO_RESERVATION.search(message)
        if match:
            host = match.group(1).split("@")[-1]
            if host not in reserved_hosts:
                reserved_hosts.append(host)
            continue
        text = _calendar_reason(message, queues, now)
        text = text or _explain_message(message, job_detail, quota, hosts, capacities, hard_queue, now)
        if text is not None:
            add(text, message)
    if hard_queue:
        add(f"{HARD_QUEUE_TEXT}; {len(hard_queue)} other queue(s) skipped",
            hard_queue[0] + (f" (+{len(hard_queue) - 1} similar)" if len(hard_queue) > 1 else ""))
    if waiting:
        for reason in reservation_reasons(job_detail, reservations, reserving_jobs, queue_instances, now,
                                          reserved_hosts=reserved_hosts):
            add(reason["text"], reason["raw"])
    return reasons


def _calendar_reason(message: str, queues: list | None, now: dt.datetime | None) -> str | None:
    """The opening time of a queue instance's queue that its calendar closes (None otherwise)."""
    match = _QI_DROPPED.search(message) if queues else None
    if not match or match.group(2) not in ("disabled", "suspended"):
        return None
    return queue_opening_reason(match.group(1).split("@")[0], queues, now or dt.datetime.now(dt.timezone.utc))


# ---------------------------------------------------------------- reservations (issue 17)

def _when(value) -> dt.datetime | None:
    """An aware datetime from a datetime or an ISO string (the poll stores JSON); None if neither."""
    if isinstance(value, dt.datetime):
        return value if value.tzinfo else value.replace(tzinfo=dt.timezone.utc)
    try:
        parsed = dt.datetime.fromisoformat(str(value))
    except (TypeError, ValueError):
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc)


def _clock(moment: dt.datetime, now: dt.datetime) -> str:
    """``18:00 UTC`` today, else ``2026-12-02 18:00 UTC``."""
    moment = moment.astimezone(dt.timezone.utc)
    if moment.date() == now.astimezone(dt.timezone.utc).date():
        return moment.strftime("%H:%M UTC")
    return moment.strftime("%Y-%m-%d %H:%M UTC")


def reservation_reasons(job_detail: dict, reservations: list | None = None, reserving_jobs: list | None = None,
                        queue_instances: list | None = None, now: dt.datetime | None = None, *,
                        reserved_hosts: list[str] | None = None) -> list[dict]:
    """Why a waiting job waits on a reservation: ``[{"text", "raw"}]``.

    - Advance reservation (``-ar N``, ``job_detail["advance_reservation"]``):
      ``reservations`` holds ``parse_qrstat`` dicts (times as datetimes or ISO
      strings; an optional ``team`` the dashboard adds). Before its start:
      "waits for advance reservation 12 (team research), which starts at
      18:00 UTC (in 41 min)"; while it runs: "runs only in advance reservation
      12 (…), which ends at 18:30 UTC: all it reserved is in use"; not listed:
      "… no longer listed by qrstat (ended or deleted)".
    - Resource reservation (``-R y``, sched_conf(5) ``max_reservation``): the
      job itself reserves ("asked for a resource reservation (-R y) …"), or
      ``reserving_jobs`` (``[{"job_number", "slots", "pe"}]``: other pending
      ``-R y`` jobs) hold slots on queue instances with ``slots_resv`` > 0 in
      ``queue_instances`` that this job may use (its ``hard_queues``, all if
      none): "slots on sge-exec3 are reserved for job 123 (-R y), which needs
      2 slots". ``reserved_hosts`` are the hosts the scheduler itself named
      ("cannot run in queue "classic.q@sge-exec3" because it offers only
      qc:slots=0.000000 due to a reservation", SGE 8.1.9): they win over the
      guess from free slots, and are reported even when the reserving job is
      not known ("… reserved for a job that asked for a resource reservation (-R y)").
    """
    now = now or dt.datetime.now(dt.timezone.utc)
    out: list[dict] = []
    ar = job_detail.get("advance_reservation")
    if ar:
        found = next((r for r in reservations or [] if str(r.get("id")) == str(ar)), None)
        if found is None:
            if reservations is not None:
                out.append({"text": f"submitted into advance reservation {ar}, which qrstat no longer lists "
                                    "(ended or deleted)", "raw": f"-ar {ar}: not in qrstat"})
        else:
            label = f"advance reservation {ar}"
            if found.get("team"):
                label += f" (team {found['team']})"
            start, end = _when(found.get("start_at")), _when(found.get("end_at"))
            raw = (f"-ar {ar}: qrstat state {found.get('state_code') or found.get('state')}, "
                   f"start {found.get('start_at')}, end {found.get('end_at')}")
            if start is not None and start > now:
                # "relative": the part of the text a live page keeps moving, with its instant (epoch seconds).
                soon = f"in {duration_text((start - now).total_seconds())}"
                out.append({"text": f"waits for {label}, which starts at {_clock(start, now)} ({soon})", "raw": raw,
                            "relative": {"at": start.timestamp(), "text": soon}})
            elif end is not None:
                out.append({"text": f"runs only in {label}, which ends at {_clock(end, now)}: "
                                    "it waits until the slots or seats the reservation holds are free",
                            "raw": raw})
    if job_detail.get("reserve"):
        slots = job_detail.get("pe_slots") or 1
        out.append({"text": f"asked for a resource reservation (-R y): the scheduler keeps slots free for it "
                            f"as they free up until it has the {slots} slot{'s' if slots != 1 else ''} it needs",
                    "raw": "JB_reserve true"})
        return out
    others = [j for j in reserving_jobs or []
              if j.get("job_number") is None or j.get("job_number") != job_detail.get("job_number")]
    wanted = set(job_detail.get("hard_queues") or [])
    if reserved_hosts and not others:
        out.append({"text": f"slots on {', '.join(reserved_hosts)} are reserved for a job that asked for a "
                            "resource reservation (-R y)",
                    "raw": f"offers only slots=0 due to a reservation on {', '.join(reserved_hosts)}"})
    for job in [] if ar else others:
        theirs = set(job.get("queues") or [])
        if wanted and theirs and not wanted & theirs:
            continue  # the reserving job cannot use this job's queues: it holds nothing back here
        # -R y reservations are the scheduler's own plan (qstat does not list them): the queue
        # instances both jobs may use that still have a free slot are held back for it.
        hosts = sorted({qi.get("host") for qi in queue_instances or []
                        if (not theirs or qi.get("queue") in theirs) and (not wanted or qi.get("queue") in wanted)
                        and (qi.get("slots_resv") or 0) + (qi.get("slots_used") or 0) < (qi.get("slots_total") or 0)
                        or (qi.get("slots_resv") or 0) > 0 and (not theirs or qi.get("queue") in theirs)})
        hosts = list(reserved_hosts or []) or hosts
        where = f"slots on {', '.join(hosts)}" if hosts else (
            f"slots in {', '.join(sorted(theirs))}" if theirs else "free slots")
        slots = job.get("slots") or 1
        # A job the reader may not see has no number here (another team's: reservation_context).
        who = f"job {job['job_number']}" if job.get("job_number") is not None else "another team's job"
        out.append({"text": f"{where} are reserved for {who} (-R y), "
                            f"which needs {slots} slot{'s' if slots != 1 else ''}",
                    "raw": f"{who}: JB_reserve true, {slots} slots, queues "
                           f"{','.join(sorted(theirs)) or 'any'}; max_reservation > 0"})
    return out


def policy_position(*, rank: int, of: int, priority: float | None, project: str | None,
                    share_tree: list[dict] | None = None, among_visible: bool = False) -> list[dict]:
    """Where the cluster's policy puts a waiting job: ``[{text, raw}]``.

    ``rank`` is the job's place (1 = next) among ``of`` waiting jobs ordered by
    the scheduler's priority (``JAT_prio`` of ``qstat -xml``: sge_priority(5)
    weighs ``-p``, urgency and tickets, share-tree tickets among them).
    ``share_tree`` is ``parse_share_mon`` output: the job's project node adds
    its team's standing (:func:`share_tree_standing`). Nothing is said about
    a node that is absent.
    ``among_visible``: ``rank`` and ``of`` count only the jobs of the teams the
    reader sees (a team member must not learn how busy other teams are), and
    the text says so.
    """
    if among_visible:
        text = (f"number {rank} of {of} waiting jobs of the teams you see, in the cluster's priority order "
                "(other teams' jobs are not counted here)")
    else:
        text = f"number {rank} of {of} waiting jobs in the cluster's priority order"
    reasons = [{"text": text, "raw": f"JAT_prio {priority if priority is not None else '?'}: rank {rank} of {of}"
                                     + (" visible jobs" if among_visible else "")}]
    line = share_tree_standing(project, share_tree)
    if line is not None:
        reasons.append(line)
    return reasons


def share_tree_standing(project: str | None, share_tree: list[dict] | None) -> dict | None:
    """The team's standing in the share tree: ``{"text", "raw"}``, or None without a node for ``project``.

    ``share_tree``: ``parse_share_mon`` output. The team's part is its configured ``shares`` against
    the shares of every project node (what the launch forecast counts: "50 of 100 shares"), not
    sge_share_mon's ``long_target_share``, which is 0 while Grid Engine counts no jobs in the node
    (an idle node, or one whose jobs have not been counted yet) and so read "a target of 0%" for a
    team with work waiting. Its standing is ``actual_share`` (its part of the decayed usage,
    0..1) against that part: above it, its jobs get fewer share-tree tickets than other teams' that
    wait. Examples: "team research has used 86% of the cluster lately, above the 50% its 50 of 100
    share-tree shares give it, so its jobs get fewer tickets than other teams' waiting jobs";
    "team engineering has used 1% of the cluster lately, within the 50% its 50 of 100 share-tree
    shares give it".
    """
    nodes = [n for n in share_tree or () if n.get("project") and not n.get("user")]
    node = next((n for n in nodes if project and n.get("project") == project), None)
    if node is None or node.get("actual_share") is None:
        return None
    total = sum(n.get("shares") or 0 for n in nodes)
    shares = node.get("shares")
    if shares is not None and total > 0:
        part, whose = shares / total, f"its {_fmt(shares)} of {_fmt(total)} share-tree shares give it"
    elif node.get("total_share") is not None:
        part, whose = node["total_share"], "the share tree gives it"
    else:
        return None
    actual = node["actual_share"]
    raw = (f"sge_share_mon {node.get('node')}: shares={shares} of {total}, actual_share={actual}, "
           f"long_target_share={node.get('long_target_share')}, job_count={node.get('job_count')}")
    if actual > part:
        return {"text": f"team {project} has used {actual:.0%} of the cluster lately, above the {part:.0%} "
                        f"{whose}, {SHARE_TREE_BEHIND}", "raw": raw}
    return {"text": f"team {project} has used {actual:.0%} of the cluster lately, within the {part:.0%} {whose}",
            "raw": raw}


#: How a share-tree line ends when the team is above its part (:func:`reason_kind` finds it by this).
SHARE_TREE_BEHIND = "so its jobs get fewer tickets than other teams' waiting jobs"


def position_rank(text: str) -> int | None:
    """The job's place (1 = next) in a :func:`policy_position` line ("number 3 of 40 waiting jobs ..."),
    None for any other text."""
    match = _RANK.match(text)
    return int(match.group(1)) if match else None


def _explain_message(message: str, job_detail: dict, quota, hosts, capacities,
                     hard_queue: list[str], now: dt.datetime | None = None) -> str | None:
    text = message.strip()
    match = _RQS_GLOBAL.search(text)
    if match:
        rue, rqs, rule = match.groups()
        numbers = _quota_numbers(f"{rqs}/{rule}" if rule else rqs, quota, rue)
        who = _rue_filters(rue)
        if numbers:
            return f"agent quota reached: {numbers} for {who} (RQS {rqs})"
        return f"agent quota reached: {who} (RQS {rqs})"
    match = _RQS_QUEUE.search(text)
    if match:
        instance, rule = match.groups()
        return f"agent quota reached in queue instance {instance} (RQS {rule.split('/')[0]})"
    match = _OFFERS_GLOBAL.search(text)
    if match:
        requested, dominance, resource, offered = match.groups()
        label = RESOURCE_LABELS.get(resource, f"resource {resource}")
        want = _requests(requested).get(resource)
        total = _number(str(capacities[resource])) if capacities and resource in capacities else None
        free = _global_free(resource, offered, hosts)
        asks = f"the job asks {_fmt(_number(want))} (-l {resource}={want})" if want else "what the job asks is unknown"
        if total is not None and free is not None:
            return (f"waiting for {label}: {asks}; {_fmt(total - free)} of {_fmt(total)} in use, {_fmt(free)} free "
                    f"(consumable {resource}, global)")
        return f"waiting for {label}: {asks}; {_fmt(free)} free (consumable {resource}, global)"
    match = _OFFERS_HOST.search(text)
    if match:
        requested, host, dominance, resource, offered = match.groups()
        want = _requests(requested).get(resource, "?")
        return f"host {host} has only {offered} {resource} free, {want} requested"
    match = _OFFERS_QUEUE.search(text)
    if match:
        requested, queue, dominance, resource, offered = match.groups()
        want = _requests(requested).get(resource, "?")
        return f"queue {queue} has only {offered} {resource} free, {want} requested"
    match = _HARD_QUEUE.search(text)
    if match:
        hard_queue.append(text)
        return None
    match = _QI_DROPPED.search(text)
    if match:
        instance, why = match.groups()
        words = {"full": "is full", "disabled": "is disabled", "suspended": "is suspended",
                 "overloaded": "is overloaded (load threshold)",
                 "temporarily not available": "is unavailable (exec host down or not reporting)"}[why]
        return f"queue instance {instance} {words}"
    match = _PE_SLOTS.search(text)
    if match:
        pe, slots = match.groups()
        return f"parallel environment {pe} offers only {slots} slots"
    match = _NO_PERMISSION.search(text)
    if match:
        kind, name = match.groups()
        return f"no access to {kind} {name}"
    lowered = text.lower()
    if "job dropped because of job dependencies" in lowered:
        predecessors = job_detail.get("predecessors") or []
        if predecessors:
            return _waiting_for(predecessors)
        return "waiting for the jobs it depends on to finish (-hold_jid)"
    if "job is in hold state" in lowered or "jobs dropped because of hold" in lowered:
        holds = job_detail.get("holds") or {}
        if any(kind in holds for kind in ("user", "operator", "system")):
            return None  # already said, with who holds it and which tasks
        if job_detail.get("predecessors") or "dependency" in holds:
            # SGE 8.1.9 says "Job is in hold state" for tasks that wait for their -hold_jid(_ad)
            # predecessors (hqw) and its qstat -j lists no hold ranges of tasks not started: the
            # dependency, already said, is what is known; not a user/operator/system hold.
            return None
        return "held by user/operator/system"
    if "job is in error state" in lowered:
        return _error_text(job_detail)
    if "execution time not reached" in lowered:
        start = _when(job_detail.get("start_at")) if job_detail.get("start_at") else None
        if start is None:
            return START_TIME_TEXT
        return f"{START_TIME_TEXT}: starts at {_clock(start, now or dt.datetime.now(dt.timezone.utc))}"
    if "max_aj_instances" in lowered:
        cap = job_detail.get("task_concurrency")
        if cap:
            return (f"{TASK_LIMIT_TEXT}: limited to {cap} running at once by the campaign's concurrency cap (-tc); "
                    "more tasks start as others finish")
        return f"{TASK_LIMIT_TEXT}: more tasks start as others finish"
    if "resources requested are not available for parallel job" in lowered:
        return "not enough free slots or resources for the parallel job"
    if _TURNED_OFF.lower() in lowered:
        return "the scheduler does not record reasons (schedd_job_info false); try qalter -w p"
    return text


def reason_kind(text: str) -> dict:
    """What kind of wait a reason of :func:`explain_pending` or :func:`policy_position` says:
    ``{"kind", "value"}``, kind one of ``start_time`` (value: the start, e.g. "18:00 UTC", or ""),
    ``task_limit`` (value: the -tc cap as a string, or "" when the cap is unknown),
    ``priority_order`` (the job's place in the priority order, or its team within its
    share-tree part: nothing but its turn), ``share_tree`` (its team above its share-tree part:
    its jobs get fewer tickets, :func:`share_tree_standing`), ``note`` (the queues it asked for with -q: said, but
    no reason to wait by itself), or ``other`` (value "").
    """
    if text.startswith(START_TIME_TEXT):
        match = _STARTS_AT.search(text)
        return {"kind": "start_time", "value": match.group(1) if match else ""}
    if text.startswith(TASK_LIMIT_TEXT):
        match = _TASK_CAP.search(text)
        return {"kind": "task_limit", "value": match.group(1) if match else ""}
    if text.startswith(HARD_QUEUE_TEXT):
        return {"kind": "note", "value": ""}
    if _POSITION.match(text) or _WITHIN_TARGET.match(text):
        return {"kind": "priority_order", "value": ""}
    if text.startswith("team ") and text.endswith(SHARE_TREE_BEHIND):
        return {"kind": "share_tree", "value": ""}
    return {"kind": "other", "value": ""}


_POSITION = re.compile(r"number \d+ of \d+ waiting jobs in the cluster's priority order$")
_WITHIN_TARGET = re.compile(r"team .* has used \S+ of the cluster lately, within the \S+ (its .* share-tree shares|the "
                            r"share tree) gives? it$")
_RANK = re.compile(r"number (\d+) of \d+ waiting jobs")
