"""Prices of model tokens per campaign task and the cost forecast of a launch from history (USD)."""
from __future__ import annotations

import logging
from decimal import Decimal
from types import SimpleNamespace
from typing import Any

from django.conf import settings
from django.db import DatabaseError, transaction

from dashboards import pricing_models
from dashboards.billing.bills import BUCKETS, ZERO
from dashboards.core.stages import quantile
from dashboards.models import Task

log = logging.getLogger(__name__)
#: Finished tasks of an agent definition read for a forecast (the newest first).
FORECAST_HISTORY = 5000


# --------------------------------------------------------------------------- forecasts

def price_table():
    """Today's price table (``execution.metering.prices.PriceTable``): the database's
    prices (``pricing_models.price_table``, edited in the admin), and for models it
    does not price, ``settings.TCO_PRICES`` in the prices file format
    (``{"model": {"input": 3, "output": 15, ...}}``, USD per million tokens);
    None when neither prices anything."""
    from execution.metering.prices import PriceTable, PriceTableError

    merged: dict = dict(getattr(settings, "TCO_PRICES", None) or {})
    try:
        with transaction.atomic():  # a savepoint: a missing table must not spoil the caller's transaction
            table = pricing_models.price_table()
        if table.models:
            # The database's prices win; TCO_PRICES prices the models it lacks.
            database = table.to_mapping()
            aliases = {**(merged.pop("aliases", None) or {}), **(database.pop("aliases", None) or {})}
            merged.update(database)
            if aliases:
                merged["aliases"] = aliases
    except (ImportError, LookupError, PriceTableError, DatabaseError) as exc:
        log.debug("no price table in the database: %s", exc)
    return PriceTable.from_mapping(merged) if merged else None


def _task_price(table, model: str, tokens: dict[str, int]) -> Decimal | None:
    """Cost of one task's ``tokens`` (bucket -> count) at today's price of ``model``; None if unpriced."""
    usage = SimpleNamespace(model=None, **{b: int(tokens.get(b) or 0) for b in BUCKETS})
    return table.price(usage, requested_model=model).cost_usd


def forecast(*, agent_definition, count: int, model: str = "") -> dict[str, Any]:
    """Cost forecast of ``count`` tasks from earlier finished runs of ``agent_definition``.

    Median tokens per task x ``count`` x price, with a range from the 10th to
    the 90th percentile. Every finished run counts, also one that used no
    tokens (an agent that calls no model forecasts 0 tokens and $0, not "no
    history"; issue 16, bug 10). Each earlier task is priced at today's price
    of ``model`` when the price table (``price_table``) has it, else at the
    cost metering recorded for it (a run without tokens costs $0).
    Returns ``{"history": n tasks, "no_history": bool, "count", "tokens_per_task":
    {p10, p50, p90}, "tokens": {p10, p50, p90} (x count), "metered_history":
    runs that used tokens, "cost_per_task": {p10, p50, p90} (Decimal USD) |
    None, "cost_usd": {p10, p50, p90} | None (x count), "priced_by": "price
    table" | "recorded cost" | None, "unpriced_history": n, "duration_s":
    {p10, p50, p90} (wall clock seconds per task) | None, "slots": {p10, p50,
    p90} slots per task}``; the token and cost figures are None when there is no history.
    """
    history = list(
        Task.objects.filter(campaign__agent_definition=agent_definition, state__in=("done", "failed"))
        .order_by("-ended_at", "-id")
        .values(*BUCKETS, "cost_usd", "wallclock_s", "slots")[:FORECAST_HISTORY]
    )
    result: dict[str, Any] = {"history": len(history), "no_history": not history, "count": count,
                              "tokens_per_task": None, "tokens": None, "cost_per_task": None, "cost_usd": None,
                              "priced_by": None, "unpriced_history": 0, "model": model, "metered_history": 0,
                              "duration_s": None}
    if not history:
        return result
    for h in history:
        h["total"] = sum(int(h[b] or 0) for b in BUCKETS)
        if h["total"] == 0 and h["cost_usd"] is None:
            h["cost_usd"] = ZERO  # no tokens: nothing to pay, not an unknown cost
    result["metered_history"] = sum(1 for h in history if h["total"])
    durations = sorted(float(h["wallclock_s"]) for h in history if h["wallclock_s"] is not None)
    if durations:
        result["duration_s"] = {name: quantile(durations, q) for name, q in (("p10", 0.1), ("p50", 0.5),
                                                                              ("p90", 0.9))}
    tokens = sorted(h["total"] for h in history)
    per_task = {name: quantile(tokens, q) for name, q in (("p10", 0.1), ("p50", 0.5), ("p90", 0.9))}
    result["tokens_per_task"] = {k: int(round(v)) for k, v in per_task.items()}
    result["tokens"] = {k: int(round(v * count)) for k, v in per_task.items()}
    table = price_table() if model else None
    priced = [_task_price(table, model, h) for h in history] if table is not None else []
    if priced and all(cost is not None for cost in priced):
        costs = sorted(priced)
        result["priced_by"] = "price table"
    else:
        costs = sorted(h["cost_usd"] for h in history if h["cost_usd"] is not None)
        result["unpriced_history"] = len(history) - len(costs)
        result["priced_by"] = "recorded cost" if costs else None
    if costs:
        cents = Decimal("0.000001")
        per = {name: quantile(costs, q) for name, q in (("p10", 0.1), ("p50", 0.5), ("p90", 0.9))}
        result["cost_per_task"] = {k: v.quantize(cents) for k, v in per.items()}
        result["cost_usd"] = {k: (v * count).quantize(cents) for k, v in per.items()}
    return result
