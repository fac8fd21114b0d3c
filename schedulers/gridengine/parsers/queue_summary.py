"""Parser of ``qstat -g c -xml`` (cluster queue summary; qstat(1) "-g c").
"""
from __future__ import annotations

from schedulers.base import SchedulerParseError

from .xmltools import children_text, load_xml

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
    root = load_xml(data, ("job_info",), "qstat -g c -xml")
    result = []
    for el in root.iter("cluster_queue_summary"):
        fields = children_text(el)
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
