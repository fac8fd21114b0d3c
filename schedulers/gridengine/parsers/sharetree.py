"""Share-tree usage from ``sge_share_mon -c 1 -n`` (sge_share_mon(1)).

With ``-n`` every node is one line of tab-separated ``key=value`` fields::

    curr_time=1795969521  usage_time=0  node_name=/research  user_name=
    project_name=research  shares=50  job_count=3  level%=0.500000
    total%=0.500000  long_target_share=0.500000  short_target_share=0.074686
    actual_share=0.992573  usage=6.194682  cpu=6.194682  mem=0.015184 ...

Shares and targets are fractions of the whole tree (0..1); ``usage`` is the
decayed usage the scheduler weighs (cpu + mem + io, per the cluster's
``usage_weight_list``), in its own units.
"""
from __future__ import annotations

from schedulers.base import SchedulerParseError

NUMBER_FIELDS = {
    "shares": int,
    "job_count": int,
    "level%": float,
    "total%": float,
    "long_target_share": float,
    "short_target_share": float,
    "actual_share": float,
    "usage": float,
    "cpu": float,
    "mem": float,
    "io": float,
    "ltcpu": float,
    "ltmem": float,
    "ltio": float,
}


def parse_share_mon(data: bytes | str) -> list[dict]:
    """One dict per share-tree node, in the tool's order.

    Keys: ``node`` (path, ``/`` for the root), ``user`` and ``project`` (None
    when empty), ``shares``, ``job_count`` (int), ``level_share`` and
    ``total_share`` (the tool's ``level%``/``total%``, fractions 0..1),
    ``long_target_share``, ``short_target_share``, ``actual_share``,
    ``usage``, ``cpu``, ``mem``, ``io``, ``ltcpu``, ``ltmem``, ``ltio``
    (floats). Blank lines are skipped. Raises SchedulerParseError for a line
    without ``node_name`` or with a field that is not a number.
    """
    if isinstance(data, bytes):
        data = data.decode("utf-8", "replace")
    nodes = []
    for lineno, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        fields = {}
        for item in line.split("\t"):
            key, sep, value = item.partition("=")
            if sep:
                fields[key.strip()] = value.strip()
        if "node_name" not in fields:
            raise SchedulerParseError(f"sge_share_mon line {lineno}: no node_name")
        node: dict = {
            "node": fields["node_name"],
            "user": fields.get("user_name") or None,
            "project": fields.get("project_name") or None,
        }
        for key, kind in NUMBER_FIELDS.items():
            raw = fields.get(key)
            name = {"level%": "level_share", "total%": "total_share"}.get(key, key)
            if raw is None or raw == "":
                node[name] = None
                continue
            try:
                node[name] = kind(float(raw)) if kind is int else float(raw)
            except ValueError as exc:
                raise SchedulerParseError(f"sge_share_mon line {lineno}: {key}={raw!r} is not a number") from exc
        nodes.append(node)
    return nodes
