"""A duration in words, as tco's pages, alerts and pending reasons say it ("12 min 5 s", "3 h 04 min").

The one home of the wording: ``dashboards.core.clock`` ("36 s ago") and the pending reasons
(``schedulers.pending``: "starts at 18:00 UTC (in 41 min)") both call :func:`duration_text`.
Standard library only.
"""
from __future__ import annotations

import math

__all__ = ["duration_text"]


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


def _nearest(seconds: float, unit: int) -> int:
    """``seconds`` in whole ``unit``s (seconds each), the nearest, halves up (``round()`` rounds halves to even)."""
    return math.floor(seconds / unit + 0.5)
