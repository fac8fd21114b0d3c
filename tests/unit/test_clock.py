"""Relative times with the clock time and zone (dashboards.core.clock)."""
from __future__ import annotations

import datetime as dt

from dashboards.core.clock import ago

NOW = dt.datetime(2026, 12, 2, 6, 41, 38, tzinfo=dt.timezone.utc)


def test_a_recent_moment_is_seconds_ago_with_its_clock_time_in_utc():
    assert ago(NOW - dt.timedelta(seconds=36), NOW) == "36 s ago (06:41:02 UTC)"
    # An aware moment in another zone reads in UTC: 07:30 in Berlin (UTC+1 in December) is 06:30 UTC.
    berlin = dt.timezone(dt.timedelta(hours=1))
    assert ago(dt.datetime(2026, 12, 2, 7, 30, tzinfo=berlin), NOW) == "11 min 38 s ago (06:30:00 UTC)"


def test_a_moment_on_another_day_gets_its_date_and_a_future_one_reads_in():
    assert ago(NOW - dt.timedelta(days=3, hours=4), NOW) == "3 d 4 h ago (2026-11-29 02:41 UTC)"
    assert ago(NOW + dt.timedelta(minutes=5), NOW) == "in 5 min (06:46:38 UTC)"
