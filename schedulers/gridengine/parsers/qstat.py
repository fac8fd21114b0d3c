"""Parser of ``qstat -xml -u '*'`` (the job listing).

Sources: qstat(1), schema ``qstat.xsd``; printer ``qstat_xml.c`` / ``sge_cull_xml.c``
(SGE 8.1.9), ``ocs_qstat_xml.cc`` (OCS 9). Text and time handling: :mod:`.xmltools`.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import gc
import re
from typing import Iterable, Iterator

from schedulers.base import QstatTask, SchedulerParseError
from schedulers.states import map_state

from .xmltools import DECL_ENCODING, ILLEGAL_XML_CHARS, UTC, children_text, iso_to_utc, load_xml

__all__ = ["parse_qstat", "expand_task_ranges", "UTC"]

# ---------------------------------------------------------------------------
# qstat -xml -u '*'
# ---------------------------------------------------------------------------

_TASK_ITEM = re.compile(r"(\d+)(?:-(\d+)(?::(\d+))?)?")


def expand_task_ranges(spec: str) -> list[int]:
    """Expand a qstat task spec: comma-separated ``N``, ``A-B`` or ``A-B:S``.

    ``"2,5-9:2"`` -> ``[2, 5, 7, 9]``; ``"4-10:1"`` -> ``[4, …, 10]``.
    Raises SchedulerParseError on anything else (source: qstat(1) "tasks",
    the ``-t n[-m[:s]]`` syntax of submit(1)).
    """
    numbers: list[int] = []
    for item in spec.split(","):
        match = _TASK_ITEM.fullmatch(item.strip())
        if match is None:
            raise SchedulerParseError(f"qstat: task spec {spec!r} is not N, A-B or A-B:S")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) else first
        step = int(match.group(3)) if match.group(3) else 1
        if first < 1 or last < first or step < 1:
            raise SchedulerParseError(f"qstat: task range {item!r} in {spec!r} is empty or invalid")
        if first == last:
            numbers.append(first)
        else:
            numbers.extend(range(first, last + 1, step))
    return numbers


# The default ``qstat -xml -u '*'`` layout of one job, as SGE 8.1.9 and OCS 9
# print it (qstat_xml.c ``qstat_xml_job``, ocs_qstat_xml.cc): every field on
# its own line, in this order; the time element is the start time (running)
# or the submission time (pending; JAT_submission_time in OCS 9).
_FAST_JOB = re.compile(
    r"<job_list[^>]*>\s*"
    r"<JB_job_number>([^<]*)</JB_job_number>\s*"
    r"<JAT_prio>([^<]*)</JAT_prio>\s*"
    r"<JB_name>([^<]*)</JB_name>\s*"
    r"<JB_owner>([^<]*)</JB_owner>\s*"
    r"<state>([^<]*)</state>\s*"
    r"(?:<(JAT_start_time|JB_submission_time|JAT_submission_time)>([^<]*)</\6>\s*)?"
    r"<queue_name>([^<]*)</queue_name>\s*"
    r"<slots>([^<]*)</slots>\s*"
    r"(?:<tasks>([^<]*)</tasks>\s*)?"
    r"</job_list>")
_FAST_ROOT = re.compile(r"\s*(?:<\?xml[^>]*\?>\s*)?<job_info[\s>]")
_FAST_END = re.compile(r"</job_info>\s*\Z")
_ENTITY = re.compile(r"&(#[0-9]+|#x[0-9A-Fa-f]+|[A-Za-z]+);")
_NAMED_ENTITIES = {"lt": "<", "gt": ">", "amp": "&", "apos": "'", "quot": '"'}

# A row, whichever path produced it: (job_number, prio, name, owner, state,
# time_tag, time_text, queue_name, slots, tasks[, project]); '' = absent.
_Row = tuple


def _xml_unescape(text: str) -> str:
    def repl(match: re.Match) -> str:
        ref = match.group(1)
        if ref[0] == "#":
            try:
                return chr(int(ref[2:], 16) if ref[1] in "xX" else int(ref[1:]))
            except (ValueError, OverflowError):
                raise SchedulerParseError(f"qstat -xml: invalid character reference &{ref};") from None
        try:
            return _NAMED_ENTITIES[ref]
        except KeyError:
            raise SchedulerParseError(f"qstat -xml: undefined entity &{ref};") from None
    return _ENTITY.sub(repl, text)


def _clean_text(text: str) -> str:
    """A text field read by the fast path, made equal to what lxml gives."""
    if "&" in text:
        text = _xml_unescape(text)
    if not text.isprintable():
        text = ILLEGAL_XML_CHARS.sub("\ufffd", text)
    return text


def _fast_job_rows(data: bytes) -> list[_Row] | None:
    """Read default-layout ``qstat -xml`` output without building a tree.

    One regular expression matches a whole ``<job_list>`` of the default
    layout (see _FAST_JOB): 100,000 job_list elements (34 MB) take ~0.15 s
    here, where building and walking an lxml tree takes ~0.5 s. It is only trusted when every
    ``<job_list`` in the document matched and the document is a complete
    ``<job_info>``; otherwise (``-ext``, ``-r``, ``-f``, truncated output,
    garbage) it returns None and the caller parses with lxml, which is also
    what decides that output is not XML. Both paths give the same tasks
    (tests/unit/test_qstat_xml.py compares them on every fixture).
    """
    declared = DECL_ENCODING.match(data[:200])
    if declared and declared.group(1).lower() not in (b"utf-8", b"utf8"):
        return None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("utf-8", "replace")
    if not _FAST_ROOT.match(text) or not _FAST_END.search(text[-100:]):
        return None
    rows = _FAST_JOB.findall(text)
    if len(rows) != text.count("<job_list"):
        return None
    return rows


def _lxml_job_rows(data: bytes) -> list[_Row]:
    root = load_xml(data, ("job_info",), "qstat -xml")
    rows = []
    for job_list in root.iter("job_list"):
        fields = children_text(job_list)
        queue_name = fields.get("queue_name", "")
        parent = job_list.getparent()
        # qstat -f groups running jobs under <Queue-List><name>q@host</name>.
        if not queue_name and parent is not None and parent.tag == "Queue-List":
            queue_name = parent.findtext("name") or ""
        time_tag = time_text = ""
        for tag in ("JAT_start_time", "JB_submission_time", "JAT_submission_time"):
            if fields.get(tag):
                time_tag, time_text = tag, fields[tag]
                break
        missing = [tag for tag in ("JB_job_number", "JB_name", "JB_owner", "state", "slots") if tag not in fields]
        if missing:
            raise SchedulerParseError(
                f"qstat -xml: job_list {fields.get('JB_job_number', '?')} has no <{missing[0]}>")
        rows.append((fields["JB_job_number"], fields.get("JAT_prio", ""), fields["JB_name"], fields["JB_owner"],
                     fields["state"], time_tag, time_text, queue_name, fields["slots"], fields.get("tasks", ""),
                     fields.get("JB_project", "")))
    return rows


@contextlib.contextmanager
def _paused_gc() -> Iterator[None]:
    """Pause the cyclic garbage collector while a poll's tasks are built.

    Building 100,000 tracked objects that all stay alive makes the collector
    scan them over and over (half the time of a large array); the builder
    creates no reference cycles, so nothing is lost by pausing it.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def _tasks_from_rows(rows: Iterable[_Row], tz: dt.tzinfo) -> list[QstatTask]:
    tasks: list[QstatTask] = []
    append = tasks.append
    Task = QstatTask
    clean = _clean_text
    # Per-poll memo tables: the same strings repeat across thousands of rows.
    times: dict[str, dt.datetime | None] = {"": None}
    queues: dict[str, tuple[str | None, str | None]] = {"": (None, None)}
    states: dict[str, tuple[str, bool]] = {}
    numbers: dict[str, float] = {"": 0.0}
    owners: dict[str, str] = {}
    for row in rows:
        if len(row) == 10:
            job_text, prio_text, name, owner_text, code, time_tag, time_text, queue_text, slots_text, spec = row
            project = None
        else:
            (job_text, prio_text, name, owner_text, code, time_tag, time_text, queue_text, slots_text, spec,
             project) = row
            project = clean(project) or None
        try:
            job_number = int(job_text)
            slots = int(slots_text)
            priority = numbers.get(prio_text)
            if priority is None:
                priority = numbers[prio_text] = float(prio_text)
        except ValueError:
            raise SchedulerParseError(
                f"qstat -xml: job {job_text!r}: job number, slots {slots_text!r} or priority {prio_text!r} "
                "is not a number") from None
        if "&" in name or not name.isprintable():
            name = clean(name)
        owner = owners.get(owner_text)
        if owner is None:
            owner = owners[owner_text] = clean(owner_text)
        state = states.get(code)
        if state is None:
            state = states[code] = map_state(code)
        queue_host = queues.get(queue_text)
        if queue_host is None:
            q, sep, h = clean(queue_text).partition("@")
            queue_host = queues[queue_text] = (q or None, h if sep and h else None)
        when = times.get(time_text)
        if when is None and time_text:
            when = times[time_text] = _parse_qstat_time(time_text, tz, job_number)
        if time_tag == "JAT_start_time":
            submitted, started = None, when
        else:
            submitted, started = when, None
        if not spec:
            append(Task(job_number, None, name, owner, project, state[0], code, state[1],
                        queue_host[0], queue_host[1], slots, submitted, started, priority))
            continue
        for task_number in expand_task_ranges(spec):
            append(Task(job_number, task_number, name, owner, project, state[0], code, state[1],
                        queue_host[0], queue_host[1], slots, submitted, started, priority))
    return tasks


