"""``python manage.py inspect usage FILE [--prices FILE] [--requested-model NAME]``.

Reads one captured model response (a JSON body or a server-sent events
stream, detected from the content) and returns the object the command prints
as one JSON line. No Django and no database here.
"""
from __future__ import annotations

import os

from execution.metering.prices import PriceTable
from execution.metering.usage_readers import usage_from_bytes
from execution.spool.contract import TOKEN_FIELDS

__all__ = ["KEYS", "inspect_usage"]

#: The keys of the printed object, in order.
KEYS = ("provider", "model", *TOKEN_FIELDS, "complete", "cost_usd", "flags")


def inspect_usage(path: str | os.PathLike, prices_path: str | os.PathLike | None = None,
                  requested_model: str | None = None, *, price_table: PriceTable | None = None) -> dict:
    """Usage and cost of the captured response at ``path``.

    Returns a dict with exactly :data:`KEYS`: ``provider`` (``anthropic``,
    ``openai`` or None), ``model`` (the response's model id or None), the
    token buckets (ints; ``input_tokens`` is uncached input,
    ``reasoning_tokens`` is a part of ``output_tokens``), ``complete``
    (bool), ``cost_usd`` (decimal text in USD, or None when unpriced) and
    ``flags`` (usage flags, then price flags; see execution/metering/usage.py
    and prices.py). Prices come from ``prices_path`` (the prices JSON file
    format) or ``price_table``; with neither, ``cost_usd`` is None and
    ``unpriced_model`` is flagged. ``requested_model`` takes part in the price
    lookup. The capture is taken as everything the response sent: a stream
    without its terminal event is incomplete. Raises OSError if a file cannot
    be read, PriceTableError if the prices file is malformed.
    """
    with open(path, "rb") as fh:
        data = fh.read()
    table = price_table if price_table is not None else (
        PriceTable.from_file(prices_path) if prices_path is not None else None)
    usage = usage_from_bytes(data)
    flags = list(usage.flags)
    cost = None
    if table is None:
        flags.append("unpriced_model")
    else:
        price = table.price(usage, requested_model)
        cost = price.cost_text
        flags += [f for f in price.flags if f not in flags]
    return {
        "provider": usage.provider,
        "model": usage.model,
        "input_tokens": usage.input_tokens,
        "cache_read_tokens": usage.cache_read_tokens,
        "cache_write_5m_tokens": usage.cache_write_5m_tokens,
        "cache_write_1h_tokens": usage.cache_write_1h_tokens,
        "output_tokens": usage.output_tokens,
        "reasoning_tokens": usage.reasoning_tokens,
        "complete": usage.complete,
        "cost_usd": cost,
        "flags": flags,
    }
