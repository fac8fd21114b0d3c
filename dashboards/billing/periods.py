"""Billing periods in the cluster's time zone, as ``qacct -b/-e`` counts them.

A task (and an accounting record) belongs to the period of its start time in
the cluster's time zone (SoGE 8.1.9 ``qacct.c``, ``sge_read_rusage``); a period
is ``[first local midnight, next period's first local midnight)``.
"""
from __future__ import annotations

import calendar
import datetime as dt
import logging
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from django.conf import settings
from django.utils import timezone

from dashboards.core.errors import BillError
from dashboards.models import Cluster

log = logging.getLogger(__name__)
PERIODS = ("day", "week", "month")
PERIOD_ADJECTIVES = {"day": "daily", "week": "weekly", "month": "monthly"}
#: A bill covers at most this many periods (a year of days).
MAX_PERIODS = 400


# --------------------------------------------------------------------------- periods

def cluster_zone(cluster: Cluster | None = None) -> ZoneInfo:
    """The time zone periods are cut in: the cluster's, else ``TCO_CLUSTER_TZ``."""
    name = cluster.time_zone if cluster is not None else settings.TCO_CLUSTER_TZ
    try:
        return ZoneInfo(name or "UTC")
    except (ZoneInfoNotFoundError, ValueError):
        log.warning("unknown time zone %r for cluster %s; using UTC", name, cluster)
        return ZoneInfo("UTC")


def period_start(day: dt.date, period: str) -> dt.date:
    """First day of the ``period`` (day, ISO week from Monday, month) that contains ``day``."""
    if period == "day":
        return day
    if period == "week":
        return day - dt.timedelta(days=day.weekday())
    if period == "month":
        return day.replace(day=1)
    raise BillError(f"period must be one of {', '.join(PERIODS)}, not {period!r}")


def next_period_start(start: dt.date, period: str) -> dt.date:
    """First day of the period after the one starting on ``start``."""
    if period == "day":
        return start + dt.timedelta(days=1)
    if period == "week":
        return start + dt.timedelta(days=7)
    if period == "month":
        days = calendar.monthrange(start.year, start.month)[1]
        return start.replace(day=1) + dt.timedelta(days=days)
    raise BillError(f"period must be one of {', '.join(PERIODS)}, not {period!r}")


def local_midnight(day: dt.date, tz: dt.tzinfo) -> dt.datetime:
    """``day`` 00:00 in ``tz`` as an aware UTC datetime (qacct uses mktime the same way)."""
    return dt.datetime.combine(day, dt.time(0), tzinfo=tz).astimezone(dt.timezone.utc)


def period_bounds(start: dt.date, period: str, tz: dt.tzinfo) -> tuple[dt.datetime, dt.datetime]:
    """``[begin, end)`` in UTC of the period starting on local day ``start``."""
    first = period_start(start, period)
    return local_midnight(first, tz), local_midnight(next_period_start(first, period), tz)


def qacct_time(moment: dt.datetime, tz: dt.tzinfo) -> str:
    """``moment`` in qacct's ``-b/-e`` format ``CCYYMMDDhhmm.SS``, in ``tz`` (run qacct with ``TZ`` = tz)."""
    return moment.astimezone(tz).strftime("%Y%m%d%H%M.%S")


def current_period(period: str, *, now: dt.datetime | None = None,
                   tz: dt.tzinfo | None = None) -> tuple[dt.date, dt.datetime, dt.datetime]:
    """The period containing ``now``: ``(first local day, begin UTC, end UTC)``."""
    tz = tz or cluster_zone(default_cluster())
    now = now or timezone.now()
    first = period_start(now.astimezone(tz).date(), period)
    begin, end = period_bounds(first, period, tz)
    return first, begin, end


def default_cluster() -> Cluster | None:
    return Cluster.objects.filter(name=settings.TCO_CLUSTER_NAME).first()


def presets(today: dt.date) -> list[dict[str, Any]]:
    """The bill's date presets: ``[{"key", "label", "first", "last", "period"}]`` for this week,
    last week (ISO weeks from Monday), this month and last month, by day."""
    week = period_start(today, "week")
    month = period_start(today, "month")
    last_month = period_start(month - dt.timedelta(days=1), "month")
    return [
        {"key": "this-week", "label": "this week", "first": week, "last": today, "period": "day"},
        {"key": "last-week", "label": "last week", "first": week - dt.timedelta(days=7),
         "last": week - dt.timedelta(days=1), "period": "day"},
        {"key": "this-month", "label": "this month", "first": month, "last": today, "period": "day"},
        {"key": "last-month", "label": "last month", "first": last_month, "last": month - dt.timedelta(days=1),
         "period": "day"},
    ]
