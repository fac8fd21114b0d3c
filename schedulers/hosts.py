"""Execution hosts and queue instances: their states, why, and the tasks on a lost host.

Sources: qstat(1) of SGE 8.1.9, ``-f`` ("full format": one block per queue
instance, ``queue@host``, with its ``states``) and ``-explain aAcE`` (the
reason of an alarm, suspend alarm, configuration ambiguity or error, printed
as ``<load-alarm-reason>`` and ``<message>`` elements; qstat.xsd names only
``message``, 8.1.9 prints the former for ``a``); qhost(1) for load and memory
(parsed by ``schedulers.qstat_xml.parse_qhost``).

A queue instance's state is a set of letters (qstat(1), "states"):

====== =====================================================================
letter meaning
====== =====================================================================
u      unknown: its host's execution daemon is not heard from (no load
       report within the cluster's ``max_unheard``)
a      load alarm: a load threshold (``load_thresholds``) is exceeded
A      suspend alarm: a suspend threshold is exceeded
C      suspended by its calendar
s      suspended (``qmod -s``)
S      suspended by subordination
d      disabled (``qmod -d``)
D      disabled by its calendar
E      error: the execution daemon could not start a job there (``qmod -c``
       clears it)
c      configuration ambiguous
o      orphaned: no longer configured, still has jobs
P      preempted
====== =====================================================================

A *host*'s state here is derived from its queue instances, by precedence:
``unreachable`` (any instance ``u``, or qhost lists the host with no load: its execd is not heard
from, which qhost shows before the qmaster marks the instances ``u``) > ``error`` (any ``E``) > ``alarm`` (any
``a``/``A``) > ``closed`` (every instance closed by its calendar only: ``C``/``D``
and no other letter) > ``disabled`` (every instance ``d``/``D``) > ``up``. A
calendar's closing is planned, not a problem: :func:`instance_problems` leaves
out instances whose only letters are ``C``/``D`` (the queue page shows the
calendar and when it opens, schedulers/calendars.py).

The scheduler keeps showing a job on an unknown host as running (``r``): it
cannot know. :func:`mark_unreachable` adds the host's ``u`` to such a task's
state letters, which ``schedulers.states.map_state`` maps to ``unknown``:
never done or failed on a guess. If the job asked to be rerun (``-r y``) the
qmaster reschedules it after ``reschedule_unknown`` (``Rq``, pending again).
"""
from __future__ import annotations

from typing import Iterable, Mapping

from lxml import etree

from schedulers.base import QstatTask, SchedulerParseError
from schedulers.states import map_state

__all__ = ["QINSTANCE_LETTERS", "HOST_STATES", "QSTAT_F_ARGV", "parse_queue_instances", "host_states",
           "unreachable_hosts", "mark_unreachable", "instance_problems", "tasks_with_host_states", "master_address"]

QINSTANCE_LETTERS: dict[str, str] = {
    "u": "unknown: its execution daemon is not heard from",
    "a": "load alarm: a load threshold is exceeded",
    "A": "suspend alarm: a suspend threshold is exceeded",
    "C": "suspended by its calendar",
    "s": "suspended",
    "S": "suspended by subordination",
    "d": "disabled",
    "D": "disabled by its calendar",
    "E": "error: a job could not be started there",
    "c": "configuration ambiguous",
    "o": "orphaned: no longer configured",
    "P": "preempted",
}

HOST_STATES = ("up", "unreachable", "error", "alarm", "closed", "disabled")
#: Queue instance letters set by a calendar (calendar_conf(5)): planned, not problems.
CALENDAR_LETTERS = frozenset("CD")

#: The one command that gives every queue instance's state and reasons, whatever the number of hosts.
QSTAT_F_ARGV = ["qstat", "-f", "-explain", "aAcE", "-xml"]

# Task states that have a host (the scheduler placed them); only these can be on a lost host.
_PLACED = frozenset({"starting", "running", "suspended", "deleting", "error", "unknown"})
_UNKNOWN_HOST_LETTER = "u"


def _parser() -> etree.XMLParser:
    # No entities, no network, no DTD: the text comes from a command, but is still input.
    return etree.XMLParser(resolve_entities=False, no_network=True, load_dtd=False, huge_tree=False,
                           remove_blank_text=True)


def _int(text: str | None, what: str) -> int:
    try:
        return int((text or "").strip())
    except ValueError:
        raise SchedulerParseError(f"qstat -f -xml: {what} {text!r} is not a whole number") from None


