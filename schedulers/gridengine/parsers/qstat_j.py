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

# JAT_state / JAT_status bits (sge_jobL.h / sge_ja_task.h of SGE 8.1.9; ocs_JobState.h of OCS 9).
JHELD, JQUEUED, JRUNNING, JSUSPENDED = 0x10, 0x40, 0x80, 0x100
JTRANSFERING, JDELETED, JWAITING, JEXITING, JERROR = 0x200, 0x400, 0x800, 0x1000, 0x8000
#: Same value, told apart by the field: JAT_state "suspended on threshold" (T),
#: JAT_status "finished" (OCS 9.2 retained finished tasks).
JSUSPENDED_ON_THRESHOLD = JFINISHED = 0x10000
# JAT_hold bits (MINUS_H_TGT_* in sge_job.h).
_HOLD_BITS = ((0x1, "user"), (0x2, "operator"), (0x4, "system"), (0x8, "dependency"))
# Pending tasks not yet enrolled are kept as id ranges per hold kind.
_HOLD_RANGE_LISTS = (("JB_ja_u_h_ids", "user"), ("JB_ja_o_h_ids", "operator"),
                     ("JB_ja_s_h_ids", "system"), ("JB_ja_a_h_ids", "dependency"))
_UNKNOWN_JOB_NAME = re.compile(rb"<ST_name>([^<]*)</ST_name>")
#: JRS_scope of a request set (OCS 9 ``sge_jsv``/``ocs_JobRequestSet``): 0 the
#: whole job, 1 the master task, 2 the slave tasks of a parallel job.
REQUEST_SCOPES = {0: "global", 1: "master", 2: "slave"}


def _bits_state(bits: int, hold: int, *, suspended_bits: int) -> str:
    """The precedence of ``states.map_state`` (E > d > s/S/T > r > t > h > q/w) on a bit word."""
    if bits & JERROR:
        return "error"
    if bits & JDELETED:
        return "deleting"
    if bits & suspended_bits:
        return "suspended"
    if bits & (JRUNNING | JEXITING):
        return "running"
    if bits & JTRANSFERING:
        return "starting"
    if bits & JHELD or hold:
        return "held"
    if bits & (JQUEUED | JWAITING) or bits == 0:
        # 0 is JIDLE: enrolled but not dispatched.
        return "pending"
    return "unknown"


def job_status_state(status: int, hold: int = 0) -> str:
    """Lifecycle state of one task from its ``JAT_status`` bit mask (and
    ``JAT_hold``), with the same precedence as ``states.map_state``:
    error 0x8000 > deleted 0x400 > suspended 0x100 > running 0x80 /
    exiting 0x1000 > transferring 0x200 (starting) > held 0x10 (or a
    JAT_hold bit) > queued 0x40 / waiting 0x800 / idle 0 (pending); else
    unknown. Bits are tested, never compared whole (128 alone is running,
    32784 is error+held).

    ``JAT_status`` is the coarse word: SGE 8.1.9 keeps an ``Eqw`` task's error
    bit, OCS 9 the error, suspension and deletion bits only in ``JAT_state``
    (see :func:`task_state`).
    """
    return _bits_state(status, hold, suspended_bits=JSUSPENDED)


def task_state(state: int | None, status: int, hold: int = 0) -> str:
    """Lifecycle state of one task from its full state word ``JAT_state`` (the
    letters qstat prints come from it), falling back to ``JAT_status`` where the
    output has no ``JAT_state`` (SGE 8.1.9's ``-xml`` leaves it out).

    Same precedence as the queue listing (``states.map_state``): an OCS 9
    ``Eqw`` task is ``JAT_state`` 0x8840 with ``JAT_status`` 0, a suspended one
    (``s``) 0x100 with status 0x80, one being deleted (``dr``) 0x480 with
    status 0x80 (captures of OCS 9.1.4 and 9.2). A task whose ``JAT_status``
    says finished (0x10000, OCS 9.2 retained jobs) is ``finishing``: tco
    decides done or failed from accounting.
    """
    if status & JFINISHED:
        return "finishing"
    if state is None:
        return job_status_state(status, hold)
    return _bits_state(state, hold, suspended_bits=JSUSPENDED | JSUSPENDED_ON_THRESHOLD)


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


def _resource_list(el: etree._Element | None) -> dict[str, str]:
    """``{name: value}`` of a CULL resource request list (CE_stringval, else CE_doubleval)."""
    out: dict[str, str] = {}
    for item in _sublist(el):
        values = children_text(item)
        name = values.get("CE_name")
        if not name:
            continue
        value = values.get("CE_stringval")
        if value in (None, ""):
            value = values.get("CE_doubleval", "")
        out[name] = value
    return out


def _queue_list(el: etree._Element | None) -> list[str]:
    return [name for item in _sublist(el) if (name := children_text(item).get("QR_name"))]


