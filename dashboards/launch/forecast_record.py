"""The launch forecast a campaign keeps (``Campaign.forecast``) and how the campaign turned out against it.

At launch the service stores :func:`forecast_record` of the forecast it computed
(``launch.forecast.complete_preview``): the likely start, the finish (median and
90th percentile) and the cost range, with the history it came from and whether the
ranges were widened because that history may not fit. The campaign page sets
:func:`forecast_outcome` beside it: when the tasks really started and the
campaign finished, and what it cost.
"""
from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

from django.db.models import Count, Max, Min, Q, Sum
from django.utils import timezone

from dashboards.core.encoding import jsonable
from dashboards.models import Campaign, Task

#: The shape of ``Campaign.forecast`` this module writes (a reader checks it).
FORECAST_VERSION = 1
#: Within this many seconds of a bound, an outcome counts as on it (scheduling runs are about 1 s apart).
SLACK_S = 1.0
#: A start is on time within this many seconds, or a tenth of the wait forecast if that is longer: "at once"
#: means the next scheduling runs, and the submission itself takes a moment.
START_SLACK_S = 5.0


def forecast_record(preview: dict[str, Any], *, at: dt.datetime | None = None) -> dict[str, Any]:
    """What a campaign keeps of its launch forecast (JSON-ready; times ISO UTC, USD as text):
    ``{"version", "at", "tasks", "start_at", "start_note", "finish_at": {p50, p90} | None,
    "run_s": {p50, p90} | None, "cost_usd": {p10, p50, p90} | None, "priced_by", "slot_hours",
    "history_runs", "at_once", "limited_by", "widened": {factor, text} | None}``."""
    fc, timing = preview["forecast"], preview.get("timing") or {}
    limits = timing.get("limits") or []
    return jsonable({
        "version": FORECAST_VERSION,
        "at": at or timezone.now(),
        "tasks": preview.get("count"),
        "start_at": timing.get("start_at"),
        "start_note": timing.get("start_note") or "",
        "finish_at": timing.get("finish_at"),
        "run_s": timing.get("run_s"),
        "cost_usd": fc.get("cost_usd"),
        "priced_by": fc.get("priced_by"),
        "slot_hours": timing.get("slot_hours"),
        "history_runs": fc.get("history") or 0,
        "at_once": timing.get("at_once"),
        "limited_by": limits[0]["what"] if limits else "",
        "widened": preview.get("widened"),
    })


def _time(text: str | None) -> dt.datetime | None:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None


def _late(actual: dt.datetime, low: dt.datetime | None, high: dt.datetime | None, *,
          bound: str = "the forecast's latest", slack: float = SLACK_S) -> str:
    """``actual`` against ``[low, high]`` in words: within, N s after ``bound`` (high), N s before low."""
    if high is not None and (actual - high).total_seconds() > slack:
        return f"{span_text((actual - high).total_seconds())} after {bound}"
    if low is not None and (low - actual).total_seconds() > slack:
        return f"{span_text((low - actual).total_seconds())} before the forecast"
    return "within the forecast"


def _since(moment: dt.datetime, now: dt.datetime) -> dict[str, Any]:
    """The part of a verdict that says how long since ``moment`` (:func:`span_text` at ``now``) with its
    instant, for the campaign page to keep moving between two pushes (static/js/clock.js, format "span"):
    ``{"at": epoch seconds, "text", "format": "span"}``."""
    return {"at": moment.timestamp(), "text": span_text((now - moment).total_seconds()), "format": "span"}


def span_text(seconds: float) -> str:
    """A verdict's duration: ``95 s`` under 2 min, ``12 min 05 s`` under 2 h, then ``2 h 04 min`` (``seconds``
    rounded with ``round()``, halves to even; static/js/clock.js's "span" says the same)."""
    seconds = round(seconds)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


