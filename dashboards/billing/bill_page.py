"""What the bill page shows of a bill besides its rows: the CSV, unit costs, the chart, pages, the costliest tasks.

A bill (``billing.bills.bill``'s result) is made once; these turn it into what the page and its
CSV download show. Units as in ``billing.bills``: USD as ``Decimal`` (floats only in the chart's
data), seconds, integer tokens.
"""
from __future__ import annotations

from decimal import Decimal
from typing import Any, Iterable, Iterator

from dashboards.billing.bills import BUCKETS, NOT_TCO, used_tokens_q
from dashboards.models import Task, Team

CSV_COLUMNS = ("period_start", "team", "project", "group_by", "group", "tasks", "accounting_records",
               *BUCKETS, "reasoning_tokens", "total_tokens", "cost_usd", "unpriced_tasks", "wallclock_s", "slot_s",
               "launched_by_tco", "finished_tasks", "successful_verdicts")


def bill_csv_rows(result: dict[str, Any]) -> Iterator[list[str]]:
    """The bill as CSV rows (header first): USD as exact decimals, seconds with 3 decimals."""
    yield list(CSV_COLUMNS)
    for row in result["rows"]:
        yield [row["period"].isoformat(), row["team"], row["project"], result["group_by"], str(row["label"]),
               str(row["tasks"]), str(row["records"]), *(str(row[b]) for b in BUCKETS), str(row["reasoning_tokens"]),
               str(row["total_tokens"]), format(row["cost_usd"].normalize(), "f"), str(row["unpriced_tasks"]),
               f"{row['wallclock_s']:.3f}", f"{row['slot_s']:.3f}", "yes" if row["launched_by_tco"] else "no",
               str(row["finished_tasks"]), str(row["verdicts"])]


def unit_costs(row: dict[str, Any]) -> dict[str, Any]:
    """Cost per finished task and per successful verdict (``SUCCESSFUL_VERDICT``) of a bill row:
    ``{"per_finished": Decimal | None, "per_verdict": Decimal | None, "complete": bool}``; None
    when there is nothing to divide by; ``complete`` False when some tasks are unpriced (the
    figures are then a lower bound, never shown as the whole cost)."""
    def per(n: int) -> Decimal | None:
        return (row["cost_usd"] / n).quantize(Decimal("0.000001")) if n else None

    return {"per_finished": per(row["finished_tasks"]), "per_verdict": per(row["verdicts"]),
            "complete": not row["unpriced_tasks"]}


#: A chart stacks at most this many labels; the others are one series, "(N others)".
CHART_SERIES = 20


def bill_chart(result: dict[str, Any], *, top: int = CHART_SERIES) -> dict[str, Any]:
    """The bill as a stacked chart's data: ``{"periods": [ISO date], "series": [{"label",
    "cost_usd": [float per period], "unpriced_tasks": [int per period], "launched_by_tco"}],
    "group_by"}``; one series per label, tco's first by total cost, usage tco did not launch last.
    Beyond the ``top`` costliest of tco's labels, the rest are summed into one series."""
    periods = sorted({r["period"] for r in result["rows"]})
    index = {p: i for i, p in enumerate(periods)}
    series: dict[tuple, dict[str, Any]] = {}
    for row in result["rows"]:
        label = str(row["label"]) if row["launched_by_tco"] else f"{row['team']} {NOT_TCO}"
        key = (row["launched_by_tco"], label)
        item = series.setdefault(key, {"label": label, "launched_by_tco": row["launched_by_tco"],
                                       "cost_usd": [0.0] * len(periods), "unpriced_tasks": [0] * len(periods)})
        item["cost_usd"][index[row["period"]]] += float(row["cost_usd"])
        item["unpriced_tasks"][index[row["period"]]] += row["unpriced_tasks"]
    ordered = sorted(series.values(), key=lambda s: (not s["launched_by_tco"], -sum(s["cost_usd"]), s["label"]))
    tco = [s for s in ordered if s["launched_by_tco"]]
    if len(tco) > top + 1:
        rest = tco[top:]
        other = {"label": f"({len(rest)} others)", "launched_by_tco": True,
                 "cost_usd": [sum(s["cost_usd"][i] for s in rest) for i in range(len(periods))],
                 "unpriced_tasks": [sum(s["unpriced_tasks"][i] for s in rest) for i in range(len(periods))]}
        ordered = tco[:top] + [other] + [s for s in ordered if not s["launched_by_tco"]]
    return {"periods": [p.isoformat() for p in periods], "series": ordered, "group_by": result["group_by"]}


#: Rows a page of a bill shows (the totals and the CSV hold them all).
ROWS_PER_PAGE = 200
#: Tasks a page of the costliest tasks shows.
COSTLIEST_PER_PAGE = 20


def costliest_tasks(campaign_id: int, *, teams: Iterable[Team], limit: int = COSTLIEST_PER_PAGE,
                    offset: int = 0) -> list[Task]:
    """The campaign's tasks by cost, the costliest first (unpriced ones with tokens after them),
    at most ``limit`` from the ``offset``-th on; only a campaign of one of ``teams``.

    Two reads, each in the order of an index: the priced tasks by cost (the partial index
    ``task_costliest``: a page deep in a 10,000-task campaign reads no more than the tasks before
    it, where one ``ORDER BY cost DESC NULLS LAST`` sorted them all), then, past their end, the
    unpriced ones with tokens by task number."""
    tasks = Task.objects.filter(campaign_id=campaign_id, campaign__team__in=list(teams))
    priced = list(tasks.filter(cost_usd__isnull=False).order_by("-cost_usd", "task_number")[offset:offset + limit])
    if len(priced) == limit:
        return priced
    skip = max(0, offset - tasks.filter(cost_usd__isnull=False).count()) if not priced else 0
    unpriced = tasks.filter(cost_usd__isnull=True).filter(used_tokens_q()).order_by("task_number")
    return priced + list(unpriced[skip:skip + limit - len(priced)])


def costliest_campaign(by_campaign: dict[str, Any], *, teams: Iterable[Team]) -> dict[str, Any] | None:
    """The costliest of tco's campaigns in a bill grouped by campaign (``bills.bill(group_by="campaign")``:
    its rows summed over the periods) and that campaign's costliest task (:func:`costliest_tasks`, of the
    whole campaign): ``{"campaign_id", "label", "cost_usd" (Decimal, in the bill's range), "share" (of the
    bill's total, None when it is 0), "task": Task | None}``; None when no campaign cost anything. The lead's
    question, answered on the bill's first screen: this week's spend, where most of it went, and on what."""
    if by_campaign["group_by"] != "campaign":
        raise ValueError("costliest_campaign reads a bill grouped by campaign")
    costs: dict[int, Decimal] = {}
    labels: dict[int, str] = {}
    for row in by_campaign["rows"]:
        if row["launched_by_tco"] and row["key"] is not None:
            key = int(row["key"])
            costs[key] = costs.get(key, Decimal(0)) + row["cost_usd"]
            labels[key] = str(row["label"])
    if not costs:
        return None
    top = max(costs, key=lambda k: (costs[k], -k))
    if costs[top] <= 0:
        return None
    total = by_campaign["totals"]["cost_usd"]
    tasks = costliest_tasks(top, teams=teams, limit=1)
    return {"campaign_id": top, "label": labels[top], "cost_usd": costs[top],
            "share": costs[top] / total if total else None, "task": tasks[0] if tasks else None}
