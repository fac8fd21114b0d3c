"""Parser of ``qhost -F -xml`` (qhost(1), schema ``qhost.xsd``) and Grid Engine memory values.
"""
from __future__ import annotations

import re

from schedulers.base import SchedulerParseError

from .xmltools import load_xml

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
    root = load_xml(data, ("qhost",), "qhost -xml")
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
