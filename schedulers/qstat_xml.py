"""Parsers of Grid Engine's XML status output (SGE 8.1.9 and OCS/GCS 9.x).

Pure Python and lxml; nothing here knows about Django. Every parser takes the
command's raw stdout (bytes) and returns plain records or dicts; output that is
not in a shape we know raises ``SchedulerParseError``.

Formats and sources (man pages of SGE 8.1.9 unless noted; OCS 9 keeps them):

- ``qstat -xml -u '*'``: qstat(1), schema ``qstat.xsd``; printer
  ``qstat_xml.c`` / ``sge_cull_xml.c`` (SGE 8.1.9), ``ocs_qstat_xml.cc`` (OCS).
- ``qstat -g c -xml``: qstat(1) "cluster queue summary".
- ``qhost -F -xml``: qhost(1), schema ``qhost.xsd``.
- ``qquota -xml``: qquota(1), schema ``qquota.xsd``.
- ``qstat -j ID -xml``: qstat(1); a dump of the job's CULL fields
  (sge_job.h / sge_ja_task.h element names).

Text handling, the same for every parser: the bytes are parsed as they are
when they are well-formed XML. Otherwise they are decoded as UTF-8 with
invalid bytes replaced by U+FFFD, characters XML 1.0 forbids (control
characters a job name may carry, since the Grid Engine printer escapes only
``< > & ' "``) are replaced by U+FFFD, and the result is parsed again. So a
job name with Latin-1 bytes or a ``\\x01`` never fails a poll; only output
that is not XML at all does. (Grid Engine escapes ``<`` as the literal text
``%lt;``, a long-standing bug in ``escape_string``; it is passed through.)

Times: ``qstat -xml`` prints local time of the qstat process without a zone
(``2025-03-10T09:00:05``; OCS adds microseconds, ``…:43.834192``). They are
read in ``tz`` (the cluster's zone, or UTC when qstat runs with ``TZ=UTC``)
and returned as aware UTC datetimes. In a backward DST change the earlier
of the two instants is taken (``fold=0``).
"""
from __future__ import annotations

import codecs
import contextlib
import datetime as dt
import gc
import re
from typing import Iterable, Iterator

from lxml import etree

from .base import QstatTask, SchedulerParseError, TaskDiff, UnknownJob
from .states import map_state

__all__ = [
    "parse_qstat",
    "diff_tasks",
    "expand_task_ranges",
    "parse_cluster_queue_summary",
    "parse_qhost",
    "parse_qquota",
    "parse_job_detail",
    "parse_job_details",
    "parse_memory",
    "job_status_state",
    "UTC",
]

UTC = dt.timezone.utc

# ---------------------------------------------------------------------------
# Loading XML
# ---------------------------------------------------------------------------

# Characters XML 1.0 does not allow (surrogates cannot occur after decoding).
_ILLEGAL_XML_CHARS = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]")
_XML_DECL = re.compile(r"^\s*<\?xml[^>]*\?>")
_DECL_ENCODING = re.compile(rb"""^\s*<\?xml[^>]*encoding\s*=\s*["']([A-Za-z0-9._-]+)["']""")


def _new_parser() -> etree.XMLParser:
    # A parser per call (they keep state, such as the error log, between
    # parses). huge_tree: a 100,000-job qstat is tens of MB; the input is
    # our own scheduler's output, never fetched from the network.
    return etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False,
                           huge_tree=True, collect_ids=False)


def _decode(data: bytes) -> str:
    """Decode as declared (UTF-8 by default), invalid bytes -> U+FFFD, and
    replace characters XML 1.0 forbids by U+FFFD."""
    encoding = "utf-8"
    match = _DECL_ENCODING.match(data[:200])
    if match:
        try:
            encoding = codecs.lookup(match.group(1).decode("ascii")).name
        except LookupError:
            encoding = "utf-8"
    text = data.decode(encoding, "replace")
    if _ILLEGAL_XML_CHARS.search(text):
        text = _ILLEGAL_XML_CHARS.sub("\ufffd", text)
    return text


def _strip_namespaces(root: etree._Element) -> None:
    # qquota -xml declares a default namespace (SGE 8.1.9 on the dev cluster,
    # OCS 9.2: xmlns="…/qquota.xsd"); the other commands only declare
    # xmlns:xsd. Strip it so one set of tag names works.
    for el in root.iter():
        tag = el.tag
        if isinstance(tag, str) and tag[:1] == "{":
            el.tag = tag.split("}", 1)[1]
    etree.cleanup_namespaces(root)


