"""Times as people read them on the pages: relative ("36 s ago") with the clock time and its zone.

The duration's words are ``schedulers.durations.duration_text``'s, as in the pending reasons.
"""
from __future__ import annotations

import datetime as dt

from schedulers.durations import duration_text


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
