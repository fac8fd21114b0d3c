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

__all__ = ["explain_pending", "RESOURCE_LABELS"]

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
                    capacities: dict | None = None, queues: list | None = None,
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

    Returns ``[{"text": str, "raw": str}]``: errors, holds and dependencies
    first; then the scheduler's messages for this job in its order; then,
    while the job waits, its global messages about queue instances the job
    may use (``hard_queues``; qstat -j prints those with every job); last,
    one line for all the "not in its hard queue list" messages. Duplicates
    are removed.
    Examples of ``text``: ``held by user (tasks 1-10)``, ``waiting for job
    812 to finish``, ``agent quota reached: slots 8 of 8 for user tco (RQS
    agent_cap)``, ``waiting for a model API seat: 96 of 96 in use
    (consumable anthropic_api, global)``. Unknown messages: text = the message.
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
    for message in messages:
        text = _calendar_reason(message, queues, now)
        text = text or _explain_message(message, job_detail, quota, hosts, capacities, hard_queue)
        if text is not None:
            add(text, message)
    if hard_queue:
        add(f"only runs in the queues it requested (-q); {len(hard_queue)} other queue(s) skipped",
            hard_queue[0] + (f" (+{len(hard_queue) - 1} similar)" if len(hard_queue) > 1 else ""))
    return reasons


def _calendar_reason(message: str, queues: list | None, now: dt.datetime | None) -> str | None:
    """The opening time of a queue instance's queue that its calendar closes (None otherwise)."""
    match = _QI_DROPPED.search(message) if queues else None
    if not match or match.group(2) not in ("disabled", "suspended"):
        return None
    return queue_opening_reason(match.group(1).split("@")[0], queues, now or dt.datetime.now(dt.timezone.utc))


def policy_position(*, rank: int, of: int, priority: float | None, project: str | None,
                    share_tree: list[dict] | None = None) -> list[dict]:
    """Where the cluster's policy puts a waiting job: ``[{text, raw}]``.

    ``rank`` is the job's place (1 = next) among ``of`` waiting jobs ordered by
    the scheduler's priority (``JAT_prio`` of ``qstat -xml``: sge_priority(5)
    weighs ``-p``, urgency and tickets, share-tree tickets among them).
    ``share_tree`` is ``parse_share_mon`` output; the job's project node gives
    its long-term target and its actual share of recent usage
    (sge_share_mon(1)): a team above its target gets fewer tickets, so its
    jobs go after the others'. Nothing is said about a node that is absent.
    """
    reasons = [{"text": f"number {rank} of {of} waiting jobs in the cluster's priority order",
                "raw": f"JAT_prio {priority if priority is not None else '?'}: rank {rank} of {of}"}]
    node = next((n for n in share_tree or [] if project and n.get("project") == project and not n.get("user")), None)
    if node and node.get("long_target_share") is not None and node.get("actual_share") is not None:
        target, actual = node["long_target_share"], node["actual_share"]
        if actual > target:
            text = (f"team {project} has used {actual:.0%} of the cluster lately against a share-tree target of "
                    f"{target:.0%}, so its jobs get fewer tickets than other teams'")
        else:
            text = (f"team {project} has used {actual:.0%} of the cluster lately, within its share-tree target of "
                    f"{target:.0%}")
        reasons.append({"text": text, "raw": f"sge_share_mon {node.get('node')}: actual_share={actual} "
                                             f"long_target_share={target}"})
    return reasons


def _explain_message(message: str, job_detail: dict, quota, hosts, capacities,
                     hard_queue: list[str]) -> str | None:
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
        if total is not None and free is not None:
            return (f"waiting for {label}: {_fmt(total - free)} of {_fmt(total)} in use "
                    f"(consumable {resource}, global)")
        return (f"waiting for {label}: {_fmt(free)} free, {want or '?'} requested "
                f"(consumable {resource}, global)")
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
        return "held by user/operator/system"
    if "job is in error state" in lowered:
        return _error_text(job_detail)
    if "execution time not reached" in lowered:
        return "waiting for its requested start time (-a)"
    if "max_aj_instances" in lowered:
        return "array task limit reached (max_aj_instances or -tc): more tasks start as others finish"
    if "resources requested are not available for parallel job" in lowered:
        return "not enough free slots or resources for the parallel job"
    if _TURNED_OFF.lower() in lowered:
        return "the scheduler does not record reasons (schedd_job_info false); try qalter -w p"
    return text