_SPACED_TAG = re.compile(r"<(/?)([A-Za-z_][\w.-]*(?: [A-Za-z_][\w.-]*)+)>")


def _load_xml(data: bytes, roots: tuple[str, ...], what: str) -> etree._Element:
    """Parse ``data`` (see the module docstring for the text rules) and check
    the root element is one of ``roots``."""
    if isinstance(data, str):
        data = data.encode("utf-8", "surrogateescape")
    if not data or not data.strip():
        raise SchedulerParseError(f"{what}: empty output")
    try:
        root = etree.fromstring(data, _new_parser())
    except etree.XMLSyntaxError:
        text = _XML_DECL.sub("", _decode(data), count=1)
        # qstat -j dumps CULL list names as tags, some with a space (SGE
        # 8.1.9 writes <job ids> in MES_job_number_list after qmod -cj):
        # not XML. A tag can never hold a bare word after its name, so join
        # such words with '_' (<job_ids>) and read the rest as written.
        text = _SPACED_TAG.sub(lambda m: "<" + m.group(1) + m.group(2).replace(" ", "_") + ">", text)
        try:
            root = etree.fromstring(text.encode("utf-8"), _new_parser())
        except etree.XMLSyntaxError as exc:
            raise SchedulerParseError(f"{what}: not well-formed XML: {exc}") from exc
    if root is None:
        raise SchedulerParseError(f"{what}: no XML document")
    if isinstance(root.tag, str) and root.tag[:1] == "{":
        _strip_namespaces(root)
    if root.tag not in roots:
        raise SchedulerParseError(f"{what}: root element <{root.tag}>, expected <{'|'.join(roots)}>")
    return root


def _children_text(el: etree._Element) -> dict[str, str]:
    """Leaf children of ``el`` as {tag: text}; '' for empty elements."""
    return {c.tag: (c.text or "") for c in el if isinstance(c.tag, str)}


# ---------------------------------------------------------------------------
# Times
# ---------------------------------------------------------------------------

def _iso_to_utc(text: str, tz: dt.tzinfo) -> dt.datetime:
    """``2025-03-10T09:00:05[.834192]`` local in ``tz`` (or with an offset) -> aware UTC."""
    value = dt.datetime.fromisoformat(text.strip())
    if value.tzinfo is None:
        value = value.replace(tzinfo=tz)
    return value.astimezone(UTC)


def _epoch_or_iso_to_utc(text: str | None, tz: dt.tzinfo) -> dt.datetime | None:
    """``qstat -j`` times: epoch seconds (SGE 8, or OCS with
    SGE_QSTAT_SGE_COMPATIBILITY) or ISO local time with µs (OCS 9). 0 -> None."""
    if text is None:
        return None
    text = text.strip()
    if not text:
        return None
    if text.isdigit():
        seconds = int(text)
        if seconds == 0:
            return None
        # Some OCS uint64 fields hold µs since the epoch.
        if seconds > 10**11:
            return dt.datetime(1970, 1, 1, tzinfo=UTC) + dt.timedelta(microseconds=seconds)
        return dt.datetime.fromtimestamp(seconds, UTC)
    try:
        return _iso_to_utc(text, tz)
    except ValueError as exc:
        raise SchedulerParseError(f"qstat -j: time {text!r} is neither epoch seconds nor ISO 8601") from exc


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
        text = _ILLEGAL_XML_CHARS.sub("\ufffd", text)
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
    declared = _DECL_ENCODING.match(data[:200])
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
    root = _load_xml(data, ("job_info",), "qstat -xml")
    rows = []
    for job_list in root.iter("job_list"):
        fields = _children_text(job_list)
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
        return _iso_to_utc(text, tz)
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


def diff_tasks(previous: dict[tuple[int, int], QstatTask], current: list[QstatTask]) -> TaskDiff:
    """Compare two polls. ``previous`` maps ``QstatTask.key`` to the last poll's
    task (``TaskDiff.current`` of the last call).

    ``added``: keys not in ``previous``; ``changed``: keys in both whose
    state_code, queue, host, slots, started_at or priority differ (current
    objects); ``gone``: previous tasks not listed now.
    """
    now: dict[tuple[int, int], QstatTask] = {}
    added: list[QstatTask] = []
    changed: list[QstatTask] = []
    get_previous = previous.get
    for task in current:
        key = (task.job_number, task.task_number or 0)
        now[key] = task
        before = get_previous(key)
        if before is None:
            added.append(task)
        elif (before.state_code != task.state_code or before.queue != task.queue
              or before.host != task.host or before.slots != task.slots
              or before.started_at != task.started_at or before.priority != task.priority):
            changed.append(task)
    gone = [task for key, task in previous.items() if key not in now]
    return TaskDiff(added=added, changed=changed, gone=gone, current=now)