def _requests(fields: dict[str, etree._Element], job_number: int) -> dict:
    """The job's resource and queue requests, hard and soft, wherever the version keeps them.

    SGE 8.1.9 (and OCS before 9.0): ``JB_hard_resource_list``,
    ``JB_soft_resource_list``, ``JB_hard_queue_list``, ``JB_soft_queue_list``.
    OCS 9: ``JB_request_set_list``, one request set per scope (``JRS_scope``
    0 global, 1 master, 2 slave) with ``JRS_hard_resource_list``,
    ``JRS_soft_resource_list``, ``JRS_hard_queue_list``, ``JRS_soft_queue_list``
    (sge_job.h / ocs_JobRequestSet of OCS 9). The global set fills the
    top-level keys; master and slave sets go to ``scoped``.
    """
    out = {"hard_resources": _resource_list(fields.get("JB_hard_resource_list")),
           "soft_resources": _resource_list(fields.get("JB_soft_resource_list")),
           "hard_queues": _queue_list(fields.get("JB_hard_queue_list")),
           "soft_queues": _queue_list(fields.get("JB_soft_queue_list")),
           "scoped": {}}
    for request_set in _sublist(fields.get("JB_request_set_list")):
        parts = {c.tag: c for c in request_set if isinstance(c.tag, str)}
        scope_text = (parts["JRS_scope"].text or "0") if "JRS_scope" in parts else "0"
        try:
            scope = REQUEST_SCOPES.get(int(scope_text), scope_text)
        except ValueError:
            raise SchedulerParseError(f"qstat -j -xml: job {job_number}: JRS_scope {scope_text!r} "
                                      "is not an integer") from None
        found = {"hard_resources": _resource_list(parts.get("JRS_hard_resource_list")),
                 "soft_resources": _resource_list(parts.get("JRS_soft_resource_list")),
                 "hard_queues": _queue_list(parts.get("JRS_hard_queue_list")),
                 "soft_queues": _queue_list(parts.get("JRS_soft_queue_list"))}
        if scope == "global":
            for key, value in found.items():
                if isinstance(value, dict):
                    out[key].update(value)
                else:
                    out[key].extend(v for v in value if v not in out[key])
        else:
            out["scoped"][scope] = found
    return out


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

    requests = _requests(fields, job_number)

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
            word = int(values["JAT_state"]) if values.get("JAT_state") else None
        except (KeyError, ValueError):
            raise SchedulerParseError(f"qstat -j -xml: job {job_number}: task without integer "
                                      "JAT_task_number/JAT_status/JAT_state") from None
        state = task_state(word, status, hold)
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

    context: dict[str, str] = {}
    for item in _sublist(fields.get("JB_context")):
        values = children_text(item)
        if "VA_variable" in values:
            context[values["VA_variable"]] = values.get("VA_value", "")

    # Reservations (issue 17): -ar N (JB_ar, 0 = none), -R y (JB_reserve) and the PE request
    # (JB_pe, JB_pe_range's first RN_min), which a reserving job needs to name its slots.
    ar_text = (text("JB_ar") or "").strip()
    pe_range = fields.get("JB_pe_range")
    pe_min = next((t.text.strip() for t in pe_range.iter("RN_min") if t.text and t.text.strip().isdigit()),
                  None) if pe_range is not None else None
    # -a (JB_execution_time, 0 = none) and -tc (JB_ja_task_concurrency, 0 = no cap): pending reasons.
    concurrency = (text("JB_ja_task_concurrency") or "").strip()
    return {
        "start_at": epoch_or_iso_to_utc(text("JB_execution_time"), tz),
        "task_concurrency": int(concurrency) if concurrency.isdigit() and int(concurrency) > 0 else None,
        "advance_reservation": int(ar_text) if ar_text.isdigit() and int(ar_text) > 0 else None,
        "reserve": (text("JB_reserve") or "").strip().lower() in ("true", "1", "y", "yes"),
        "pe": (text("JB_pe") or "").strip() or None,
        "pe_slots": int(pe_min) if pe_min else None,
        "job_number": job_number,
        "name": text("JB_job_name") or "",
        "owner": text("JB_owner") or "",
        "project": text("JB_project") or None,
        "submitted_at": epoch_or_iso_to_utc(text("JB_submission_time"), tz),
        "hard_resources": requests["hard_resources"],
        "soft_resources": requests["soft_resources"],
        "hard_queues": requests["hard_queues"],
        "soft_queues": requests["soft_queues"],
        "scoped_requests": requests["scoped"],
        "tasks": tasks,
        "errors": errors,
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
    - ``hard_resources``, ``soft_resources``: ``{name: value}`` (``-l``,
      ``-soft -l``; ``CE_stringval``, else ``CE_doubleval``) and
      ``hard_queues``, ``soft_queues``: queue names (``-q``, ``-soft -q``),
      from the job's lists (SGE 8) or its global request set (OCS 9;
      master/slave request sets in ``scoped_requests``; see ``_requests``);
    - ``tasks``: ``[{"task_number", "state"}]`` for tasks the qmaster has
      enrolled, state from the full state word ``JAT_state`` where printed,
      else the ``JAT_status`` bit mask (:func:`task_state`).
      A non-array job has one task numbered 1, as Grid Engine stores it.
      Tasks not enrolled yet (most pending ones) are not listed;
    - ``errors``: ``[{"task_number", "message"}]``, the execd's reasons for
      a task's error state (``JAT_message_list``, qstat's "error reason" /
      OCS 9.2 "error_reason"; printed whatever ``schedd_job_info`` says);
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
    - ``context``: ``JB_context`` as ``{variable: value}`` (``-ac``);
    - ``advance_reservation``: the ``-ar`` id (``JB_ar``) or None; ``reserve``:
      ``-R y`` (``JB_reserve``); ``pe``, ``pe_slots``: the ``-pe`` name and its
      least slot count (``JB_pe``, ``JB_pe_range``), None without one;
    - ``start_at``: the requested start time (``-a``, ``JB_execution_time``; aware
      UTC) or None; ``task_concurrency``: the array's cap on running tasks
      (``-tc``, ``JB_ja_task_concurrency``) or None when uncapped.

    Raises UnknownJob when the id is unknown, SchedulerParseError otherwise.
    """
    jobs = parse_job_details(data, tz)
    if not jobs:
        raise SchedulerParseError("qstat -j -xml: no job in the output")
    return jobs[0]
