"""Parser of ``qquota -u '*' -xml`` (qquota(1), schema ``qquota.xsd``).
"""
from __future__ import annotations

from schedulers.base import SchedulerParseError

from .xmltools import load_xml

# ---------------------------------------------------------------------------
# qquota -xml
# ---------------------------------------------------------------------------

#: The filter elements of a qquota limit rule (``-xml`` and ``-fmt json`` alike), by name.
QQUOTA_FILTERS = ("users", "xusers", "projects", "xprojects", "pes", "xpes",
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
    root = load_xml(data, ("qquota_result",), "qquota -xml")
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
            elif child.tag in QQUOTA_FILTERS:
                items = [v.strip() for v in (child.text or "").split(",") if v.strip()]
                filters.setdefault(child.tag, []).extend(items)
        for resource, limit, used in limits:
            result.append({"rule": name, "resource": resource, "limit": limit, "used": used,
                           "filters": {k: list(v) for k, v in filters.items()}})
    return result
