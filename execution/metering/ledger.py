"""The metering proxy's books: counts, token buckets, cost and the request records.

One :class:`Ledger` per proxy, used from its event loop only. See
execution/metering/proxy.py's module doc (item 5) and
:meth:`execution.metering.proxy.MeteringProxy.totals`.
"""
from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Callable

from execution.metering.caps import CampaignCounter, CampaignCounterError
from execution.metering.prices import BillTotals

if TYPE_CHECKING:
    from execution.metering.prices import PriceTable
    from execution.metering.usage import Usage

__all__ = ["Ledger", "COUNTS"]

#: The counters of :meth:`Ledger.totals`, all starting at 0.
COUNTS = ("requests", "forwarded", "refused", "rate_limited", "upstream_errors", "incomplete", "client_disconnected",
          "connections_refused", "records_dropped")


class Ledger:
    """Counts, the bill and the newest request records of one proxy.

    ``prices``: the price table (None: costs are not computed, usage is flagged
    ``unpriced_model``); ``campaign_counter``: the campaign's shared spending, added to per
    request (or None); ``records_in_memory``: how many records :attr:`records` keeps;
    ``record_sink``: called with each record (False back: the record was dropped, counted in
    ``records_dropped``), or None.
    """

    def __init__(self, *, prices: PriceTable | None, campaign_counter: CampaignCounter | None,
                 records_in_memory: int, record_sink: Callable[[dict], Any] | None) -> None:
        self.prices = prices
        self.campaign_counter = campaign_counter
        self.records_in_memory = records_in_memory
        self.record_sink = record_sink
        self.records: list[dict] = []
        self.bill = BillTotals()
        self.counts = dict.fromkeys(COUNTS, 0)
        self.refused_by_reason: dict[str, int] = {}
        self.flag_counts: dict[str, int] = {}

    def totals(self) -> dict:
        """Counts, token buckets and cost of everything so far: the :data:`COUNTS`
        (``connections_refused``: over the connection limit; ``records_dropped``: not written,
        the record file reached its size cap), ``refused_by_reason``, the buckets of
        :class:`~execution.metering.prices.BillTotals` (``cost_usd`` text of the priced part,
        ``unpriced_tokens``, ``unpriced_models``) and ``flags`` (flag -> number of requests).
        ``cost_usd`` is None when no price table is configured."""
        bill = self.bill.to_dict()
        if self.prices is None:
            bill["cost_usd"] = None
        return {**self.counts, "refused_by_reason": dict(self.refused_by_reason), **bill,
                "flags": dict(self.flag_counts)}

    def refused(self, reason: str) -> None:
        """Count a refusal for ``reason``."""
        self.counts["refused"] += 1
        self.refused_by_reason[reason] = self.refused_by_reason.get(reason, 0) + 1

    def settle(self, record: dict, usage: Usage | None) -> None:
        """Book one finished request: its ``usage`` (None: nothing billable) priced into
        ``record`` (``usage``, ``model_returned``, ``complete``, ``cost_usd``, ``priced_as``,
        ``flags``), added to the bill and the campaign counter, then the record emitted.
        Synchronous, so it also runs in a cancelled handler."""
        if usage is not None:
            record["usage"] = usage.to_dict()
            record["model_returned"] = usage.model
            record["complete"] = usage.complete
            flags = list(usage.flags)
            price = None
            if self.prices is not None:
                at = dt.datetime.fromisoformat(record["at"].replace("Z", "+00:00"))
                price = self.prices.price(usage, record["model_requested"], at=at)
                record["cost_usd"], record["priced_as"] = price.cost_text, price.priced_as
                flags += [f for f in price.flags if f not in flags]
            elif "unpriced_model" not in flags:
                flags.append("unpriced_model")
            record["flags"] = flags
            if not usage.complete:
                self.counts["incomplete"] += 1
            for flag in flags:
                self.flag_counts[flag] = self.flag_counts.get(flag, 0) + 1
            self.bill.add(usage, price, record["model_requested"])
            counter = self.campaign_counter
            if counter is not None and usage.total_tokens:
                cost = price.cost_usd if price is not None and price.cost_usd is not None else Decimal(0)
                try:
                    counter.add(usage.total_tokens, cost)
                except (OSError, CampaignCounterError) as exc:
                    record["error"] = f"campaign counter not updated: {exc}"[:500]
        self.emit(record)

    def emit(self, record: dict) -> None:
        """Keep ``record`` (the newest ``records_in_memory``) and pass it to the sink."""
        self.records.append(record)
        if len(self.records) > self.records_in_memory:
            del self.records[:len(self.records) - self.records_in_memory]
        if self.record_sink is not None and self.record_sink(record) is False:
            self.counts["records_dropped"] += 1
