"""Parsers of OCS 9.2's ``-fmt json`` outputs: ``qstat``, ``qstat -g c``, ``qhost -F``, ``qquota``.

Shapes: real output of OCS 9.2.0prealpha (tests/fixtures/ocs920/, from the
captures of a cell configured like the dev cluster) and the JSON schemas that
ship in ``$SGE_ROOT/util/resources/json-schemas/v9.2/``
(``ocs-qstat-reduced``, ``ocs-qstat-cqueue``, ``ocs-qhost-root``,
``ocs-qquota-root``). Each parser returns exactly what its XML counterpart
returns for the same cell state, so the adapter can prefer JSON where the
clients offer it (``-fmt`` in ``qstat -help``) and fall back to XML.

What differs from the XML, and is handled here: times are UTC with ``Z``
and milliseconds, whatever ``TZ`` the client or qmaster has (the 9.2 XML is
rendered in the qmaster's zone); ``tasks`` is a string (``"5"``,
``"97-200:1"``); memory values are numbers of bytes; missing host values are
``0`` (the ``global`` host), which become None as the XML's ``-`` does.
"""
from __future__ import annotations

import datetime as dt
import json
from typing import Any

from schedulers.base import QstatTask, SchedulerParseError
from schedulers.states import map_state

from .qstat import expand_task_ranges
from .qquota import QQUOTA_FILTERS

UTC = dt.timezone.utc


def _load(data: bytes, what: str, key: str | None) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise SchedulerParseError(f"{what} -fmt json: not JSON: {exc}") from None
    if not isinstance(doc, dict) or "$schema" not in doc:
        raise SchedulerParseError(f"{what} -fmt json: not an OCS JSON document (no $schema)")
    if key is not None and not isinstance(doc.get(key, []), list):
        raise SchedulerParseError(f"{what} -fmt json: {key} is not a list")
    return doc


def _time(text: Any, what: str) -> dt.datetime | None:
    if text in (None, "", 0):
        return None
    try:
        value = dt.datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        raise SchedulerParseError(f"{what}: time {text!r} is not ISO 8601") from None
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).astimezone(UTC)


def parse_qstat_json(data: bytes) -> list[QstatTask]:
    """``qstat -fmt json -u '*'`` (also with ``-ext``/``-r``/``-urg``/``-pri``) -> tasks,
    as ``parse_qstat`` gives for the XML: ``jobs_running`` then ``jobs_pending``
    (``jobs_finished_retained``, only with ``-s f|a``, is not the queue and is skipped).
    ``project`` is set where the document has it (``-ext``). Raises SchedulerParseError.
    """
    doc = _load(data, "qstat", None)
    tasks: list[QstatTask] = []
    for key in ("jobs_running", "jobs_pending"):
        for job in doc.get(key) or []:
            try:
                job_number = int(job["job_number"])
                slots = int(job.get("slots", 1))
                priority = float(job.get("prio", 0.0))
                code = str(job["state"])
            except (KeyError, TypeError, ValueError) as exc:
                raise SchedulerParseError(f"qstat -fmt json: {key} entry {job!r}: {exc}") from None
            state, restarted = map_state(code)
            queue, _, host = str(job.get("queue_name") or "").partition("@")
            started = _time(job.get("start_time"), f"qstat job {job_number}")
            submitted = _time(job.get("submission_time"), f"qstat job {job_number}")
            spec = str(job.get("tasks") or "")
            for task_number in (expand_task_ranges(spec) if spec else [None]):
                tasks.append(QstatTask(job_number, task_number, str(job.get("name", "")), str(job.get("owner", "")),
                                       job.get("project") or None, state, code, restarted, queue or None,
                                       host or None, slots, submitted, started, priority))
    return tasks


def parse_queue_summary_json(data: bytes) -> list[dict]:
    """``qstat -g c -fmt json`` -> ``parse_cluster_queue_summary``'s dicts (``load`` None when absent)."""
    doc = _load(data, "qstat -g c", "queues")
    out = []
    for queue in doc.get("queues") or []:
        try:
            item = {"name": str(queue["name"]), "load": float(queue["load"]) if "load" in queue else None}
            for key, value in queue.items():
                if key not in ("name", "load"):
                    item[key] = int(value)
        except (KeyError, TypeError, ValueError) as exc:
            raise SchedulerParseError(f"qstat -g c -fmt json: queue {queue!r}: {exc}") from None
        out.append(item)
    return out


def _value_text(value: Any) -> str:
    """A resource value as the XML prints it: integers without ``.0``."""
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def parse_qhost_json(data: bytes) -> list[dict]:
    """``qhost -F -fmt json`` -> ``parse_qhost``'s dicts (``0`` of the global host -> None)."""
    doc = _load(data, "qhost", "hosts")
    hosts = []
    for host in doc.get("hosts") or []:
        name = host.get("name")
        if not name:
            raise SchedulerParseError("qhost -fmt json: host without a name")
        is_global = name == "global"

        def number(key: str, kind: type):
            value = host.get(key)
            if value is None or (is_global and value == 0):
                return None
            try:
                return kind(value)
            except (TypeError, ValueError):
                raise SchedulerParseError(f"qhost -fmt json: {name} {key} {value!r} is not a number") from None

        arch = str(host.get("arch_string") or "").strip()
        hosts.append({
            "name": name,
            "arch": None if arch in ("", "-") else arch,
            "num_proc": number("num_proc", int),
            "load_avg": number("load_avg", float),
            "mem_total_bytes": number("mem_total", int),
            "mem_used_bytes": number("mem_used", int),
            "swap_total_bytes": number("swap_total", int),
            "swap_used_bytes": number("swap_used", int),
            "resources": {str(r.get("name", "")): {"value": _value_text(r.get("value", "")),
                                                   "dominance": str(r.get("dominance", ""))}
                          for r in host.get("resources") or []},
        })
    return hosts


def parse_qquota_json(data: bytes) -> list[dict]:
    """``qquota -fmt json -u '*'`` -> ``parse_qquota``'s dicts: ``rule`` is
    ``rqs_name/rule_name``; each filter list (``queues``, ``users`` …) of
    ``{"exclude", "name"}`` becomes ``queues``/``xqueues`` name lists."""
    doc = _load(data, "qquota", "quota_usage")
    out = []
    for entry in doc.get("quota_usage") or []:
        try:
            rule = f"{entry['rqs_name']}/{entry['rule_name']}"
            resource = str(entry["resource"])
        except KeyError as exc:
            raise SchedulerParseError(f"qquota -fmt json: entry without {exc.args[0]}") from None
        filters: dict[str, list[str]] = {}
        for key in ("users", "projects", "pes", "queues", "hosts"):
            for item in entry.get(key) or []:
                name = f"x{key}" if item.get("exclude") else key
                if name in QQUOTA_FILTERS:
                    filters.setdefault(name, []).append(str(item.get("name", "")))
        out.append({"rule": rule, "resource": resource, "limit": entry.get("max"), "used": entry.get("used"),
                    "filters": filters})
    return out
