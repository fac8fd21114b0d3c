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


def parse_qconf_attributes(output: bytes) -> dict[str, str]:
    """A ``qconf -s…`` object as ``{attribute: value}``: ``qconf -ssconf``
    (sched_conf(5)), ``-sconf`` (sge_conf(5)), ``-sq`` (queue_conf(5)),
    ``-sprj`` (project(5)), ``-se`` (host_conf(5)), and the cell's
    ``common/bootstrap`` (bootstrap(5)).

    One attribute per line, name then value after whitespace; a line ending
    in ``\\`` continues on the next; ``#`` lines are comments. The value is
    kept as printed (``true``, ``0:0:1``, ``accounting=true reporting=true
    flush_time=00:00:01``), whitespace runs of continued lines folded to one.
    Raises SchedulerParseError when no attribute is found.
    """
    text = output.decode("utf-8", errors="replace").replace("\\\n", " ")
    attributes: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, _, value = line.strip().partition(" ")
        attributes[name] = " ".join(value.split())
    if not attributes:
        raise SchedulerParseError("qconf: no attribute in the output")
    return attributes
