"""Parser of ``qstat -j ID -xml``: a dump of the job's CULL fields (qstat(1);
element names of sge_job.h / sge_ja_task.h).
"""
from __future__ import annotations

import datetime as dt
import re

from lxml import etree

from schedulers.base import SchedulerParseError, UnknownJob

from .xmltools import UTC, children_text, epoch_or_iso_to_utc, load_xml

# ---------------------------------------------------------------------------
# qstat -j ID -xml
# ---------------------------------------------------------------------------

# JAT_status bits (sge_jobL.h / sge_ja_task.h of SGE 8.1.9 and OCS 9).
JHELD, JQUEUED, JRUNNING, JSUSPENDED = 0x10, 0x40, 0x80, 0x100
JTRANSFERING, JDELETED, JWAITING, JEXITING, JERROR = 0x200, 0x400, 0x800, 0x1000, 0x8000
# JAT_hold bits (MINUS_H_TGT_* in sge_job.h).
_HOLD_BITS = ((0x1, "user"), (0x2, "operator"), (0x4, "system"), (0x8, "dependency"))
# Pending tasks not yet enrolled are kept as id ranges per hold kind.
_HOLD_RANGE_LISTS = (("JB_ja_u_h_ids", "user"), ("JB_ja_o_h_ids", "operator"),
                     ("JB_ja_s_h_ids", "system"), ("JB_ja_a_h_ids", "dependency"))
_UNKNOWN_JOB_NAME = re.compile(rb"<ST_name>([^<]*)</ST_name>")


def job_status_state(status: int, hold: int = 0) -> str:
    """Lifecycle state of one task from its ``JAT_status`` bit mask (and
    ``JAT_hold``), with the same precedence as ``states.map_state``:
    error 0x8000 > deleted 0x400 > suspended 0x100 > running 0x80 /
    exiting 0x1000 > transferring 0x200 (starting) > held 0x10 (or a
    JAT_hold bit) > queued 0x40 / waiting 0x800 / idle 0 (pending); else
    unknown.
    Bits are tested, never compared whole (128 alone is running, 32784 is
    error+held).
    """
    if status & JERROR:
        return "error"
    if status & JDELETED:
        return "deleting"
    if status & JSUSPENDED:
        return "suspended"
    if status & (JRUNNING | JEXITING):
        return "running"
    if status & JTRANSFERING:
        return "starting"
    if status & JHELD or hold:
        return "held"
    if status & (JQUEUED | JWAITING) or status == 0:
        # 0 is JIDLE: enrolled but not dispatched. SGE 8.1.9 shows an Eqw
        # task so (its error bit lives in JAT_state, which -xml omits).
        return "pending"
    return "unknown"


def _sublist(el: etree._Element | None) -> list[etree._Element]:
    """Items of a CULL sub-list. Their tag is the list's name (SGE 8.1.9:
    ``qstat_l_requests``, ``ulong_sublist``…) or ``element`` (other versions,
    and lists rebuilt by qalter), so never select them by tag."""
    if el is None:
        return []
    return [c for c in el if isinstance(c.tag, str)]


def _ranges(el: etree._Element | None) -> list[list[int]]:
    result = []
    for item in _sublist(el):
        fields = children_text(item)
        try:
            first = int(fields["RN_min"])
            last = int(fields.get("RN_max") or first)
            step = int(fields.get("RN_step") or 1)
        except (KeyError, ValueError):
            raise SchedulerParseError("qstat -j -xml: task id range without integer RN_min/RN_max") from None
        result.append([first, last, step])
    return result


def _job_detail(job: etree._Element, messages: dict[int | None, list[str]], global_messages: list[str],
                tz: dt.tzinfo) -> dict:
    fields = {c.tag: c for c in job if isinstance(c.tag, str)}

    def text(tag: str) -> str | None:
        el = fields.get(tag)
        return None if el is None else (el.text or "")

    try:
        job_number = int(text("JB_job_number") or "")
    except ValueError:
        raise SchedulerParseError(f"qstat -j -xml: JB_job_number {text('JB_job_number')!r} is not an integer") from None

    hard_resources: dict[str, str] = {}
    for item in _sublist(fields.get("JB_hard_resource_list")):
        values = children_text(item)
        name = values.get("CE_name")
        if not name:
            continue
        value = values.get("CE_stringval")
        if value in (None, ""):
            value = values.get("CE_doubleval", "")
        hard_resources[name] = value

    holds: dict[str, list[list[int]]] = {}
    tasks = []
    errors = []
    for item in _sublist(fields.get("JB_ja_tasks")):
        values = children_text(item)
        for message in item.iter("QIM_message"):
            if message.text:
                errors.append({"task_number": int(values.get("JAT_task_number") or 0), "message": message.text})
        try:
            task_number = int(values["JAT_task_number"])
            status = int(values.get("JAT_status") or 0)
            hold = int(values.get("JAT_hold") or 0)
        except (KeyError, ValueError):
            raise SchedulerParseError(f"qstat -j -xml: job {job_number}: task without integer "
                                      "JAT_task_number/JAT_status") from None
        state = job_status_state(status, hold)
        tasks.append({"task_number": task_number, "state": state})
        if state in ("held", "pending", "error"):  # a hold on a running task (hr) holds nothing back
            for bit, kind in _HOLD_BITS:
                if hold & bit:
                    holds.setdefault(kind, []).append([task_number, task_number, 1])
    for tag, kind in _HOLD_RANGE_LISTS:
        ranges = _ranges(fields.get(tag))
        if ranges:
            holds.setdefault(kind, []).extend(ranges)

    predecessors: list[int] = []
    for tag in ("JB_jid_predecessor_list", "JB_ja_ad_predecessor_list"):
        for item in _sublist(fields.get(tag)):
            number = children_text(item).get("JRE_job_number", "")
            if number.isdigit() and int(number) not in predecessors:
                predecessors.append(int(number))

    hard_queues = [name for item in _sublist(fields.get("JB_hard_queue_list"))
                   if (name := children_text(item).get("QR_name"))]

    context: dict[str, str] = {}
    for item in _sublist(fields.get("JB_context")):
        values = children_text(item)
        if "VA_variable" in values:
            context[values["VA_variable"]] = values.get("VA_value", "")

    return {
        "job_number": job_number,
        "name": text("JB_job_name") or "",
        "owner": text("JB_owner") or "",
        "project": text("JB_project") or None,
        "submitted_at": epoch_or_iso_to_utc(text("JB_submission_time"), tz),
        "hard_resources": hard_resources,
        "tasks": tasks,
        "errors": errors,
        "hard_queues": hard_queues,
        "holds": holds,
        "predecessors": predecessors,
        "scheduler_messages": messages.get(job_number, []) + messages.get(None, []),
        "global_messages": list(global_messages),
        "context": context,
    }


