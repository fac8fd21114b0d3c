"""Times as people read them on the pages: relative ("36 s ago") with the clock time and its zone.

The duration's words are ``schedulers.durations.duration_text``'s, as in the pending reasons. A page
keeps its relative times moving between two pushes: the relative part of a text is marked with its
instant (:func:`relative`, ``{"at": epoch seconds, "text": "36 s ago"}``), the templates wrap it in
``<time data-at>`` (``templatetags/clock.py``) and static/js/clock.js writes it again every second
with the same words, the clock time beside it left as it is.
"""
from __future__ import annotations

import datetime as dt

from schedulers.durations import duration_text


def as_utc(moment: dt.datetime) -> dt.datetime:
    """``moment`` in UTC (naive is taken as UTC)."""
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.timezone.utc)
    return moment.astimezone(dt.timezone.utc)


def relative(moment: dt.datetime, now: dt.datetime | None = None) -> dict:
    """The relative part of :func:`ago` and its instant: ``{"at": moment in seconds since the epoch
    (float), "text": "36 s ago"}`` (``"in 5 min"`` for a moment after ``now``, default the clock).
    ``text`` is what the page shows until its clock writes it again from ``at``."""
    now = now or dt.datetime.now(dt.timezone.utc)
    moment = as_utc(moment)
    delta = (now - moment).total_seconds()
    text = f"in {duration_text(-delta)}" if delta < 0 else f"{duration_text(delta)} ago"
    return {"at": moment.timestamp(), "text": text}


def clock_text(moment: dt.datetime, now: dt.datetime | None = None) -> str:
    """``06:41:02 UTC``, or ``2026-11-28 02:10 UTC`` for a moment on another day than ``now`` (UTC;
    default the clock)."""
    now = now or dt.datetime.now(dt.timezone.utc)
    moment = as_utc(moment)
    return (moment.strftime("%H:%M:%S UTC") if moment.date() == now.astimezone(dt.timezone.utc).date()
            else moment.strftime("%Y-%m-%d %H:%M UTC"))


def ago(moment: dt.datetime, now: dt.datetime | None = None) -> str:
    """``36 s ago (06:41:02 UTC)``; a moment on another day than ``now`` (default: the clock) gets its
    date: ``3 d 4 h ago (2026-11-28 02:10 UTC)``. ``moment``: aware datetime (naive is taken as UTC).
    Times are shown in UTC, the zone of every page."""
    now = now or dt.datetime.now(dt.timezone.utc)
    return f"{relative(moment, now)['text']} ({clock_text(moment, now)})"
