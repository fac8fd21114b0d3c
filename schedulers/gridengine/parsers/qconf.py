"""Parser of ``qconf -se HOST`` (sge_host_conf(5)): the host's numeric ``complex_values``."""
from __future__ import annotations

from schedulers.base import SchedulerParseError


def parse_complex_values(output: bytes) -> dict[str, float]:
    """The numeric ``complex_values`` of a ``qconf -se HOST`` answer (sge_host_conf(5))."""
    text = output.decode("utf-8", errors="replace").replace("\\\n", "")
    for line in text.splitlines():
        key, _, value = line.strip().partition(" ")
        if key != "complex_values":
            continue
        values: dict[str, float] = {}
        for item in value.strip().split(","):
            name, eq, amount = item.strip().partition("=")
            if not eq:
                continue
            try:
                values[name] = float(amount)
            except ValueError:
                continue
        return values
    raise SchedulerParseError("qconf -se: no complex_values line")