# ---------------------------------------------------------------------------
# qstat -g c -xml
# ---------------------------------------------------------------------------

_CQ_INT_FIELDS = ("used", "resv", "available", "total", "temp_disabled", "manual_intervention")


def parse_cluster_queue_summary(data: bytes) -> list[dict]:
    """Parse ``qstat -g c -xml``: one dict per cluster queue.

    Keys: ``name`` (str), ``load`` (float, None when no load is reported:
    qstat omits the element), ``used, resv, available, total, temp_disabled,
    manual_intervention`` (int). With ``-ext`` the per-state counters
    (``suspend_manual``, ``load_alarm``, ``orphaned`` …) are added as ints.
    Source: qstat(1) "-g c"; printer ``cqueue_summary_xml_report_cqueue`` in
    qstat_xml.c.
    """
    root = _load_xml(data, ("job_info",), "qstat -g c -xml")
    result = []
    for el in root.iter("cluster_queue_summary"):
        fields = _children_text(el)
        if "name" not in fields:
            raise SchedulerParseError("qstat -g c -xml: cluster_queue_summary without <name>")
        item: dict = {"name": fields.pop("name")}
        load = fields.pop("load", "")
        try:
            item["load"] = float(load) if load.strip() else None
            for key in _CQ_INT_FIELDS:
                item[key] = int(fields.pop(key))
            for key, value in fields.items():
                item[key] = int(value)
        except KeyError as exc:
            raise SchedulerParseError(f"qstat -g c -xml: queue {item['name']}: no <{exc.args[0]}>") from None
        except ValueError as exc:
            raise SchedulerParseError(f"qstat -g c -xml: queue {item['name']}: {exc}") from None
        result.append(item)
    if not result and (root.find("queue_info") is not None or root.find("job_info") is not None):
        # Same root element as a job listing: say which output this is instead of "no queues".
        raise SchedulerParseError("qstat -g c -xml: this is a job listing (qstat -xml), not a queue summary")
    return result


# ---------------------------------------------------------------------------
# qhost -F -xml
# ---------------------------------------------------------------------------

_MEMORY = re.compile(r"\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([KkMmGgTtPp]?)\s*")
_MEMORY_FACTOR = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5,
                  "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4, "p": 1000**5}


def parse_memory(text: str | None) -> int | None:
    """Grid Engine memory value -> bytes: ``1.9G`` -> 2040109465, ``985.3M``,
    ``512K``, ``0.0``. Upper-case suffixes are powers of 1024, lower-case of
    1000 (sge_types(1), "memory_specifier"). ``-``, empty or None -> None.
    Raises SchedulerParseError on anything else.
    """
    if text is None:
        return None
    text = text.strip()
    if text in ("", "-", "NONE"):
        return None
    match = _MEMORY.fullmatch(text)
    if match is None:
        raise SchedulerParseError(f"memory value {text!r} is not a number with K/M/G/T suffix")
    return int(round(float(match.group(1)) * _MEMORY_FACTOR[match.group(2)]))


def _optional_number(text: str | None, kind: type, what: str):
    if text is None:
        return None
    text = text.strip()
    if text in ("", "-"):
        return None
    try:
        return kind(text)
    except ValueError:
        raise SchedulerParseError(f"qhost -xml: {what} {text!r} is not a number") from None


