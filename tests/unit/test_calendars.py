"""Queue calendars (schedulers.calendars) against calendar_conf(5)'s own examples, states worked out by hand.

Reference days: 2026-12-01 is a Tuesday; 1999-01-01 was a Friday (a public holiday in the man page's
``night`` and ``day`` examples), 1999-01-04 a Monday.
"""
from __future__ import annotations

import datetime as dt
from zoneinfo import ZoneInfo

import pytest

from schedulers.calendars import (CalendarError, calendar_status, calendar_text, opening_text, parse_calendar,
                                  parse_calendar_conf, parse_queue_calendars, queue_calendar_fields)

UTC = dt.timezone.utc
HOLIDAYS = "1.1.1999,6.1.1999,28.3.1999,30.3.1999-31.3.1999,18.5.1999-19.5.1999,3.10.1999,25.12.1999,26.12.1999"


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=UTC)


AFTER_HOURS = parse_calendar("after_hours", "NONE", "mon-fri=8-18=off")


@pytest.mark.parametrize("when, state", [
    ("2026-12-01 07:59:59", "on"),    # Tuesday before business hours
    ("2026-12-01 08:00:00", "off"),   # start is inclusive
    ("2026-12-01 17:59:59", "off"),
    ("2026-12-01 18:00:00", "on"),    # end is exclusive
    ("2026-12-05 12:00:00", "on"),    # Saturday: no entry covers it
    ("2026-12-07 09:00:00", "off"),   # Monday
])
def test_after_hours_state(when, state):
    assert AFTER_HOURS.state_at(at(when)) == state


def test_after_hours_next_change_same_day_and_over_the_weekend():
    assert AFTER_HOURS.next_change(at("2026-12-01 16:40:00")) == (at("2026-12-01 18:00:00"), "on")
    assert AFTER_HOURS.next_change(at("2026-12-01 18:00:00")) == (at("2026-12-02 08:00:00"), "off")
    # Friday 18:00 opens until Monday 08:00.
    assert AFTER_HOURS.next_change(at("2026-12-04 19:00:00")) == (at("2026-12-07 08:00:00"), "off")


def test_night_example_public_holiday_on_overrides_the_week():
    # week mon-fri=6-20 (state omitted: off); holidays =on; a year entry decides its day alone.
    night = parse_calendar("night", f"{HOLIDAYS}=on", "mon-fri=6-20")
    assert night.state_at(at("1999-01-01 12:00:00")) == "on"          # Friday, holiday
    assert night.state_at(at("1999-01-04 12:00:00")) == "off"         # Monday
    assert night.state_at(at("1999-01-04 05:59:59")) == "on"
    assert night.state_at(at("1999-01-04 20:00:00")) == "on"
    assert night.state_at(at("1999-03-31 10:00:00")) == "on"          # inside the range 30.3-31.3
    assert night.next_change(at("1999-01-04 12:00:00")) == (at("1999-01-04 20:00:00"), "on")
    # Thursday 31.12.1998 21:00: open; Friday 1.1 is a holiday, the weekend is open: next off is Monday 06:00.
    assert night.next_change(at("1998-12-31 21:00:00")) == (at("1999-01-04 06:00:00"), "off")


def test_day_example_wrapping_range_and_whole_days():
    # week mon-fri=20-6 sat-sun: closed 20:00-06:00 on working days and all weekend; holidays closed all day.
    day = parse_calendar("day", HOLIDAYS, "mon-fri=20-6 sat-sun")
    assert day.state_at(at("1999-01-04 05:00:00")) == "off"           # Monday 00:00-06:00
    assert day.state_at(at("1999-01-04 06:00:00")) == "on"
    assert day.state_at(at("1999-01-04 20:00:00")) == "off"
    assert day.state_at(at("1999-01-02 12:00:00")) == "off"           # Saturday
    assert day.state_at(at("1999-01-01 12:00:00")) == "off"           # holiday (a Friday)
    assert day.next_change(at("1999-01-04 05:00:00")) == (at("1999-01-04 06:00:00"), "on")


