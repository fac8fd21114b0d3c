"""Queue calendars: parse calendar_conf(5) and say whether a queue is open now and when that changes.

A Grid Engine calendar (``qconf -scal NAME``) has a ``year`` and a ``week``
field; a queue names it in its ``calendar`` attribute (queue_conf(5)). The
qmaster switches the queue's instances to the calendar's state: ``on``
(enabled), ``off`` (disabled: running jobs go on, no new job starts; queue
instance state ``D``) or ``suspended`` (jobs are suspended; state ``C``).

Syntax (calendar_conf(5) of SGE 8.1.9 and OCS 9, same text)::

    year := NONE | year_day_range_list=daytime_range_list[=state]
                 | year_day_range_list=[daytime_range_list=]state | state
    week := NONE | week_day_range_list[=daytime_range_list][=state]
                 | [week_day_range_list=]daytime_range_list[=state]
                 | [week_day_range_list=][daytime_range_list=]state
    year_day_range_list := {yearday-yearday | yearday},...   yearday := D.M.YYYY (M: 1-12 or jan-dec)
    week_day_range_list := {weekday-weekday | weekday},...   weekday := mon ... sun
    daytime_range_list  := hour[:minute][:second]-hour[:minute][:second],...

Entries of a field are separated by blanks. Semantics implemented here, as
the man page states them: a missing state means ``off``; a missing day list
means every day; a missing daytime list means all day; a time range covers
``[start, end)`` and an end before its start wraps over midnight
(``12-11`` = 00:00:00-10:59:59 and 12:00:00-23:59:59); overlapping areas
combine as ``on`` over ``suspended`` over ``off``; a day that a year entry
names is decided by the year entries alone (the week field is ignored that
day); a time no entry covers is ``on``.

Times are the qmaster's local wall-clock time. Functions here take aware
datetimes and a ``tz`` (default UTC, the dev cluster's zone) and return aware
UTC datetimes. Errors: ``CalendarError`` (a ``ValueError``) for text that is
not calendar_conf(5) syntax.
"""
from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass, field
from zoneinfo import ZoneInfo

__all__ = ["CalendarError", "Calendar", "parse_calendar", "parse_calendar_conf", "parse_queue_calendars",
           "calendar_status", "calendar_text", "opening_text", "queue_calendar_fields", "when_text",
           "read_queue_calendars", "annotate_queues", "queue_opening_reason",
           "STATE_WORDS"]

UTC = dt.timezone.utc
STATES = ("on", "off", "suspended")
_RANK = {"off": 0, "suspended": 1, "on": 2}  # overlapping areas: on > suspended > off
#: How a queue with the calendar in a state is described to people.
STATE_WORDS = {"on": "open", "off": "closed", "suspended": "suspended"}
WEEKDAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
DAY_S = 86400
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")  # calendar_name, sge_types(5)
_TIME = re.compile(r"^(\d{1,2})(?::(\d{1,2}))?(?::(\d{1,2}))?$")


class CalendarError(ValueError):
    """Text that is not calendar_conf(5) syntax; the message names the part."""


@dataclass(frozen=True)
class _Entry:
    days: tuple            # year entries: ((date, date), ...); week entries: ((0..6, 0..6), ...); () = every day
    times: tuple           # ((start_s, end_s), ...) seconds of the day; () = all day
    state: str

    def covers_day(self, day: dt.date, year: bool) -> bool:
        if not self.days:
            return True
        if year:
            return any(first <= day <= last for first, last in self.days)
        wd = day.weekday()
        return any(first <= wd <= last if first <= last else (wd >= first or wd <= last)
                   for first, last in self.days)

    def covers_time(self, second: int) -> bool:
        if not self.times:
            return True
        for start, end in self.times:
            if start < end and start <= second < end:
                return True
            if start > end and (second >= start or second < end):
                return True
        return False