def _parse_qstat_time(text: str, tz: dt.tzinfo, job_number: int) -> dt.datetime:
    try:
        return iso_to_utc(text, tz)
    except ValueError:
        raise SchedulerParseError(f"qstat -xml: job {job_number}: time {text!r} is not ISO 8601") from None


def parse_qstat(data: bytes, tz: dt.tzinfo = UTC) -> list[QstatTask]:
    """Parse ``qstat -xml -u '*'`` (SGE 8.1.9, OCS 9.x) into one QstatTask per task.

    - Running tasks come one ``<job_list>`` per task; pending tasks of an
      array come as one row with a ``<tasks>`` spec (``N``, ``A-B``,
      ``A-B:S``, comma lists), expanded here to one QstatTask each.
    - A job without ``<tasks>`` is not an array: ``task_number`` None.
    - ``submitted_at`` from ``JB_submission_time`` (SGE) or
      ``JAT_submission_time`` (OCS 9), pending rows only; ``started_at`` from
      ``JAT_start_time``, running rows only. Zone-less times are read in
      ``tz`` and returned as aware UTC; OCS µs are kept.
    - ``queue_name`` ``agent.q@vm`` gives ``queue='agent.q'``, ``host='vm'``;
      both None while pending. ``project`` only with ``-ext``, else None.
    - ``state``/``restarted`` from ``states.map_state``.

    The output of ``qstat -f -xml`` (jobs under ``<Queue-List>``) is accepted too.
    Raises SchedulerParseError when the output is not qstat XML.
    """
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    rows = _fast_job_rows(data)
    if rows is None:
        rows = _lxml_job_rows(data)
    with _paused_gc():
        return _tasks_from_rows(rows, tz)
