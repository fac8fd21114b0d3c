"""Relative times that keep moving on a page (issue 24): the server writes the words once, marks them
with their instant (``<time data-at="epoch seconds" data-format>``), and static/js/clock.js, one timer
per page, writes them again every second with the same words from the server's clock
(``<body data-server-now>``: :func:`server_now`). The clock time and zone beside them stay as written.

Formats (``data-format``), the same words here and in clock.js:

- ``ago`` (the default): ``36 s ago`` or ``in 41 min`` (``core.clock.relative``);
- ``duration``: the time since the instant, ``12 min 5 s`` (``schedulers.durations.duration_text``);
- ``hms``: the time since the instant, ``12 min 05 s`` (the ``seconds`` filter of ``ops``);
- ``span``: the time since the instant, ``95 s``, ``12 min 05 s``, ``2 h 04 min`` (a campaign's forecast
  verdict, ``launch.forecast_record``; drawn by static/js/campaign.js, a mark's ``format``).
"""
from __future__ import annotations

import datetime as dt
import time

from django import template
from django.utils.html import conditional_escape, format_html
from django.utils.safestring import SafeString

from dashboards.core.clock import as_utc, clock_text, relative
from dashboards.templatetags.ops import seconds as hms_text
from schedulers.durations import duration_text

register = template.Library()

FORMATS = ("ago", "duration", "hms", "span")


def _epoch(moment) -> float | None:
    """``moment`` (aware datetime, naive read as UTC, or epoch seconds) in seconds since the epoch; None for None."""
    if moment is None or moment == "":
        return None
    if isinstance(moment, dt.datetime):
        return as_utc(moment).timestamp()
    return float(moment)


def _time(at: float, text: str, fmt: str) -> SafeString:
    iso = dt.datetime.fromtimestamp(at, dt.timezone.utc).isoformat(timespec="seconds").replace("+00:00", "Z")
    if fmt == "ago":
        return format_html('<time class="ticking" datetime="{}" data-at="{}">{}</time>', iso, f"{at:.3f}", text)
    return format_html('<time class="ticking" datetime="{}" data-at="{}" data-format="{}">{}</time>', iso,
                       f"{at:.3f}", fmt, text)


@register.simple_tag
def server_now() -> str:
    """This server's clock, in seconds since the epoch (3 decimals): ``<body data-server-now>``, which
    clock.js reads once to count in the server's time, not the browser's."""
    return f"{time.time():.3f}"


@register.filter
def clock_time(moment) -> str:
    """``moment`` (aware datetime or epoch seconds) as the clock time beside a relative one: ``06:41:02 UTC``,
    with its date on another day (``core.clock.clock_text``); ``""`` for None."""
    at = _epoch(moment)
    return "" if at is None else clock_text(dt.datetime.fromtimestamp(at, dt.timezone.utc))


@register.filter
def ticking(item, key: str = "text") -> SafeString:
    """``item[key]`` escaped (``item``: a reason ``{"text", "raw"[, "relative"]}`` or a triage group, whose
    ``"title"`` or ``"label"`` says its hold), with its relative part (``item["relative"]``: ``{"at": epoch
    seconds, "text": "36 s ago"[, "format": one of :data:`FORMATS`, "ago" by default]}``,
    ``core.clock.relative``) in a ``<time data-at>`` that keeps moving.
    Without a ``relative``, or one whose words are not in the text, the text as it is."""
    text = "" if item.get(key) is None else str(item.get(key))
    mark = item.get("relative")
    if not isinstance(mark, dict) or not mark.get("text") or mark["text"] not in text or mark.get("at") is None:
        return conditional_escape(text)
    fmt = mark.get("format") or "ago"
    if fmt not in FORMATS:
        return conditional_escape(text)
    before, after = text.split(mark["text"], 1)
    return format_html("{}{}{}", before, _time(float(mark["at"]), mark["text"], fmt), after)


@register.simple_tag
def since(moment, fmt: str = "ago", shown=None) -> SafeString:
    """A ``<time data-at>`` that keeps moving: ``moment`` (aware datetime or epoch seconds; None gives
    ``""``) in format ``fmt`` (``ago``, ``duration`` or ``hms``) as of now, or ``shown`` (the words as they were worked
    out with the page, e.g. a wait read with its query) until the page's clock writes it again."""
    at = _epoch(moment)
    if at is None:
        return conditional_escape("" if shown is None else shown)
    if fmt not in ("ago", "duration", "hms"):
        raise template.TemplateSyntaxError(f"since: format {fmt!r}: use ago, duration or hms")
    if shown is None:
        age = time.time() - at
        shown = (relative(dt.datetime.fromtimestamp(at, dt.timezone.utc))["text"] if fmt == "ago"
                 else duration_text(age) if fmt == "duration" else hms_text(max(0.0, age)))
    return _time(at, str(shown), fmt)