@dataclass(frozen=True)
class Calendar:
    """A parsed calendar: ``name``, ``year`` and ``week`` entries (and the texts they came from)."""

    name: str
    year_text: str = "NONE"
    week_text: str = "NONE"
    year: tuple = field(default=(), repr=False)
    week: tuple = field(default=(), repr=False)

    def state_at(self, when: dt.datetime, tz: dt.tzinfo = UTC) -> str:
        """``on``, ``off`` or ``suspended`` at the aware datetime ``when`` (qmaster zone ``tz``)."""
        local = _local(when, tz)
        return self._state(local.date(), local.hour * 3600 + local.minute * 60 + local.second)

    def _state(self, day: dt.date, second: int) -> str:
        entries = [e for e in self.year if e.covers_day(day, True)]
        if not entries:
            entries = [e for e in self.week if e.covers_day(day, False)]
        states = [e.state for e in entries if e.covers_time(second)]
        return max(states, key=_RANK.__getitem__) if states else "on"

    def next_change(self, when: dt.datetime, tz: dt.tzinfo = UTC,
                    horizon_days: int = 800) -> tuple[dt.datetime, str] | None:
        """The first moment after ``when`` at which the state differs from the state at ``when``:
        ``(aware UTC datetime, new state)``; None if none within ``horizon_days`` days."""
        local = _local(when, tz)
        now_state = self.state_at(when, tz)
        points = sorted({0, *(t for e in (*self.year, *self.week) for rng in e.times for t in rng if t < DAY_S)})
        start_second = local.hour * 3600 + local.minute * 60 + local.second
        for offset in range(horizon_days + 1):
            day = local.date() + dt.timedelta(days=offset)
            for second in points:
                if offset == 0 and second <= start_second:
                    continue
                state = self._state(day, second)
                if state != now_state:
                    moment = dt.datetime.combine(day, dt.time()) + dt.timedelta(seconds=second)
                    return moment.replace(tzinfo=tz).astimezone(UTC), state
        return None


def _local(when: dt.datetime, tz: dt.tzinfo) -> dt.datetime:
    if when.tzinfo is None:
        raise CalendarError("a calendar needs an aware datetime (with tzinfo)")
    return when.astimezone(tz).replace(tzinfo=None)


def _second(text: str, what: str) -> int:
    match = _TIME.match(text)
    if not match:
        raise CalendarError(f"{what}: {text!r} is not hour[:minute][:second]")
    hour, minute, second = (int(g) if g else 0 for g in match.groups())
    if hour > 24 or minute > 59 or second > 59 or (hour == 24 and (minute or second)):
        raise CalendarError(f"{what}: {text!r} is not a time of day (0-24 hours)")
    return hour * 3600 + minute * 60 + second


def _times(text: str) -> tuple:
    ranges = []
    for item in text.split(","):
        start, dash, end = item.partition("-")
        if not dash:
            raise CalendarError(f"daytime range {item!r}: needs start-end")
        ranges.append((_second(start, "daytime range"), _second(end, "daytime range")))
    return tuple(ranges)


def _weekday(text: str) -> int:
    try:
        return WEEKDAYS.index(text.lower())
    except ValueError:
        raise CalendarError(f"week day {text!r}: one of {', '.join(WEEKDAYS)}") from None


def _day_ranges(text: str, one, what: str, wraps: bool) -> tuple:
    """``a-b,c,...`` -> ((first, last), ...) with ``one`` parsing a day; a week range may wrap
    (``fri-mon``) but its two days must differ, a year range may not run backwards."""
    ranges = []
    for item in text.split(","):
        first, dash, last = item.partition("-")
        a = one(first)
        b = one(last) if dash else a
        if dash and wraps and a == b:
            raise CalendarError(f"{what} range {item!r}: the two days must differ (calendar_conf(5))")
        if not wraps and b < a:
            raise CalendarError(f"{what} range {item!r}: ends before it starts")
        ranges.append((a, b))
    return tuple(ranges)


def _yearday(text: str) -> dt.date:
    parts = text.split(".")
    if len(parts) != 3:
        raise CalendarError(f"year day {text!r}: day.month.year")
    day, month, year = parts
    month_number = MONTHS.index(month.lower()) + 1 if month.lower() in MONTHS else None
    try:
        return dt.date(int(year), month_number or int(month), int(day))
    except ValueError:
        raise CalendarError(f"year day {text!r}: not a date") from None


def _entries(text: str, year: bool) -> tuple:
    text = " ".join(text.replace("\\\n", " ").split())
    if text.upper() in ("", "NONE"):
        return ()
    entries = []
    for word in text.split(" "):
        days, times, state = (), (), None
        for position, part in enumerate(word.split("=")):
            low = part.lower()
            if low in STATES:
                if state is not None:
                    raise CalendarError(f"entry {word!r}: two states")
                state = low
            elif state is not None:
                raise CalendarError(f"entry {word!r}: the state comes last")
            elif year and "." in part:
                if position != 0:
                    raise CalendarError(f"entry {word!r}: the day list comes first")
                days = _day_ranges(part, _yearday, "year day", wraps=False)
            elif part[:1].isdigit():
                if times:
                    raise CalendarError(f"entry {word!r}: two daytime lists")
                times = _times(part)
            elif not year and part:
                if position != 0:
                    raise CalendarError(f"entry {word!r}: the day list comes first")
                days = _day_ranges(part, _weekday, "week day", wraps=True)
            else:
                raise CalendarError(f"{'year' if year else 'week'} entry {word!r}: {part!r} is not understood")
        if not (days or times or state):
            raise CalendarError(f"entry {word!r} is empty")
        entries.append(_Entry(days=days, times=times, state=state or "off"))
    return tuple(entries)