def forecast_outcome(campaign: Campaign, *, now: dt.datetime | None = None) -> dict[str, Any] | None:
    """The campaign's launch forecast beside what happened, or None when it kept none.

    Returns ``{"forecast": Campaign.forecast with datetimes and Decimals, "rows": [{"what":
    "start" | "finish" | "cost", "forecast": {...}, "actual": datetime | Decimal | None,
    "verdict": words, "ok": True (within) | False (outside) | None (not yet known)[, "relative": a late
    start's or finish's time since the forecast, with its instant (:func:`_since`)]}], "ended":
    tasks ended, "tasks"}``. The start is the first task's start (the scheduler's); the finish
    the campaign's; the cost the sum of its tasks' (a lower bound while tasks are unpriced or
    still running). A finish is judged against the median and the 90th percentile; a cost
    against the 10th to 90th percentile.
    """
    record = campaign.forecast
    if not isinstance(record, dict) or record.get("version") != FORECAST_VERSION:
        return None
    now = now or timezone.now()
    tasks = Task.objects.filter(campaign=campaign)
    facts = tasks.aggregate(first=Min("started_at"), last=Max("ended_at"),
                            ended=Count("id", filter=Q(state__in=("done", "failed", "deleted", "lost"))))
    # Sums in the database: the live producer reads this at each change of a running campaign.
    money = tasks.aggregate(cost=Sum("cost_usd"),
                            unpriced=Count("id", filter=Q(cost_usd__isnull=True, output_tokens__gt=0)))
    cost = Decimal(money["cost"] or 0).quantize(Decimal("1e-8"))
    unpriced = money["unpriced"]
    finished = campaign.status == Campaign.Status.FINISHED
    start_at = _time(record.get("start_at"))
    finish = {k: _time(v) for k, v in (record.get("finish_at") or {}).items()}
    cost_range = {k: Decimal(v) for k, v in (record.get("cost_usd") or {}).items()}
    rows = []

    started = facts["first"]
    at = _time(record.get("at"))
    start_slack = max(START_SLACK_S, 0.1 * (start_at - at).total_seconds()) if start_at and at else START_SLACK_S
    if started is not None:
        verdict = (_late(started, None, start_at, bound="the forecast", slack=start_slack) if start_at
                   else "no forecast start")
        rows.append({"what": "start", "forecast": start_at, "actual": started, "verdict": verdict,
                     "ok": None if start_at is None else verdict == "within the forecast" or "before" in verdict})
    else:
        late = start_at is not None and (now - start_at).total_seconds() > start_slack
        row = {"what": "start", "forecast": start_at, "actual": None,
               "verdict": (f"not started, {span_text((now - start_at).total_seconds())} after the forecast"
                           if late else "not started yet"), "ok": False if late else None}
        rows.append({**row, "relative": _since(start_at, now)} if late else row)

    end = (campaign.finished_at or facts["last"]) if finished else None
    if end is not None:
        verdict = _late(end, None, finish.get("p90")) if finish else "no forecast finish"
        ok = None if not finish else verdict == "within the forecast"
        if finish.get("p50") and ok:
            verdict = ("by the median" if (end - finish["p50"]).total_seconds() <= SLACK_S
                       else "after the median, by the 90th percentile")
        rows.append({"what": "finish", "forecast": finish or None, "actual": end, "verdict": verdict, "ok": ok})
    else:
        p90 = finish.get("p90")
        late = p90 is not None and (now - p90).total_seconds() > SLACK_S
        row = {"what": "finish", "forecast": finish or None, "actual": None,
               "verdict": (f"running, {span_text((now - p90).total_seconds())} past the forecast's latest"
                           if late else "running"), "ok": False if late else None}
        rows.append({**row, "relative": _since(p90, now)} if late else row)

    if cost_range:
        if cost > cost_range["p90"]:
            verdict, ok = f"${cost - cost_range['p90']:.4f} over the forecast's highest", False
        elif finished and not unpriced and cost < cost_range["p10"]:
            verdict, ok = "below the forecast's lowest", False
        else:
            verdict = "within the forecast" if finished and not unpriced else "so far within the forecast"
            ok = True if finished and not unpriced else None
    else:
        verdict, ok = "no cost forecast (no history or no price)", None
    if unpriced:
        verdict += f"; {unpriced} task{'s' if unpriced != 1 else ''} unpriced: at least this much"
    rows.append({"what": "cost", "forecast": cost_range or None, "actual": cost, "verdict": verdict, "ok": ok})
    shown = {**record, "start_at": start_at, "finish_at": finish or None, "cost_usd": cost_range or None, "at": at}
    return {"forecast": shown, "rows": rows, "ended": facts["ended"], "tasks": campaign.task_count,
            "finished": finished}


