"""Parser of ``qrstat -xml`` and ``qrstat -ar ID -xml`` (advance reservations).

Source: qrstat(1) of SGE 8.1.9 and OCS 9 ("OUTPUT FORMATS": the summary
without ``-ar``, the detailed format with it); the element names are those
the dev cluster's SGE 8.1.9 prints (``tests/fixtures/sge819/qrstat_*.xml``)
and OCS 9.2 prints (``/work/shared/captures/ocs-9.2.0prealpha/qrstat_*.xml``):
a ``<qrstat>`` root holding one ``<ar_summary>`` per reservation with
``id, name, owner, state, start_time, end_time, duration``; the detailed
format adds ``submission_time, group, account``, the granted queue
instances and slots (OCS 9: ``<exec_queue_list>``; SGE 8.1.9:
``<granted_slots_list>`` of ``<granted_slots queue_instance=… slots=…/>``), the requested
``<resource_list>`` (``-l``), ``<granted_parallel_environment>`` (``-pe``)
and ``<acl_list>`` (``-u``), each where set. Times are printed without a zone
in the qrstat process's ``TZ`` (tco runs it with ``TZ=UTC``).

State letters (qrstat(1)): ``w`` waiting, ``W`` warning (waiting with an
error), ``r`` running, ``E`` error (running with an error), ``d`` deleted.
"""
from __future__ import annotations

import datetime as dt
import re

from schedulers.base import SchedulerParseError

from .xmltools import UTC, children_text, epoch_or_iso_to_utc, load_xml

#: qrstat(1) state letters -> tco's words.
AR_STATES = {"w": "waiting", "W": "warning", "r": "running", "E": "error", "d": "deleted",
             "x": "exited", "u": "unknown"}

_DURATION = re.compile(r"^(\d+):(\d{1,2}):(\d{1,2})$")


def duration_seconds(text: str) -> int | None:
    """``HH:MM:SS`` (hours may exceed 24; qrstat(1)) or plain seconds -> seconds; None if neither."""
    text = (text or "").strip()
    match = _DURATION.match(text)
    if match:
        hours, minutes, seconds = (int(g) for g in match.groups())
        return hours * 3600 + minutes * 60 + seconds
    return int(text) if text.isdigit() else None


def _resources(el) -> dict[str, str]:
    """``<resource_list>``: ``{name: value}``. SGE 8.1.9 prints ``<resource name="anthropic_api"
    type="2"/>`` (the value in ``type``); text content or a ``value`` attribute win where present, and
    a ``CE_name``/``CE_stringval`` element list is read too (other printers)."""
    result: dict[str, str] = {}
    if el is None:
        return result
    for item in el:
        if not isinstance(item.tag, str):
            continue
        name = item.get("name")
        if name:
            # SGE 8.1.9 prints the value in the type attribute: <resource name="anthropic_api" type="2"/>
            # (tests/fixtures/sge819/qrstat_ar_seats.xml; its plain output says anthropic_api=2).
            result[name] = ((item.text or "").strip() or item.get("value") or item.get("type") or "").strip()
            continue
        values = children_text(item)
        if values.get("CE_name"):
            result[values["CE_name"]] = values.get("CE_stringval") or values.get("CE_doubleval", "")
        elif "=" in (item.text or ""):  # "anthropic_api=2", as the plain format prints it
            key, _, value = item.text.strip().partition("=")
            result[key.strip()] = value.strip()
    return result


def parse_qrstat(data: bytes, tz: dt.tzinfo = UTC) -> list[dict]:
    """Parse ``qrstat [-u '*'] [-ar ID,...] -xml``: one dict per advance reservation.

    Keys: ``id`` (int), ``name`` (str, "" when unnamed), ``owner``,
    ``state_code`` (letter), ``state`` (``AR_STATES`` word), ``start_at``,
    ``end_at`` (aware UTC), ``duration_s`` (int seconds); with ``-ar`` also
    ``submitted_at`` (aware UTC or None), ``group``, ``account``,
    ``queues`` (``[{"queue_instance", "queue", "host", "slots"}]``),
    ``slots`` (int: the sum of the granted queue slots), ``resources``
    (``{"anthropic_api": "2"}``: the ``-l`` requests), ``pe`` (name or None),
    ``pe_slots`` (int or None), ``users`` (the ``-u`` ACL names). Keys of
    the detailed format are absent in summary output, so a caller tells
    "not asked" from "none".

    An empty ``<qrstat/>`` (no reservation) gives ``[]``. Raises
    SchedulerParseError when the output is not qrstat XML or a reservation
    lacks its id or times.
    """
    root = load_xml(data, ("qrstat",), "qrstat -xml")
    result = []
    for el in root.iter("ar_summary"):
        fields = children_text(el)
        try:
            ar_id = int(fields["id"])
        except (KeyError, ValueError):
            raise SchedulerParseError(f"qrstat -xml: ar_summary without an integer <id>: {fields.get('id')!r}") from None
        start = epoch_or_iso_to_utc(fields.get("start_time"), tz)
        end = epoch_or_iso_to_utc(fields.get("end_time"), tz)
        if start is None or end is None:
            raise SchedulerParseError(f"qrstat -xml: reservation {ar_id} without start_time/end_time")
        duration = duration_seconds(fields.get("duration", ""))
        code = (fields.get("state") or "").strip()
        item: dict = {
            "id": ar_id, "name": (fields.get("name") or "").strip(), "owner": (fields.get("owner") or "").strip(),
            "state_code": code, "state": AR_STATES.get(code, code or "unknown"),
            "start_at": start, "end_at": end,
            "duration_s": duration if duration is not None else int((end - start).total_seconds()),
        }
        if "submission_time" in fields or el.find("exec_queue_list") is not None \
                or el.find("granted_slots_list") is not None:
            item["submitted_at"] = epoch_or_iso_to_utc(fields.get("submission_time"), tz)
            item["group"] = (fields.get("group") or "").strip()
            item["account"] = (fields.get("account") or "").strip()
            queues = []
            # OCS 9: <exec_queue><queue_instance>q@h</queue_instance><slots>1</slots></exec_queue>;
            # SGE 8.1.9: <granted_slots queue_instance="q@h" slots="2"/> in <granted_slots_list>.
            for q in [*el.iter("exec_queue"), *el.iter("granted_slots")]:
                values = {**children_text(q), **{k: v for k, v in q.attrib.items()}}
                instance = (values.get("queue_instance") or "").strip()
                try:
                    slots = int(values.get("slots") or 0)
                except ValueError:
                    raise SchedulerParseError(f"qrstat -xml: reservation {ar_id}: slots {values.get('slots')!r}") from None
                queue, _, host = instance.partition("@")
                queues.append({"queue_instance": instance, "queue": queue, "host": host, "slots": slots})
            item["queues"] = queues
            item["slots"] = sum(q["slots"] for q in queues)
            item["resources"] = _resources(el.find("resource_list"))
            pe = el.find("granted_parallel_environment")
            pe_fields = children_text(pe) if pe is not None else {}
            item["pe"] = (pe_fields.get("parallel_environment") or "").strip() or None
            range_text = (pe_fields.get("slots") or "").strip()
            item["pe_slots"] = int(range_text.split("-")[0]) if range_text.split("-")[0].isdigit() else None
            item["users"] = [(u.text or "").strip() for u in el.iter("acl") if (u.text or "").strip()]
        result.append(item)
    return result
