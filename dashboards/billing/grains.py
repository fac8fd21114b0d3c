"""Which rollup grain serves which part of a range (issue 26): whole UTC days from the day rows, the rest from the hours.

The usage and waste rollups are kept per UTC hour (``UsageRollup``,
``WasteRollup``) and per UTC day (``UsageDayRollup``, ``WasteDayRollup``: a
day row is the sum of its 24 hour rows, written in the same transaction,
``dashboards.core.rollups``). A bill cuts its range at period boundaries
(local midnights in the cluster's zone); between two boundaries every UTC
day that lies wholly inside is read from the day rows and the hours left at
either end from the hour rows. Each hour of the range is thus read once,
from one grain, and no day row straddles a period boundary, so the sums are
the hour grain's to the cent and the microsecond
(``tests/db/test_day_rollups.py``). In a zone whose midnight is 00:00 UTC
the periods are whole days and the hour rows are not read at all; in
another a period's first and last hours come from them (a week in New York:
6 day rows and 24 hour rows per key, against 168 hour rows).

The caller has already read the parts of an hour at the range's ends from
the detail rows (``billing.bills._accumulate``): ``begin``, ``end`` and the
boundaries given here are whole UTC hours.
"""
from __future__ import annotations

import datetime as dt
from typing import Iterable, Sequence

from django.db.models import Q, QuerySet

UTC = dt.timezone.utc
DAY = dt.timedelta(days=1)

Span = tuple[dt.datetime, dt.datetime]


def _day_floor(moment: dt.datetime) -> dt.datetime:
    return moment.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


def _day_ceil(moment: dt.datetime) -> dt.datetime:
    floor = _day_floor(moment)
    return floor if floor == moment else floor + DAY


def _merged(spans: Iterable[Span]) -> list[Span]:
    out: list[list[dt.datetime]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def pieces(begin: dt.datetime, end: dt.datetime, boundaries: Sequence[dt.datetime] = ()) -> tuple[list[Span],
                                                                                                     list[Span]]:
    """``[begin, end)`` (aware datetimes on whole UTC hours) cut at the ``boundaries`` inside it, as
    ``(day spans, hour spans)``: each a sorted list of disjoint ``[a, b)``, adjacent ones merged.
    A day span starts and ends at 00:00 UTC and holds no boundary; together they cover every hour
    of ``[begin, end)`` once. Empty lists when ``begin >= end``."""
    if begin >= end:
        return [], []
    cuts = sorted({begin, end, *(b for b in boundaries if begin < b < end)})
    days: list[Span] = []
    hours: list[Span] = []
    for a, b in zip(cuts, cuts[1:]):
        first, last = _day_ceil(a), _day_floor(b)
        if first < last:
            days.append((first, last))
            if a < first:
                hours.append((a, first))
            if last < b:
                hours.append((last, b))
        else:
            hours.append((a, b))
    return _merged(days), _merged(hours)


def in_spans(field: str, spans: Sequence[Span]) -> Q:
    """``field`` (a datetime) in any of ``spans``: one range, or an OR of them."""
    q = Q()
    for a, b in spans:
        q |= Q(**{f"{field}__gte": a, f"{field}__lt": b})
    return q


def rollup_sets(hour_model, day_model, *, cluster, begin: dt.datetime, end: dt.datetime,
                boundaries: Sequence[dt.datetime] = ()) -> list[tuple[QuerySet, str]]:
    """The rollup rows of ``cluster`` that hold ``[begin, end)`` (whole UTC hours), cut at
    ``boundaries``: ``[(queryset, time field)]``, the day rows of ``day_model`` (field ``day``) for
    the whole UTC days of :func:`pieces` and the hour rows of ``hour_model`` (field ``hour``) for the
    rest; a grain with nothing to read is left out. Summing both querysets' rows gives each hour once."""
    days, hours = pieces(begin, end, boundaries)
    out = []
    if days:
        out.append((day_model.objects.filter(in_spans("day", days), cluster=cluster), "day"))
    if hours:
        out.append((hour_model.objects.filter(in_spans("hour", hours), cluster=cluster), "hour"))
    return out
