"""A duration in words, as tco's pages, alerts and pending reasons say it ("12 min 5 s", "3 h 04 min").

The one home of the wording: ``dashboards.core.clock`` ("36 s ago") and the pending reasons
(``schedulers.pending``: "starts at 18:00 UTC (in 41 min)") both call :func:`duration_text`. Two pages
keep a fixed hours-and-minutes form of their own, :func:`hours_minutes_text`: the task page's
accounting fields ("3725 s (1 h 02 min)") and the advance reservations' choices ("for 2 h 00 min").
Standard library only.
"""
from __future__ import annotations

import math

__all__ = ["duration_text", "hours_minutes_text"]


def duration_text(seconds: float) -> str:
    """``42 s``, ``12 min 5 s``, ``12 min``, ``3 h 04 min``, ``2 d 5 h``: ``seconds`` (a duration, float
    or int; a negative one reads as 0) in at most two units.

    Rounded once, to the nearest unit of the smallest part shown, halves up: under a minute to the
    second (59.4 s is ``59 s``, 59.5 s ``1 min``), under an hour to the second (3599 s is
    ``59 min 59 s``), under 48 hours to the minute (86399 s is ``24 h 00 min``), beyond that to the
    hour (``2 d 5 h``). A duration that rounds up into the next range is shown in it (3599.5 s is
    ``1 h 00 min``).
    """
    seconds = max(0.0, float(seconds))
    whole = _nearest(seconds, 1)
    if whole < 60:
        return f"{whole} s"
    if whole < 3600:
        minutes, s = divmod(whole, 60)
        return f"{minutes} min {s} s" if s else f"{minutes} min"
    minutes = _nearest(seconds, 60)  # from the duration itself: 16649.9 s is 4 h 37 min, not 4 h 38 min
    if minutes < 48 * 60:
        hours, m = divmod(minutes, 60)
        return f"{hours} h {m:02d} min"
    days, h = divmod(_nearest(seconds, 3600), 24)
    return f"{days} d {h} h"


def hours_minutes_text(seconds: float, *, unit: str = "s") -> str:
    """``seconds`` (a duration) as ``H h MM min`` from an hour on, below it ``M min SS s`` (``unit``
    "s") or ``M min`` (``unit`` "min"); never in days (``49 h 00 min``).

    ``unit`` "s" (the task page's accounting fields): rounded to the second first, with ``round()``
    (halves to even), then the seconds are dropped from an hour on (3749.6 s is ``1 h 02 min``).
    ``unit`` "min" (the advance reservations' durations): cut down to the whole minute (3599.9 s is
    ``59 min``). Raises ``ValueError`` for another ``unit``.
    """
    if unit == "s":
        total = int(round(seconds))
    elif unit == "min":
        total = int(seconds // 60) * 60
    else:
        raise ValueError(f"unit {unit!r}: use 's' or 'min'")
    hours, rest = divmod(total, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes:02d} min"
    return f"{minutes} min {secs:02d} s" if unit == "s" else f"{minutes} min"


def _nearest(seconds: float, unit: int) -> int:
    """``seconds`` in whole ``unit``s (seconds each), the nearest, halves up (``round()`` rounds halves to even)."""
    return math.floor(seconds / unit + 0.5)