def parse_qhost(data: bytes) -> list[dict]:
    """Parse ``qhost -F -xml`` (qhost(1), qhost.xsd): one dict per host, the
    ``global`` pseudo-host included (its host values are all ``-``).

    Keys: ``name``; ``arch`` (str, None for ``-``); ``num_proc`` (int|None);
    ``load_avg`` (float|None); ``mem_total_bytes``, ``mem_used_bytes``,
    ``swap_total_bytes``, ``swap_used_bytes`` (int bytes|None, from ``1.9G``
    style values, K=1024); ``resources``: ``{name: {"value": str,
    "dominance": str}}`` from ``-F`` (dominance such as ``hl`` host load,
    ``hc``/``gc`` host/global consumable: the value is what is still free).
    """
    root = _load_xml(data, ("qhost",), "qhost -xml")
    hosts = []
    for host in root:
        if host.tag != "host":
            continue
        name = host.get("name")
        if not name:
            raise SchedulerParseError("qhost -xml: <host> without a name")
        values: dict[str, str] = {}
        resources: dict[str, dict[str, str]] = {}
        for child in host:
            if child.tag == "hostvalue":
                values[child.get("name", "")] = child.text or ""
            elif child.tag == "resourcevalue":
                resources[child.get("name", "")] = {"value": (child.text or "").strip(),
                                                    "dominance": child.get("dominance", "")}
        arch = values.get("arch_string", "").strip()
        hosts.append({
            "name": name,
            "arch": None if arch in ("", "-") else arch,
            "num_proc": _optional_number(values.get("num_proc"), int, f"{name} num_proc"),
            "load_avg": _optional_number(values.get("load_avg"), float, f"{name} load_avg"),
            "mem_total_bytes": parse_memory(values.get("mem_total")),
            "mem_used_bytes": parse_memory(values.get("mem_used")),
            "swap_total_bytes": parse_memory(values.get("swap_total")),
            "swap_used_bytes": parse_memory(values.get("swap_used")),
            "resources": resources,
        })
    return hosts


# ---------------------------------------------------------------------------
# qquota -xml
# ---------------------------------------------------------------------------

_QQUOTA_FILTERS = ("users", "xusers", "projects", "xprojects", "pes", "xpes",
                   "queues", "xqueues", "hosts", "xhosts")


def _number_or_text(text: str | None):
    if text is None:
        return None
    text = text.strip()
    try:
        return int(text)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        return text


def parse_qquota(data: bytes) -> list[dict]:
    """Parse ``qquota -xml`` (qquota(1), qquota.xsd): one dict per limit.

    Keys: ``rule`` (``set/rule``, e.g. ``agent_cap/1``), ``resource``,
    ``limit`` and ``used`` (int or float when numeric, else the text, e.g.
    a memory or time limit; ``used`` None when qquota prints no value),
    ``filters``: the rule's filters as printed, ``{"users": ["tco"],
    "xprojects": ["batch"], …}`` (keys among users, projects, pes, queues,
    hosts and their ``x`` excludes; only those present; comma lists split).
    A rule with no limit in use is not printed by qquota at all.
    """
    root = _load_xml(data, ("qquota_result",), "qquota -xml")
    result = []
    for rule in root:
        if rule.tag != "qquota_rule":
            continue
        name = rule.get("name")
        if not name:
            raise SchedulerParseError("qquota -xml: <qquota_rule> without a name")
        filters: dict[str, list[str]] = {}
        limits = []
        for child in rule:
            if child.tag == "limit":
                resource = child.get("resource")
                if not resource:
                    raise SchedulerParseError(f"qquota -xml: rule {name}: <limit> without resource")
                limits.append((resource, _number_or_text(child.get("limit")),
                               _number_or_text(child.get("value"))))
            elif child.tag in _QQUOTA_FILTERS:
                items = [v.strip() for v in (child.text or "").split(",") if v.strip()]
                filters.setdefault(child.tag, []).extend(items)
        for resource, limit, used in limits:
            result.append({"rule": name, "resource": resource, "limit": limit, "used": used,
                           "filters": {k: list(v) for k, v in filters.items()}})
    return result


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
        fields = _children_text(item)
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
        values = _children_text(item)
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
        values = _children_text(item)
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
            number = _children_text(item).get("JRE_job_number", "")
            if number.isdigit() and int(number) not in predecessors:
                predecessors.append(int(number))

    hard_queues = [name for item in _sublist(fields.get("JB_hard_queue_list"))
                   if (name := _children_text(item).get("QR_name"))]

    context: dict[str, str] = {}
    for item in _sublist(fields.get("JB_context")):
        values = _children_text(item)
        if "VA_variable" in values:
            context[values["VA_variable"]] = values.get("VA_value", "")

    return {
        "job_number": job_number,
        "name": text("JB_job_name") or "",
        "owner": text("JB_owner") or "",
        "project": text("JB_project") or None,
        "submitted_at": _epoch_or_iso_to_utc(text("JB_submission_time"), tz),
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
    root = _load_xml(data, ("detailed_job_info",), "qstat -j -xml")
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
