"""The cluster's slots, seats, quotas and hosts as the queue page and the host table show them."""
from __future__ import annotations

import re
from typing import Any

from django.db.models import Count
from django.utils import timezone

from dashboards.core.scope import Who, tasks_visible_to
from dashboards.core.stages import iso as _iso
from dashboards.models import Cluster
from schedulers.calendars import annotate_queues
from schedulers.hosts import QINSTANCE_LETTERS

# --------------------------------------------------------------------------- cluster resources

def cluster_resources(cluster: Cluster, seat_resource: str, projects: set[str] | None = None) -> dict[str, Any]:
    """Slots per cluster queue, model API seats, consumables, RQS limits and share tree from the last status poll.

    Returns ``{"queues": [{name, used, resv, available, total, ..., and for a queue with a
    calendar: calendar, calendar_state, calendar_next_change, calendar_text}], "slots":
    [queue_slots() rows], "seats":
    {resource, used, capacity} | None, "consumables": [{resource, used,
    capacity}], "quotas": [{rule, resource, limit, used, filters}],
    "share_tree": [{node, project, shares, job_count, actual_share,
    long_target_share, usage, ...}], "share_tree_error", "status_at": ISO}``.
    Consumables are the global host's: capacity from its ``complex_values``
    and what ``qhost -F`` says is left. ``projects``: the share-tree nodes
    shown (None: every node, for admins).
    """
    status = cluster.status or {}
    free: dict[str, float] = {}
    for host in status.get("hosts", []):
        if host.get("name") == "global":
            for name, value in (host.get("resources") or {}).items():
                if isinstance(value, dict):  # {"value": "13.000000", "dominance": "gc"}
                    value = value.get("value")
                try:
                    free[name] = float(value)
                except (TypeError, ValueError):
                    continue
    consumables = []
    for resource, capacity in sorted((status.get("global_capacity") or {}).items()):
        if resource in free:
            consumables.append({"resource": resource, "capacity": capacity,
                                "used": round(capacity - free[resource], 6)})
    seats = next((c for c in consumables if c["resource"] == seat_resource), None)
    share_tree = [
        node for node in status.get("share_tree", [])
        if projects is None or (node.get("project") in projects)
    ]
    return {
        # Calendar state and next change worked out now from the stored definitions (schedulers.calendars).
        "queues": annotate_queues(status.get("queues", []), None, timezone.now()),
        "slots": queue_slots(status.get("queues", []), status.get("queue_instances") or []),
        "seats": seats,
        "consumables": consumables,
        "quotas": status.get("quotas", []),
        "share_tree": share_tree,
        "share_tree_error": status.get("share_tree_error") if projects is None else None,
        "status_at": _iso(cluster.status_at),
    }


#: Queue instance state letters under which Grid Engine starts no new task there (qstat(1): the
#: letters qstat -g c counts as aoACDS "temporarily disabled" and cdsuE "manual intervention").
NO_DISPATCH_LETTERS = frozenset("aoACDScdsuE")