def parse_queue_instances(data: bytes) -> list[dict]:
    """Parse ``qstat -f -explain aAcE -xml``: one dict per queue instance.

    Keys: ``name`` (``agent.q@sge-exec1``), ``queue``, ``host``, ``qtype``,
    ``slots_used``, ``slots_resv``, ``slots_total`` (int), ``load_avg``
    (float, None when the host reports none, e.g. unknown), ``arch``,
    ``states`` (the letters, ``""`` when none), ``reasons`` (list of str:
    the ``-explain`` texts). Job lists in the output are ignored.

    Raises SchedulerParseError when the bytes are not this XML.
    """
    if not data or not data.strip():
        raise SchedulerParseError("qstat -f -xml: empty output")
    try:
        root = etree.fromstring(data, _parser())
    except etree.XMLSyntaxError as exc:
        raise SchedulerParseError(f"qstat -f -xml: not XML: {exc}") from None
    if root.tag != "job_info":
        raise SchedulerParseError(f"qstat -f -xml: root element <{root.tag}>, expected <job_info>")
    result = []
    for ql in root.iter("Queue-List"):
        fields: dict[str, str] = {}
        reasons: list[str] = []
        for child in ql:
            if not isinstance(child.tag, str) or child.tag == "job_list":
                continue
            text = (child.text or "").strip()
            if child.tag == "message" or child.tag.endswith("-reason"):
                if text:
                    reasons.append(text)
            else:
                fields[child.tag] = text
        name = fields.get("name", "")
        queue, sep, host = name.partition("@")
        if not sep or not queue or not host:
            raise SchedulerParseError(f"qstat -f -xml: queue instance name {name!r} is not queue@host")
        load = fields.get("load_avg", "")
        try:
            load_avg = float(load) if load else None
        except ValueError:
            raise SchedulerParseError(f"qstat -f -xml: {name}: load_avg {load!r} is not a number") from None
        result.append({
            "name": name, "queue": queue, "host": host, "qtype": fields.get("qtype", ""),
            "slots_used": _int(fields.get("slots_used", "0"), f"{name} slots_used"),
            "slots_resv": _int(fields.get("slots_resv", "0"), f"{name} slots_resv"),
            "slots_total": _int(fields.get("slots_total", "0"), f"{name} slots_total"),
            "load_avg": load_avg, "arch": fields.get("arch") or None,
            "states": fields.get("state", ""), "reasons": reasons,
        })
    return result


def _calendar_only(states: str) -> bool:
    return bool(states) and set(states) <= CALENDAR_LETTERS


def _host_state(letters: set[str], instance_count: int, disabled_count: int, closed_count: int = 0) -> str:
    if "u" in letters:
        return "unreachable"
    if "E" in letters:
        return "error"
    if letters & {"a", "A"}:
        return "alarm"
    if instance_count and closed_count == instance_count:
        return "closed"
    if instance_count and disabled_count == instance_count:
        return "disabled"
    return "up"


def host_states(qhost: Iterable[Mapping], instances: Iterable[Mapping],
                tasks_by_host: Mapping[str, list] | None = None) -> list[dict]:
    """One dict per execution host, sorted by name (the ``global`` pseudo host left out).

    ``qhost``: ``parse_qhost`` dicts; ``instances``: :func:`parse_queue_instances`
    dicts; ``tasks_by_host``: optional ``{host: [task, ...]}`` passed through
    as ``tasks``. Keys: ``name``, ``state`` (one of :data:`HOST_STATES`),
    ``why`` (list of str: each troubled instance's letters explained, then
    the ``-explain`` reasons), ``load_avg`` (float|None), ``num_proc``,
    ``mem_total_bytes``, ``mem_used_bytes`` (int bytes|None), ``slots_used``,
    ``slots_total`` (sums over its queue instances), ``queues`` (list of
    ``{"name", "queue", "states", "slots_used", "slots_total"}``), ``tasks``.
    A host qhost lists with no load is ``unreachable`` whatever its queue
    instances say (why: ``qhost: no load reported`` unless an instance is
    ``u``); a host in qhost without queue instances is listed; an instance
    whose host qhost lacks is too.
    """
    tasks_by_host = tasks_by_host or {}
    by_host: dict[str, dict] = {}
    silent: set[str] = set()  # hosts qhost lists with no load: their execd is not heard from
    for h in qhost:
        if h.get("name") == "global":
            continue
        if h.get("load_avg") is None:
            silent.add(h["name"])
        by_host[h["name"]] = {"name": h["name"], "load_avg": h.get("load_avg"), "num_proc": h.get("num_proc"),
                              "mem_total_bytes": h.get("mem_total_bytes"), "mem_used_bytes": h.get("mem_used_bytes"),
                              "queues": [], "why": []}
    for qi in instances:
        host = by_host.setdefault(qi["host"], {"name": qi["host"], "load_avg": qi.get("load_avg"), "num_proc": None,
                                               "mem_total_bytes": None, "mem_used_bytes": None,
                                               "queues": [], "why": []})
        host["queues"].append({"name": qi["name"], "queue": qi["queue"], "states": qi["states"],
                               "slots_used": qi["slots_used"], "slots_total": qi["slots_total"]})
        for letter in qi["states"]:
            host["why"].append(f"{qi['name']}: {letter} = {QINSTANCE_LETTERS.get(letter, 'state not known to tco')}")
        host["why"].extend(f"{qi['name']}: {reason}" for reason in qi["reasons"])
    result = []
    for name in sorted(by_host):
        host = by_host[name]
        letters = {letter for q in host["queues"] for letter in q["states"]}
        disabled = sum(1 for q in host["queues"] if set(q["states"]) & {"d", "D"})
        closed = sum(1 for q in host["queues"] if _calendar_only(q["states"]))
        if name in silent:
            state = "unreachable"
        else:
            state = _host_state(letters, len(host["queues"]), disabled, closed) if host["queues"] else "up"
        if name in silent and _UNKNOWN_HOST_LETTER not in letters:
            host["why"].append("qhost: no load reported")
        host.update(state=state,
                    slots_used=sum(q["slots_used"] for q in host["queues"]),
                    slots_total=sum(q["slots_total"] for q in host["queues"]),
                    tasks=list(tasks_by_host.get(name, [])))
        result.append(host)
    return result


