"""Task ranges: ``1-5,7`` <-> task numbers, as qstat, qalter and qmod take them (``-t n-m:s``)."""
from __future__ import annotations

import re
from typing import Sequence

from dashboards.core import limits
from dashboards.core.errors import LaunchError


def task_ranges(numbers: Sequence[int]) -> list[list[int]]:
    ranges: list[list[int]] = []
    for n in sorted(set(numbers)):
        if ranges and n == ranges[-1][1] + 1:
            ranges[-1][1] = n
        else:
            ranges.append([n, n])
    return ranges


def ranges_text(ranges: Sequence[Sequence[int]] | None) -> str:
    """``[[1, 3], [5, 5]]`` -> ``"1-3,5"``; None -> ``"all"``."""
    if ranges is None:
        return "all"
    return ",".join(f"{a}" if a == b else f"{a}-{b}" for a, b in ranges)


def parse_task_ranges(text: str, *, limit: int = limits.MAX_TASKS_PER_CAMPAIGN) -> list[list[int]] | None:
    """``"1-3,5"`` -> ``[[1, 3], [5, 5]]``; empty -> None (the whole job). Raises LaunchError."""
    text = (text or "").strip()
    if not text:
        return None
    numbers: list[int] = []
    for part in text.split(","):
        part = part.strip()
        m = re.fullmatch(r"(\d{1,9})(?:-(\d{1,9}))?", part)
        if not m:
            raise LaunchError(f"tasks: {part!r} is not a task number or range like 1-5")
        first, last = int(m.group(1)), int(m.group(2) or m.group(1))
        if first < 1 or last < first:
            raise LaunchError(f"tasks: {part} is not a range of positive task numbers")
        if len(numbers) + last - first + 1 > limit:
            raise LaunchError(f"tasks: at most {limit} task numbers")
        numbers.extend(range(first, last + 1))
    return task_ranges(numbers)


def numbers_in_ranges(ranges: list[list[int]] | None) -> list[int] | None:
    return None if ranges is None else [n for a, b in ranges for n in range(a, b + 1)]