def queue_slots(queues: list[dict], instances: list[dict]) -> list[dict]:
    """One definition of a cluster queue's slots for the queue page, as parts that add up to the total.

    ``queues``: ``qstat -g c -xml`` rows (``parse_cluster_queue_summary``);
    ``instances``: ``qstat -f -explain aAcE -xml`` rows (``schedulers.hosts.
    parse_queue_instances``), [] when the poll has none. Returns, per cluster
    queue in ``queues``' order, ``{"name", "total", "in_use", "reserved",
    "unavailable", "free", "unavailable_instances": [{"name", "states",
    "meanings", "slots"}], "source"}`` (slots, ints) where:

    - ``in_use``: slots held by tasks placed there (running, suspended or
      ending), the ``used`` of qstat -f / -g c, on every instance;
    - ``reserved``: slots held by advance reservations now (``resv``);
    - ``unavailable``: the other slots of instances in a state that stops
      dispatch (:data:`NO_DISPATCH_LETTERS`: disabled, unknown, alarm,
      suspended, calendar, error ...): they exist but no task can start there;
    - ``free``: the other slots of instances that take work.

    ``in_use + reserved + unavailable + free == total`` (an instance holding
    more than its slots counts none free). A resource quota (RQS) may
    still cap the queue below its free slots; qquota's ``used`` counts only
    the tasks its rule's filters match. Without instances the split comes
    from qstat -g c alone (``source`` "qstat -g c": its ``available`` is the
    free slots, the rest of the total not in use or reserved is unavailable).
    """
    by_queue: dict[str, list[dict]] = {}
    for qi in instances:
        by_queue.setdefault(qi.get("queue", ""), []).append(qi)
    out = []
    for q in queues:
        mine = by_queue.get(q["name"])
        if mine:
            row = {"name": q["name"], "total": 0, "in_use": 0, "reserved": 0, "unavailable": 0, "free": 0,
                   "unavailable_instances": [], "source": "queue instances"}
            for qi in mine:
                total, used, resv = int(qi["slots_total"]), int(qi["slots_used"]), int(qi["slots_resv"])
                rest = max(0, total - used - resv)
                row["total"] += total
                row["in_use"] += used
                row["reserved"] += resv
                blocking = [letter for letter in qi.get("states", "") if letter in NO_DISPATCH_LETTERS]
                if blocking:
                    row["unavailable"] += rest
                    row["unavailable_instances"].append({
                        "name": qi["name"], "states": "".join(blocking), "slots": rest,
                        "meanings": [QINSTANCE_LETTERS.get(letter, "state not known to tco") for letter in blocking]})
                else:
                    row["free"] += rest
        else:
            total, used, resv = int(q.get("total", 0)), int(q.get("used", 0)), int(q.get("resv", 0))
            free = max(0, min(int(q.get("available", 0)), total - used - resv))
            row = {"name": q["name"], "total": total, "in_use": used, "reserved": resv,
                   "unavailable": max(0, total - used - resv - free), "free": free,
                   "unavailable_instances": [], "source": "qstat -g c"}
        out.append(row)
    return out


HOST_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,254}")  # a host name (RFC 1123 letters), as a filter


def host_filter(value: object) -> str | None:
    """A host-name filter from a request: the name, or None for anything that is not one."""
    return value if isinstance(value, str) and HOST_RE.fullmatch(value) else None


HOST_TASKS_SHOWN = 12  # task links per host on the queue page (the count is always whole)


def cluster_hosts(cluster: Cluster, user: Who) -> dict[str, Any]:
    """The cluster's execution hosts from the last status poll, with the active tasks ``user`` may see on each.

    Returns ``{"hosts": [...], "problems": [...]}``: ``hosts`` as
    ``schedulers.hosts.host_states`` (name, state up/unreachable/error/alarm/closed/
    disabled, why, load_avg, num_proc, mem_total_bytes, mem_used_bytes,
    slots_used, slots_total, queues) with ``tasks``: ``{"count": n,
    "shown": [{id, task_id, campaign_id, state}]}`` (at most
    ``HOST_TASKS_SHOWN``); ``problems``: queue instances in any state (alarm,
    unknown, disabled, error ...) with what the letters mean and the
    scheduler's reasons (``schedulers.hosts.instance_problems``).
    """
    from schedulers.hosts import host_states, instance_problems

    status = cluster.status or {}
    instances = status.get("queue_instances") or []
    visible = tasks_visible_to(user).filter(cluster=cluster, active=True).exclude(host="")
    counts = dict(visible.values_list("host").annotate(n=Count("id")).order_by())
    hosts = host_states(status.get("hosts") or [], instances)
    for host in hosts:  # one query per host that has tasks (a cluster has tens of hosts, not thousands)
        shown = visible.filter(host=host["name"]).order_by("job_number", "task_number")[:HOST_TASKS_SHOWN]
        host["tasks"] = {"count": counts.get(host["name"], 0),
                         "shown": [{"id": t.pk, "task_id": t.task_id, "campaign_id": t.campaign_id, "state": t.state}
                                   for t in shown] if counts.get(host["name"]) else []}
    return {"hosts": hosts, "problems": instance_problems(instances)}