def unreachable_hosts(instances: Iterable[Mapping]) -> frozenset[str]:
    """Hosts with a queue instance in state ``u`` (their execution daemon is not heard from)."""
    return frozenset(qi["host"] for qi in instances if _UNKNOWN_HOST_LETTER in qi["states"])


def instance_problems(instances: Iterable[Mapping]) -> list[dict]:
    """Queue instances in any state (alarm, unknown, disabled, error ...), for the queue page.

    Returns ``[{"name", "queue", "host", "states", "meanings": [str], "reasons": [str]}]``
    in the order given; instances without state letters are left out, and so are those
    whose only letters are their calendar's (``C``/``D``: planned closing, shown with the
    queue's calendar).
    """
    return [{"name": qi["name"], "queue": qi["queue"], "host": qi["host"], "states": qi["states"],
             "meanings": [QINSTANCE_LETTERS.get(letter, "state not known to tco") for letter in qi["states"]],
             "reasons": list(qi["reasons"])}
            for qi in instances if qi["states"] and not _calendar_only(qi["states"])]


def mark_unreachable(tasks: Iterable[QstatTask], unreachable: Iterable[str]) -> int:
    """Give tasks placed on an unreachable host the host's ``u`` letter, hence state ``unknown``.

    Mutates the tasks: ``state_code`` ``r`` becomes ``ru`` and ``state`` is
    ``map_state(state_code)`` (``unknown``; ``restarted`` kept). Pending
    tasks (no host) are untouched. Returns how many were marked.
    """
    lost = frozenset(unreachable)
    if not lost:
        return 0
    marked = 0
    for task in tasks:
        if task.host in lost and task.state in _PLACED and _UNKNOWN_HOST_LETTER not in task.state_code:
            task.state_code += _UNKNOWN_HOST_LETTER
            task.state, task.restarted = map_state(task.state_code)
            marked += 1
    return marked


def master_address(sge_root: str, sge_cell: str) -> str:
    """The IPv4 address the execution hosts reach the master host at.

    Read from the cell's ``common/act_qmaster`` (the master's name) and this
    machine's resolver: with execution hosts in namespaces
    (scripts/dev-cluster) it is the master's address on their bridge; on a
    single-host cluster, its loopback address. A service the runners must
    reach on the master (the stand-in model) listens there. Raises OSError
    when the file is missing or the name does not resolve.
    """
    import socket
    from pathlib import Path

    name = (Path(sge_root) / sge_cell / "common" / "act_qmaster").read_text().strip()
    if not name:
        raise OSError(f"{sge_root}/{sge_cell}/common/act_qmaster is empty")
    return socket.gethostbyname(name)


def tasks_with_host_states(scheduler) -> list[QstatTask]:
    """One poll: the scheduler's tasks, those on unreachable hosts marked ``unknown``.

    Two commands whatever the number of hosts: ``scheduler.list_tasks()``
    (``qstat -xml -u '*'``) and, when the adapter has it,
    ``scheduler.queue_instances()`` (:data:`QSTAT_F_ARGV`), run at the same time: each waits
    mostly on the qmaster, and the live pages wait for the poll (issue 22: a poll's two qstat
    calls one after the other were 0.3-0.6 s each on the loaded dev cluster). Raises what they
    raise (``SchedulerError``); a failed poll is never an empty one.
    """
    from concurrent.futures import ThreadPoolExecutor

    queue_instances = getattr(scheduler, "queue_instances", None)
    if queue_instances is None:
        return scheduler.list_tasks()
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tco-qstat-f") as pool:
        instances = pool.submit(queue_instances)
        tasks = scheduler.list_tasks()
        mark_unreachable(tasks, unreachable_hosts(instances.result()))
    return tasks
