"""Spending caps of the metering proxy: per task, and per campaign through a shared counter.

Caps are checked before each request is forwarded (:func:`cap_refusal`); see
execution/metering/proxy.py's module doc, "Caps".
"""
from __future__ import annotations

import asyncio
import fcntl
import json
import os
from dataclasses import dataclass
from decimal import Decimal
from typing import TYPE_CHECKING, Protocol

from execution.metering.prices import format_usd
from execution.metering.routing import Refusal

if TYPE_CHECKING:
    from execution.metering.prices import BillTotals, PriceTable

__all__ = ["CampaignCounter", "CampaignCounterError", "FileCampaignCounter", "Caps", "cap_refusal"]


class CampaignCounter(Protocol):
    """Tokens and USD a whole campaign has spent, shared by its tasks' proxies."""

    def read(self) -> tuple[int, Decimal]:
        """``(tokens, cost_usd)`` the campaign has spent so far."""
        ...

    def add(self, tokens: int, cost_usd: Decimal) -> tuple[int, Decimal]:
        """Add one request's tokens and cost (USD); returns the new totals."""
        ...


class CampaignCounterError(RuntimeError):
    """The campaign counter file exists but cannot be read."""


class FileCampaignCounter:
    """A campaign's spending in a JSON file ``{"tokens": int, "cost_usd": "decimal"}``
    on the shared spool. Every access holds a POSIX lock (``fcntl.lockf``,
    which NFS supports through its lock manager) on ``<path>.lock``; updates
    replace the file atomically (temp file, fsync, rename), so a crash never
    leaves a half-written count. A missing file counts as zero; an unreadable
    one raises CampaignCounterError."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = os.fspath(path)

    def _locked(self):
        fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o660)
        fcntl.lockf(fd, fcntl.LOCK_EX)
        return fd

    def _load(self) -> tuple[int, Decimal]:
        try:
            with open(self.path, encoding="utf-8") as fh:
                data = json.load(fh)
            return int(data["tokens"]), Decimal(str(data["cost_usd"]))
        except FileNotFoundError:
            return 0, Decimal(0)
        except (ValueError, KeyError, TypeError, ArithmeticError) as exc:
            raise CampaignCounterError(f"{self.path}: unreadable campaign counter: {exc}") from exc

    def read(self) -> tuple[int, Decimal]:
        """``(tokens, cost_usd)`` spent so far."""
        fd = self._locked()
        try:
            return self._load()
        finally:
            os.close(fd)  # closing releases the lock

    def add(self, tokens: int, cost_usd: Decimal) -> tuple[int, Decimal]:
        """Add one request's tokens and cost; returns the new totals."""
        fd = self._locked()
        try:
            total_tokens, total_cost = self._load()
            total_tokens += int(tokens)
            total_cost += cost_usd
            tmp = f"{self.path}.{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as fh:
                json.dump({"tokens": total_tokens, "cost_usd": format_usd(total_cost)}, fh)
                fh.flush()
                os.fsync(fh.fileno())
            os.replace(tmp, self.path)
            return total_tokens, total_cost
        finally:
            os.close(fd)


@dataclass
class Caps:
    """Limits checked before each request; None: no limit. Tokens are all
    disjoint buckets together; costs are USD (Decimal) and need a price table.
    ``campaign_counter`` is required for the campaign caps."""

    task_tokens: int | None = None
    task_cost_usd: Decimal | None = None
    campaign_tokens: int | None = None
    campaign_cost_usd: Decimal | None = None
    campaign_counter: CampaignCounter | None = None

    @property
    def has_cost_cap(self) -> bool:
        """Whether a task or campaign cost cap is set (it needs a price table)."""
        return self.task_cost_usd is not None or self.campaign_cost_usd is not None

    @property
    def any(self) -> bool:
        """Whether any cap is set."""
        return any(v is not None for v in (self.task_tokens, self.task_cost_usd, self.campaign_tokens,
                                           self.campaign_cost_usd))


async def cap_refusal(caps: Caps, bill: BillTotals, prices: PriceTable | None, requested_model: str | None,
                      api: str | None) -> Refusal | None:
    """The :class:`~execution.metering.routing.Refusal` of a request once the task's spending so
    far (``bill``) or the campaign's (read from ``caps.campaign_counter`` in a worker thread) has
    reached a cap, or when a cost cap is set and ``requested_model`` has no price in ``prices``
    (for a model API ``api``); None to let it through."""
    if caps.task_tokens is not None and bill.total_tokens >= caps.task_tokens:
        return Refusal("task_token_cap", f"the task reached its cap of {caps.task_tokens} tokens")
    if caps.task_cost_usd is not None and bill.cost_usd >= caps.task_cost_usd:
        return Refusal("task_cost_cap", f"the task reached its cap of {caps.task_cost_usd} USD")
    if caps.has_cost_cap and prices is not None and api is not None:
        name, _ = prices.resolve(None, requested_model)
        if name is None:
            return Refusal("unpriced_model_under_cost_cap",
                           f"model {requested_model!r} has no price, so a cost cap cannot be enforced")
    if caps.campaign_counter is not None and (caps.campaign_tokens is not None
                                              or caps.campaign_cost_usd is not None):
        try:
            tokens, cost = await asyncio.to_thread(caps.campaign_counter.read)
        except (OSError, CampaignCounterError) as exc:
            return Refusal("campaign_counter_unreadable", f"campaign spending unknown: {exc}")
        if caps.campaign_tokens is not None and tokens >= caps.campaign_tokens:
            return Refusal("campaign_token_cap", f"the campaign reached its cap of {caps.campaign_tokens} tokens")
        if caps.campaign_cost_usd is not None and cost >= caps.campaign_cost_usd:
            return Refusal("campaign_cost_cap", f"the campaign reached its cap of {caps.campaign_cost_usd} USD")
    return None