def test_suspension_examples_and_override_order():
    night_s = parse_calendar("night_s", f"{HOLIDAYS}=on", "mon-fri=6-20=suspended")
    assert night_s.state_at(at("1999-01-05 07:00:00")) == "suspended"
    # calendar_conf(5): "week 12-18 tue=13-17=on" disables every day 12-18 except Tuesday 13-17.
    cal = parse_calendar("x", "NONE", "12-18 tue=13-17=on")
    assert cal.state_at(at("2026-12-01 12:30:00")) == "off"           # Tuesday, before 13
    assert cal.state_at(at("2026-12-01 14:00:00")) == "on"
    assert cal.state_at(at("2026-12-01 17:30:00")) == "off"
    assert cal.state_at(at("2026-12-02 14:00:00")) == "off"           # Wednesday
    assert cal.next_change(at("2026-12-01 12:30:00")) == (at("2026-12-01 13:00:00"), "on")
    # suspended beats off where both apply.
    both = parse_calendar("y", "NONE", "8-18=off 10-11=suspended")
    assert both.state_at(at("2026-12-01 10:30:00")) == "suspended"


def test_year_entry_with_wrapping_times_and_seconds():
    # calendar_conf(5): 12.03.2004=12-11=off disables 00:00:00-10:59:59 and 12:00:00-23:59:59.
    cal = parse_calendar("y", "12.03.2004=12-11=off", "NONE")
    assert cal.state_at(at("2004-03-12 10:59:59")) == "off"
    assert cal.state_at(at("2004-03-12 11:00:00")) == "on"
    assert cal.state_at(at("2004-03-12 12:00:00")) == "off"
    assert cal.state_at(at("2004-03-13 10:00:00")) == "on"
    # A short test window, to the second, with a month name.
    window = parse_calendar("w", "1.dec.2026=16:40:10-16:41:40=off", "NONE")
    assert window.state_at(at("2026-12-01 16:40:30")) == "off"
    assert window.next_change(at("2026-12-01 16:40:30")) == (at("2026-12-01 16:41:40"), "on")
    assert window.next_change(at("2026-12-01 16:42:00")) is None     # never closes again


def test_week_day_range_over_the_weekend_wraps():
    cal = parse_calendar("w", "NONE", "fri-mon=suspended")
    assert [cal.state_at(at(f"2026-12-0{d} 12:00:00")) for d in range(1, 8)] == \
        ["on", "on", "on", "suspended", "suspended", "suspended", "suspended"]  # Tue 1 .. Mon 7
    assert cal.next_change(at("2026-12-02 12:00:00")) == (at("2026-12-04 00:00:00"), "suspended")


def test_local_zone_of_the_qmaster():
    berlin = ZoneInfo("Europe/Berlin")  # UTC+1 in December
    assert AFTER_HOURS.state_at(at("2026-12-01 17:30:00"), berlin) == "on"   # 18:30 in Berlin
    assert AFTER_HOURS.next_change(at("2026-12-01 16:00:00"), berlin) == (at("2026-12-01 17:00:00"), "on")


@pytest.mark.parametrize("year, week", [
    ("NONE", "mon-mon=8-18"),        # a week day range needs two different days
    ("NONE", "funday"),
    ("NONE", "8-25"),
    ("NONE", "8:61-9"),
    ("31.2.2026", "NONE"),
    ("1.2.2026-1.1.2026", "NONE"),  # a year day range may not run backwards
    ("NONE", "on=8-18"),             # the state comes last
    ("NONE", "8-18=9-10"),
])
def test_bad_syntax_is_refused(year, week):
    with pytest.raises(CalendarError):
        parse_calendar("bad", year, week)