def _clock(moment: dt.datetime, fmt: str = "%Y-%m-%d %H:%M:%S") -> str:
    return moment.astimezone(dt.timezone.utc).strftime(fmt) + " UTC"


def outcome_view(outcome: dict[str, Any] | None) -> dict[str, Any] | None:
    """:func:`forecast_outcome` as the campaign page's "Forecast and outcome" card says it, JSON-ready
    (None for None): ``{"note": words on the forecast, "widened": words | "", "finished": bool,
    "ended": n, "tasks": n, "rows": [{"what": "start" | "finish" | "cost", "label", "forecast": words,
    "outcome": words, "verdict", "ok": True | False | None[, "relative": the verdict's "N min SS s" since
    the forecast with its instant, while it is late: ``{"at", "text", "format": "span"}``]}]}``. Times read ``2026-06-01 12:01:00 UTC``,
    USD as ``encoding.usd_text`` with the places every amount of its row needs. The live campaign view
    carries it (``live.campaign``), so the card follows each push: a finish and a cost that come in
    after the last task's state changed (the job leaving qstat, its accounting) show without a reload.
    """
    from dashboards.core.encoding import usd_places, usd_text

    if outcome is None:
        return None
    f = outcome["forecast"]
    note = (f"The forecast at launch ({_clock(f['at']) if f.get('at') else 'at an unknown time'}, from "
            f"{f.get('history_runs') or 0} earlier run{'' if f.get('history_runs') == 1 else 's'}"
            + (f"; {f['at_once']} at once, limited by {f['limited_by']}" if f.get("at_once") else "")
            + ") beside what happened"
            + ("" if outcome["finished"] else f" so far ({outcome['ended']} of {outcome['tasks']} ended)") + ".")
    rows = []
    for r in outcome["rows"]:
        forecast, actual = r["forecast"], r["actual"]
        if r["what"] == "start":
            said = _clock(forecast) if forecast else "unknown" + (f" ({f['start_note']})" if f.get("start_note") else "")
            shown = _clock(actual) if actual else "–"
        elif r["what"] == "finish":
            said = (f"{_clock(forecast['p50'])} (median), by {_clock(forecast['p90'], '%H:%M:%S')} (90th percentile)"
                    if forecast else "unknown")
            shown = _clock(actual) if actual else "–"
        else:
            places = usd_places([actual, *(forecast or {}).values()])
            said = (f"{usd_text(forecast['p10'], places)} to {usd_text(forecast['p90'], places)} "
                    f"(median {usd_text(forecast['p50'], places)})" if forecast else "unknown")
            shown = usd_text(actual, places)
        row = {"what": r["what"], "label": r["what"].capitalize(), "forecast": said, "outcome": shown,
               "verdict": r["verdict"], "ok": r["ok"]}
        rows.append({**row, "relative": r["relative"]} if r.get("relative") else row)
    widened = f.get("widened") or {}
    return {"note": note, "widened": widened.get("text", "") if isinstance(widened, dict) else "",
            "finished": outcome["finished"], "ended": outcome["ended"], "tasks": outcome["tasks"], "rows": rows}
