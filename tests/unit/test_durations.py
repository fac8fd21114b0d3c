"""A duration in words (schedulers.durations): one rounding for the pages' "ago" and the pending reasons' "in".

The expected words are worked out by hand from the rule (the nearest unit of the smallest part shown,
halves up), not printed by the code; the sweep reads each text back into seconds and checks it is
within half of its smallest unit of the duration.
"""
from __future__ import annotations

import datetime as dt
import re

import pytest

from dashboards.core.clock import ago
from schedulers.durations import duration_text, hours_minutes_text
from schedulers.pending import reservation_reasons

NOW = dt.datetime(2026, 12, 2, 6, 41, 38, tzinfo=dt.timezone.utc)

#: (seconds, words): the edges of each range and the halves between units.
BOUNDARIES = [
    (-5, "0 s"),
    (0, "0 s"),
    (0.49, "0 s"),
    (0.5, "1 s"),
    (58.5, "59 s"),  # halves up: Python's round() would say 58
    (59.4, "59 s"),
    (59.5, "1 min"),
    (60, "1 min"),
    (89, "1 min 29 s"),
    (89.5, "1 min 30 s"),
    (725, "12 min 5 s"),
    (3599, "59 min 59 s"),
    (3599.5, "1 h 00 min"),
    (3600, "1 h 00 min"),
    (3629, "1 h 00 min"),  # 60 min 29 s: to the minute
    (3630, "1 h 01 min"),
    (3 * 3600 + 240, "3 h 04 min"),
    (16649.9, "4 h 37 min"),  # 277.498 min: rounded once, not to 16650 s and then up to 278 min
    (86399, "24 h 00 min"),  # 23 h 59 min 59 s: the nearest minute is the 24th hour
    (26 * 3600, "26 h 00 min"),
    (47 * 3600 + 59 * 60 + 29, "47 h 59 min"),
    (47 * 3600 + 59 * 60 + 30, "2 d 0 h"),  # rounds to 48 h: shown in days
    (2 * 86400 + 5 * 3600 + 29 * 60 + 59, "2 d 5 h"),
    (2 * 86400 + 5 * 3600 + 30 * 60, "2 d 6 h"),
    (53 * 3600, "2 d 5 h"),
    (10 * 86400, "10 d 0 h"),
]


@pytest.mark.parametrize(("seconds", "words"), BOUNDARIES)
def test_a_duration_reads_in_at_most_two_units_rounded_to_the_smallest(seconds, words):
    assert duration_text(seconds) == words


UNITS = {"d": 86400, "h": 3600, "min": 60, "s": 1}


def _seconds_of(words: str) -> tuple[int, int]:
    """The seconds a text says and its smallest unit's seconds: "2 d 5 h" -> (190800, 3600)."""
    parts = re.fullmatch(r"(\d+) (d|h|min|s)(?: (\d+) (h|min|s))?", words)
    assert parts, words
    total = int(parts[1]) * UNITS[parts[2]] + (int(parts[3]) * UNITS[parts[4]] if parts[3] else 0)
    smallest = UNITS[parts[4] or parts[2]]
    if parts[2] == "min" and not parts[3]:
        smallest = 1  # "12 min" under an hour: the seconds are shown, and were 0
    return total, smallest


def test_every_text_is_within_half_its_smallest_unit_of_the_duration():
    for tenths in range(0, 3 * 86400 * 10, 997):  # about 2,600 durations up to 3 days, in tenths of a second
        seconds = tenths / 10
        said, unit = _seconds_of(duration_text(seconds))
        assert abs(said - seconds) <= unit / 2, (seconds, duration_text(seconds))


@pytest.mark.parametrize(("seconds", "words"), [(89, "1 min 29 s"), (2460, "41 min"), (3629, "1 h 00 min"),
                                                (86399, "24 h 00 min"), (26 * 3600, "26 h 00 min")])
def test_the_pages_and_the_pending_reasons_say_a_wait_alike(seconds, words):
    start = NOW + dt.timedelta(seconds=seconds)
    detail = {"job_number": 5, "tasks": [], "advance_reservation": 12}
    reservations = [{"id": 12, "start_at": start.isoformat(), "end_at": (start + dt.timedelta(hours=1)).isoformat(),
                     "state": "waiting", "state_code": "w"}]
    (reason,) = reservation_reasons(detail, reservations, now=NOW)
    assert reason["text"].endswith(f"(in {words})")
    assert ago(start, NOW).startswith(f"in {words} (")
    assert ago(NOW - dt.timedelta(seconds=seconds), NOW).startswith(f"{words} ago (")


# --------------------------------------------------------------------------- the fixed hours-and-minutes form

#: (seconds, unit, words), worked out by hand: unit "s" rounds to the second (halves to even, as
#: round() does) and drops the seconds from an hour on; unit "min" cuts down to the whole minute.
HOURS_MINUTES = [
    (60, "s", "1 min 00 s"),
    (60.5, "s", "1 min 00 s"),  # a half to the even second
    (61.5, "s", "1 min 02 s"),
    (125.4, "s", "2 min 05 s"),
    (3599.4, "s", "59 min 59 s"),
    (3599.6, "s", "1 h 00 min"),  # 3600 s once rounded
    (3749.6, "s", "1 h 02 min"),  # 3750 s = 1 h 2 min 30 s: the seconds dropped, not rounded up
    (49 * 3600, "s", "49 h 00 min"),  # never in days
    (0, "min", "0 min"),
    (59.9, "min", "0 min"),
    (3599.9, "min", "59 min"),
    (3600, "min", "1 h 00 min"),
    (5430, "min", "1 h 30 min"),  # 1 h 30 min 30 s
    (48 * 3600 + 59 * 60 + 59, "min", "48 h 59 min"),
]


@pytest.mark.parametrize(("seconds", "unit", "words"), HOURS_MINUTES)
def test_the_fixed_form_says_hours_and_minutes_as_each_page_did(seconds, unit, words):
    assert hours_minutes_text(seconds, unit=unit) == words


def test_the_fixed_form_refuses_another_unit():
    with pytest.raises(ValueError, match="unit 'h'"):
        hours_minutes_text(7200, unit="h")


def test_the_task_pages_accounting_fields_gloss_seconds_past_a_minute():
    from dashboards.live.task import accounting_fields

    rows = dict(accounting_fields({"wallclock_s": 3725.0, "cpu_s": 12.5}))
    assert rows == {"wall clock": "3725 s (1 h 02 min)", "CPU time": "12.500 s"}  # 3725 s = 1 h 2 min 5 s