def test_qconf_outputs_parsed():
    cal = parse_calendar_conf(b"calendar_name    after_hours\nyear             NONE\n"
                              b"week             mon-fri=8-18=off \\\n                 sat=0-1=suspended\n")
    assert (cal.name, cal.week_text) == ("after_hours", "mon-fri=8-18=off sat=0-1=suspended")
    assert cal.state_at(at("2026-12-05 00:30:00")) == "suspended"
    sq = (b"qname                 agent.q\nhostlist              sge-exec1\ncalendar              after_hours\n"
          b"qname                 classic.q\ncalendar              NONE\n"
          b"qname                 other.q\ncalendar              NONE,[sge-exec3=night]\n")
    assert parse_queue_calendars(sq) == {"agent.q": "after_hours"}
    with pytest.raises(CalendarError):
        parse_calendar_conf(b"no calendar defined\n")


def test_status_entry_and_texts():
    fields = queue_calendar_fields({"agent.q": "after_hours", "x.q": "gone"}, {"after_hours": AFTER_HOURS})
    assert fields == {"agent.q": {"calendar": "after_hours", "calendar_year": "NONE",
                                  "calendar_week": "mon-fri=8-18=off"},
                      "x.q": {"calendar": "gone"}}
    now = at("2026-12-01 16:40:00")
    status = calendar_status(fields["agent.q"], now)
    assert status == {"calendar": "after_hours", "calendar_state": "off",
                      "calendar_next_change": "2026-12-01T18:00:00Z", "calendar_next_state": "on"}
    assert calendar_text("agent.q", status, now) == "agent.q: calendar after_hours, closed until 18:00 UTC"
    assert opening_text("agent.q", status, now) == "agent.q opens at 18:00 UTC (calendar after_hours)"
    evening = calendar_status(fields["agent.q"], at("2026-12-01 19:00:00"))
    assert calendar_text("agent.q", evening, at("2026-12-01 19:00:00")) == \
        "agent.q: calendar after_hours, open until 08:00 UTC on Wed 2026-12-02"
    assert opening_text("agent.q", evening, at("2026-12-01 19:00:00")) is None
    assert calendar_status({"calendar": "NONE"}, now) is None
    broken = calendar_status({"calendar": "b", "calendar_week": "funday"}, now)
    assert "funday" in broken["calendar_error"] and opening_text("q", broken, now) is None


# --- pending reasons and the status poll ----------------------------------------------------------

def _detail(queue_instance: str, why: str = "disabled") -> dict:
    """``parse_job_detail`` shape of a job waiting in -q cal.q, with the scheduler's global message."""
    return {"job_number": 41, "tasks": [], "hard_queues": ["agent.q"], "scheduler_messages": [],
            "global_messages": [f'queue instance "{queue_instance}" dropped because it is {why}']}


def test_pending_reason_names_the_calendar_and_the_opening_time():
    from schedulers.pending import explain_pending
    queues = [{"name": "agent.q", "calendar": "after_hours", "calendar_year": "NONE",
               "calendar_week": "mon-fri=8-18=off"}]
    now = at("2026-12-01 16:40:00")
    texts = [r["text"] for r in explain_pending(_detail("agent.q@sge-exec1"), queues=queues, now=now)]
    assert texts == ["agent.q opens at 18:00 UTC (calendar after_hours)"]
    # Two instances of the queue: one reason.
    detail = _detail("agent.q@sge-exec1")
    detail["global_messages"].append('queue instance "agent.q@sge-exec2" dropped because it is disabled')
    assert [r["text"] for r in explain_pending(detail, queues=queues, now=now)] == texts
    # After hours the calendar has the queue open: a disabled instance was disabled by hand (qmod -d).
    evening = [r["text"] for r in explain_pending(_detail("agent.q@sge-exec1"), queues=queues,
                                                  now=at("2026-12-01 19:00:00"))]
    assert evening == ["queue instance agent.q@sge-exec1 is disabled"]
    # Without the poll's queues the scheduler's words stay.
    assert [r["text"] for r in explain_pending(_detail("agent.q@sge-exec1"), now=now)] == \
        ["queue instance agent.q@sge-exec1 is disabled"]
    # A full queue is not the calendar's doing.
    assert [r["text"] for r in explain_pending(_detail("agent.q@sge-exec1", "full"), queues=queues, now=now)] == \
        ["queue instance agent.q@sge-exec1 is full"]