def parse_calendar(name: str, year: str = "NONE", week: str = "NONE") -> Calendar:
    """A ``Calendar`` from its three calendar_conf(5) fields. Raises CalendarError."""
    if not _NAME.match(name or ""):
        raise CalendarError(f"calendar name {name!r} is not a Grid Engine name")
    year, week = (" ".join((v or "NONE").split()) for v in (year, week))
    return Calendar(name=name, year_text=year, week_text=week,
                    year=_entries(year, True), week=_entries(week, False))


def parse_calendar_conf(output: bytes | str) -> Calendar:
    """``qconf -scal NAME`` output (``calendar_name``, ``year``, ``week`` lines; ``\\``-continued
    lines joined) as a ``Calendar``. Raises CalendarError."""
    text = output.decode("utf-8", errors="replace") if isinstance(output, bytes) else output
    fields: dict[str, str] = {}
    for line in text.replace("\\\n", " ").splitlines():
        key, _, value = line.strip().partition(" ")
        if key and not key.startswith("#"):
            fields[key] = value.strip()
    if "calendar_name" not in fields:
        raise CalendarError("qconf -scal: no calendar_name line")
    return parse_calendar(fields["calendar_name"], fields.get("year", "NONE"), fields.get("week", "NONE"))


def parse_queue_calendars(output: bytes | str) -> dict[str, str]:
    """``qconf -sq '*'`` output (every cluster queue's queue_conf(5), one after the other) as
    ``{queue: calendar}`` for the queues whose ``calendar`` is not NONE. A per-host value
    (``NONE,[sge-exec1=night]``) counts by its cluster-wide default, the part before the first comma."""
    text = output.decode("utf-8", errors="replace") if isinstance(output, bytes) else output
    result: dict[str, str] = {}
    queue = None
    for line in text.replace("\\\n", " ").splitlines():
        key, _, value = line.strip().partition(" ")
        if key == "qname":
            queue = value.strip()
        elif key == "calendar" and queue:
            default = value.strip().split(",")[0].strip()
            if default and default.upper() != "NONE":
                result[queue] = default
    return result


def queue_calendar_fields(queue_calendars: dict[str, str], calendars: dict[str, Calendar]) -> dict[str, dict]:
    """What the status poll stores per queue: ``{queue: {"calendar": name, "calendar_year": text,
    "calendar_week": text}}`` from ``parse_queue_calendars`` and the parsed ``qconf -scal``
    calendars (a calendar missing from ``calendars`` keeps only its name)."""
    out = {}
    for queue, name in queue_calendars.items():
        cal = calendars.get(name)
        out[queue] = {"calendar": name, **({"calendar_year": cal.year_text, "calendar_week": cal.week_text}
                                           if cal else {})}
    return out


def calendar_status(entry: dict, now: dt.datetime, tz: dt.tzinfo = UTC) -> dict | None:
    """State now and next change of a status-poll queue entry that names a calendar.

    ``entry``: ``{"calendar": name, "calendar_year": text, "calendar_week": text, ...}`` (the
    status poll's queue entry). Returns ``{"calendar", "calendar_state" (on|off|suspended),
    "calendar_next_change" (ISO 8601 UTC ``...Z``, or None: no change within two years),
    "calendar_next_state"}``; None when the entry has no calendar. A definition that does not
    parse gives ``{"calendar", "calendar_error": message}``.
    """
    name = entry.get("calendar")
    if not name or name == "NONE":
        return None
    try:
        cal = parse_calendar(name, entry.get("calendar_year") or "NONE", entry.get("calendar_week") or "NONE")
    except CalendarError as exc:
        return {"calendar": name, "calendar_error": str(exc)}
    change = cal.next_change(now, tz)
    return {"calendar": name, "calendar_state": cal.state_at(now, tz),
            "calendar_next_change": change[0].strftime("%Y-%m-%dT%H:%M:%SZ") if change else None,
            "calendar_next_state": change[1] if change else None}


def when_text(moment: dt.datetime, now: dt.datetime) -> str:
    """``18:00 UTC`` (same UTC day as ``now``), ``18:00:30 UTC`` when seconds matter, else
    ``08:00 UTC on Wed 2026-12-02``."""
    moment, now = moment.astimezone(UTC), now.astimezone(UTC)
    clock = moment.strftime("%H:%M:%S" if moment.second else "%H:%M") + " UTC"
    return clock if moment.date() == now.date() else f"{clock} on {moment.strftime('%a %Y-%m-%d')}"