def _scheduler_messages(root: etree._Element) -> tuple[dict[int | None, list[str]], list[str]]:
    """``<messages>``: per-job messages (SME_message_list, each with the job
    numbers it applies to) and global ones (SME_global_message_list)."""
    per_job: dict[int | None, list[str]] = {}
    global_messages: list[str] = []
    for block in root.iter("SME_message_list"):
        for item in _sublist(block):
            message = item.find("MES_message")
            if message is None or not message.text:
                continue
            numbers_el = item.find("MES_job_number_list")
            numbers = [int(t) for t in (numbers_el.itertext() if numbers_el is not None else ())
                       if t.strip().isdigit()]
            for number in numbers or [None]:
                per_job.setdefault(number, []).append(message.text)
    for block in root.iter("SME_global_message_list"):
        for item in _sublist(block):
            message = item.find("MES_message")
            if message is not None and message.text:
                global_messages.append(message.text)
    return per_job, global_messages


def parse_job_details(data: bytes, tz: dt.tzinfo = UTC) -> list[dict]:
    """Parse ``qstat -j ID[,ID…] -xml``: one dict per job (see parse_job_detail).

    Raises UnknownJob for ``<unknown_jobs>`` output, Grid Engine's answer
    (with exit status 0) for an id it does not know: well-formed on the dev
    cluster's 8.1.9 (``<unknown_jobs ><ST_name>ID</ST_name></unknown_jobs>``),
    malformed elsewhere (``<unknown_jobs><><ST_name>ID…``), so it is
    recognised before parsing. SchedulerParseError for anything else that is
    not a job dump.
    """
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    if b"<unknown_jobs" in data:
        ids = [m.decode("utf-8", "replace").strip() for m in _UNKNOWN_JOB_NAME.findall(data)]
        raise UnknownJob(f"qstat -j: unknown job {', '.join(ids) or '?'}", job_ids=ids)
    root = load_xml(data, ("detailed_job_info",), "qstat -j -xml")
    per_job, global_messages = _scheduler_messages(root)
    jobs = []
    for djob_info in root.iter("djob_info"):
        # The job element is <element> (SGE 8.1.9) or <qmaster_response> (6.2).
        for job in _sublist(djob_info):
            jobs.append(_job_detail(job, per_job, global_messages, tz))
    return jobs


def parse_job_detail(data: bytes, tz: dt.tzinfo = UTC) -> dict:
    """Parse ``qstat -j ID -xml`` (qstat(1); CULL field names of sge_job.h).

    Returns a dict with keys:

    - ``job_number`` (int), ``name``, ``owner``, ``project`` (None if unset),
      ``submitted_at`` (aware UTC; SGE prints epoch seconds, OCS ISO with µs
      read in ``tz``);
    - ``hard_resources``: ``{name: value}`` from every child of
      ``JB_hard_resource_list`` (``CE_stringval``, else ``CE_doubleval``);
    - ``tasks``: ``[{"task_number", "state"}]`` for tasks the qmaster has
      enrolled, state from the ``JAT_status`` bit mask (job_status_state).
      A non-array job has one task numbered 1, as Grid Engine stores it.
      Tasks not enrolled yet (most pending ones) are not listed;
    - ``errors``: ``[{"task_number", "message"}]``, the execd's reasons for
      a task's error state (``JAT_message_list``, qstat's "error reason");
    - ``hard_queues``: queue names requested with ``-q``;
    - ``holds``: ``{"user"|"operator"|"system"|"dependency": [[first, last,
      step], …]}``: tasks kept from starting by a hold, from JAT_hold of
      enrolled tasks that are not running and the JB_ja_*_h_ids ranges of
      tasks not yet enrolled;
    - ``predecessors``: job numbers from JB_jid_predecessor_list and
      JB_ja_ad_predecessor_list (``-hold_jid``, ``-hold_jid_ad``) that have
      not finished;
    - ``scheduler_messages``: texts the scheduler recorded for this job
      (needs ``schedd_job_info true``); ``global_messages``: the scheduler's
      global ones;
    - ``context``: ``JB_context`` as ``{variable: value}`` (``-ac``).

    Raises UnknownJob when the id is unknown, SchedulerParseError otherwise.
    """
    jobs = parse_job_details(data, tz)
    if not jobs:
        raise SchedulerParseError("qstat -j -xml: no job in the output")
    return jobs[0]
