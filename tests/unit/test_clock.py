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


def test_the_relative_part_carries_its_instant_and_is_the_words_of_ago():
    from dashboards.core.clock import relative

    moment = NOW - dt.timedelta(seconds=36)
    assert relative(moment, NOW) == {"at": moment.timestamp(), "text": "36 s ago"}
    assert ago(moment, NOW).startswith(relative(moment, NOW)["text"] + " (")
    soon = NOW + dt.timedelta(minutes=41)
    assert relative(soon, NOW) == {"at": soon.timestamp(), "text": "in 41 min"}
    # A naive moment is UTC.
    assert relative(moment.replace(tzinfo=None), NOW)["at"] == moment.timestamp()


def test_a_hold_said_with_its_relative_part_marked_and_once_without_it():
    from dashboards.core.holds import held_at_words, held_relative, held_words, with_tco_hold

    hold = {"who": "launcher", "verb": "paused", "at": NOW - dt.timedelta(minutes=12, seconds=5),
            "action": "campaign_pause"}
    assert held_words(hold, NOW) == "paused by launcher in tco 12 min 5 s ago (06:29:33 UTC)"
    assert held_relative(hold, NOW) == {"at": hold["at"].timestamp(), "text": "12 min 5 s ago"}
    assert held_at_words(hold, NOW) == "paused by launcher in tco at 06:29:33 UTC"
    said = with_tco_hold([{"text": "held by user (tasks 1)", "raw": "x"}], hold, hint="go", now=NOW)
    assert said == [{"text": "paused by launcher in tco 12 min 5 s ago (06:29:33 UTC): go",
                     "raw": "tco: campaign_pause by launcher at 2026-12-02 06:29:33",
                     "relative": {"at": hold["at"].timestamp(), "text": "12 min 5 s ago"}}]


def test_the_templates_mark_a_relative_part_with_its_instant_and_escape_the_rest():
    from dashboards.templatetags.clock import clock_time, since, ticking

    at = (NOW - dt.timedelta(seconds=36)).timestamp()
    reason = {"text": "paused by <b> in tco 36 s ago (06:41:02 UTC)", "relative": {"at": at, "text": "36 s ago"}}
    assert str(ticking(reason)) == ('paused by &lt;b&gt; in tco <time class="ticking" datetime="2026-12-02T06:41:02Z" '
                                    f'data-at="{at:.3f}">36 s ago</time> (06:41:02 UTC)')
    # No mark, or words not in the text: the text as it is, escaped.
    assert str(ticking({"text": "a < b"})) == "a &lt; b"
    assert str(ticking({"text": "x", "relative": {"at": at, "text": "9 s ago"}})) == "x"
    assert str(ticking({"title": "1 task is 36 s ago", "relative": {"at": at, "text": "36 s ago"}}, "title")).endswith(
        'data-at="%.3f">36 s ago</time>' % at)
    assert str(since(NOW - dt.timedelta(minutes=15), "hms", "15 min 00 s")) == (
        '<time class="ticking" datetime="2026-12-02T06:26:38Z" data-at="%.3f" data-format="hms">15 min 00 s</time>'
        % (NOW - dt.timedelta(minutes=15)).timestamp())
    assert str(since(None, "hms", "")) == ""
    today = dt.datetime.now(dt.timezone.utc).date() == NOW.date()
    assert clock_time(at) == ("06:41:02 UTC" if today else "2026-12-02 06:41 UTC")  # with its date on another day
    assert clock_time(None) == ""


def test_a_mark_may_name_its_format_and_an_unknown_one_leaves_the_text_as_it_is():
    from dashboards.templatetags.clock import ticking

    at = (NOW - dt.timedelta(seconds=725)).timestamp()
    row = {"verdict": "running, 12 min 05 s past the forecast's latest",
           "relative": {"at": at, "text": "12 min 05 s", "format": "span"}}
    assert str(ticking(row, "verdict")) == (
        'running, <time class="ticking" datetime="2026-12-02T06:29:33Z" data-at="%.3f" data-format="span">'
        "12 min 05 s</time> past the forecast&#x27;s latest" % at)
    row["relative"]["format"] = "fortnights"
    assert str(ticking(row, "verdict")) == "running, 12 min 05 s past the forecast&#x27;s latest"