def _parse_iso(text: str) -> dt.datetime:
    return dt.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def calendar_text(queue: str, status: dict, now: dt.datetime) -> str:
    """One line for people, from ``calendar_status`` output: ``agent.q: calendar after_hours,
    closed until 18:00 UTC`` (or ``..., open, no change ahead``; ``..., not understood: why``)."""
    name = status.get("calendar")
    if status.get("calendar_error"):
        return f"{queue}: calendar {name}, not understood: {status['calendar_error']}"
    words = STATE_WORDS.get(status.get("calendar_state"), status.get("calendar_state"))
    if not status.get("calendar_next_change"):
        return f"{queue}: calendar {name}, {words}, no change ahead"
    return f"{queue}: calendar {name}, {words} until {when_text(_parse_iso(status['calendar_next_change']), now)}"


def opening_text(queue: str, status: dict, now: dt.datetime) -> str | None:
    """The pending reason of a job whose queue the calendar closes now: ``agent.q opens at 18:00
    UTC (calendar after_hours)``; None when the calendar has the queue open (``on``)."""
    state = status.get("calendar_state")
    if status.get("calendar_error") or state not in ("off", "suspended"):
        return None
    name = status["calendar"]
    verb = "is closed" if state == "off" else "is suspended"
    change = status.get("calendar_next_change")
    if not change:
        return f"{queue} {verb} by calendar {name}, with no opening ahead"
    if status.get("calendar_next_state") == "on":
        return f"{queue} opens at {when_text(_parse_iso(change), now)} (calendar {name})"
    return f"{queue} {verb} until {when_text(_parse_iso(change), now)} (calendar {name})"


def zone(name: str | None) -> dt.tzinfo:
    """The qmaster's zone by IANA name (None, blank or a name the zone database lacks: UTC)."""
    try:
        return ZoneInfo(name) if name else UTC
    except (ValueError, KeyError):  # ZoneInfoNotFoundError is a KeyError
        return UTC


def read_queue_calendars(run) -> dict[str, dict]:
    """Every cluster queue's calendar as the status poll stores it (``queue_calendar_fields``).

    ``run(argv) -> bytes`` runs a Grid Engine command (raising the adapter's SchedulerError):
    ``qconf -sq '*'`` once, then ``qconf -scal NAME`` per calendar named. A calendar whose
    definition cannot be read or parsed gets ``calendar_error`` instead of its fields.
    """
    names = parse_queue_calendars(run(["qconf", "-sq", "*"]))
    calendars: dict[str, Calendar] = {}
    errors: dict[str, str] = {}
    for name in sorted(set(names.values())):
        try:
            calendars[name] = parse_calendar_conf(run(["qconf", "-scal", name]))
        except Exception as exc:  # SchedulerError from run, CalendarError from the parser
            errors[name] = str(exc)[:300]
    fields = queue_calendar_fields(names, calendars)
    for queue, name in names.items():
        if name in errors:
            fields[queue]["calendar_error"] = errors[name]
    return fields


def annotate_queues(queues: list[dict], fields: dict[str, dict] | None, now: dt.datetime,
                    tz_name: str | None = None) -> list[dict]:
    """Status-poll queue entries (``qstat -g c`` rows, ``{"name", ...}``) with their calendar:
    ``fields`` from ``read_queue_calendars`` merged in, ``calendar_tz`` (the qmaster's zone,
    ``tz_name`` or one already stored, default UTC), then ``calendar_status`` at ``now`` and
    ``calendar_text``. Rows of queues without a calendar come back unchanged; new dicts throughout."""
    out = []
    for row in queues:
        row = {**row, **((fields or {}).get(row.get("name")) or {})}
        if row.get("calendar"):
            row["calendar_tz"] = tz_name or row.get("calendar_tz") or "UTC"
        if row.get("calendar") and not row.get("calendar_error"):
            row.update(calendar_status(row, now, zone(row["calendar_tz"])) or {})
        if row.get("calendar"):
            row["calendar_text"] = calendar_text(row.get("name", "?"), row, now)
        out.append(row)
    return out


def queue_opening_reason(queue: str, queues: list[dict] | None, now: dt.datetime) -> str | None:
    """``opening_text`` for cluster queue ``queue`` from status-poll entries (state worked out at
    ``now`` in the entry's ``calendar_tz`` from the stored definition, not from when the poll ran);
    None without a closing calendar."""
    row = next((q for q in queues or () if q.get("name") == queue), None)
    if not row or not row.get("calendar") or row.get("calendar_error"):
        return None
    status = calendar_status(row, now, zone(row.get("calendar_tz")))
    return opening_text(queue, status, now) if status else None
