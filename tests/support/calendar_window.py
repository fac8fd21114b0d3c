"""A short closed calendar window on the real dev cluster, for tests.

The test account may not change the cluster's configuration, so the window is
asked of ``scripts/cluster-faults`` (root, started by ``scripts/test``): the
request ``window HH:MM:SS`` runs ``scripts/dev-cluster --calendar-window``,
which makes the test queue ``cal.q`` (2 slots on the first agent host,
projects research and engineering) with calendar ``tco_window`` =
``year D.M.YYYY=0-HH:MM:SS=off`` (calendar_conf(5)): closed from midnight
until HH:MM:SS today, open after that. ``window none`` removes both.
agent.q and classic.q are never touched, so no other test sees a closed queue.
"""
from __future__ import annotations

import contextlib
import datetime as dt
import time

import pytest

from tests.support.hosts import fault

QUEUE = "cal.q"
CALENDAR = "tco_window"
UTC = dt.timezone.utc


def open_window_end(seconds: float) -> dt.datetime:
    """``now + seconds`` in whole seconds (never on a full minute, so the reason shows the
    seconds); skips the test when that crosses midnight (a window is for one day)."""
    if time.localtime().tm_gmtoff != 0:
        pytest.skip("the dev cluster's qmaster is expected to run on UTC (its calendar times are local)")
    now = dt.datetime.now(UTC).replace(microsecond=0)
    opens = now + dt.timedelta(seconds=seconds)
    if opens.second == 0:
        opens += dt.timedelta(seconds=1)
    if opens.date() != now.date():
        pytest.skip("a calendar test window must end before midnight")
    return opens


def close_queue_until(opens: dt.datetime) -> None:
    """``cal.q`` closed by its calendar until ``opens`` (UTC, today)."""
    fault("window", opens.strftime("%H:%M:%S"))


def remove_window() -> None:
    """``cal.q`` and calendar ``tco_window`` removed (and any job left in cal.q)."""
    fault("window", "none")


@contextlib.contextmanager
def closed_window(seconds: float):
    """``cal.q`` closed for about ``seconds``; yields the opening time (aware UTC); always removed after."""
    opens = open_window_end(seconds)
    try:
        close_queue_until(opens)
        yield opens
    finally:
        remove_window()


def opening_reason(opens: dt.datetime) -> str:
    """The pending reason tco must give for a job in cal.q before ``opens`` (same day)."""
    return f"{QUEUE} opens at {opens:%H:%M:%S} UTC (calendar {CALENDAR})"
