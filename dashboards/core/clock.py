"""Times as people read them on the pages: relative ("36 s ago") with the clock time and its zone."""
from __future__ import annotations

import datetime as dt


def duration_text(seconds: float) -> str:
    """``42 s``, ``12 min 5 s``, ``3 h 04 min``, ``2 d 5 h``: a duration as people say it (seconds, rounded)."""
    seconds = max(0, int(round(seconds)))
    if seconds < 60:
        return f"{seconds} s"
    minutes, s = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes} min {s} s" if s else f"{minutes} min"
    hours, m = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {m:02d} min"
    days, h = divmod(hours, 24)
    return f"{days} d {h} h"


def ago(moment: dt.datetime, now: dt.datetime | None = None) -> str:
    """``36 s ago (06:41:02 UTC)``; a moment on another day than ``now`` (default: the clock) gets its
    date: ``3 d 4 h ago (2026-11-28 02:10 UTC)``. ``moment``: aware datetime (naive is taken as UTC).
    Times are shown in UTC, the zone of every page."""
    now = now or dt.datetime.now(dt.timezone.utc)
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    moment = moment.astimezone(dt.timezone.utc)
    delta = (now - moment).total_seconds()
    clock = (moment.strftime("%H:%M:%S UTC") if moment.date() == now.astimezone(dt.timezone.utc).date()
             else moment.strftime("%Y-%m-%d %H:%M UTC"))
    if delta < 0:
        return f"in {duration_text(-delta)} ({clock})"
    return f"{duration_text(delta)} ago ({clock})"
