"""Prices of model tokens, in Decimal USD per million tokens, with effective dates.

A :class:`PriceTable` is built from the prices file format (``from_file`` /
``from_mapping``) or from the Django models ``ModelPrice`` / ``ModelAlias``
(``dashboards.pricing_models.price_table``). Standard library only.

Prices file (e.g. ``/work/shared/cases/prices_hypothetical.json``)::

    {"<model>": {"input": 3.0, "output": 15.0, "cache_read": 0.3,
                 "cache_write_5m": 3.75, "cache_write_1h": 6.0},
     "<model>": [{"effective_from": "2025-01-01", "input": ...}, ...],
     "aliases": {"<alias>": "<model>"}}

Values are USD per million tokens, read as Decimal (JSON numbers never pass
through float). A bucket may be left out; ``effective_from`` (ISO date) is
optional, and an entry without one applies from the beginning of time.

Lookup order (BUG-18), first hit wins:

1. the response's model id, exactly;
2. the response's model id through an alias;
3. the requested model, exactly, then through an alias;
4. the requested model after normalisation, then the response's model after
   normalisation (each against the normalised names of the table and the
   aliases);
5. otherwise unpriced: ``cost_usd`` is None and the flag ``unpriced_model``
   is set; the tokens stay recorded. Never priced at 0, never an exception.

Normalisation: strip surrounding space, lower-case, and strip ONE known
provider prefix followed by ``/`` or ``:`` (:data:`PROVIDER_PREFIXES`,
e.g. ``anthropic/``, ``openai:``, ``bedrock/``). Nothing else: a date or
version suffix is NOT stripped, since guessing a price from a similar name
is the fault BUG-18 forbids; name such a model with an alias.

Flags (DESIGN.md): ``response_model_unknown`` when the price was found by
steps 3-4 (the response named a model the table does not know, or named
none); ``unpriced_model`` when nothing matched or the model has no price
effective at that date. One more, ``unpriced_bucket``: the model is priced
but usage fell in a bucket it has no price for (e.g. 1-hour cache writes);
the cost is then None too rather than a silent 0 for that bucket.
"""
from __future__ import annotations

import datetime as dt
import json
import os
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, Iterable, Mapping

from execution.spool.contract import TOKEN_FIELDS as SPOOL_TOKEN_FIELDS

__all__ = ["BUCKETS", "PROVIDER_PREFIXES", "BillTotals", "ModelRate", "PriceResult", "PriceTable", "PriceTableError",
           "normalise_model_name", "format_usd"]

#: Price buckets, and the :class:`~execution.metering.usage.Usage` field each prices.
BUCKETS = {
    "input": "input_tokens",
    "cache_read": "cache_read_tokens",
    "cache_write_5m": "cache_write_5m_tokens",
    "cache_write_1h": "cache_write_1h_tokens",
    "output": "output_tokens",
}

#: Provider prefixes the normalisation strips (before a ``/`` or ``:``).
PROVIDER_PREFIXES = ("anthropic", "openai", "azure", "azure_ai", "bedrock", "vertex", "vertex_ai", "google",
                     "openrouter", "litellm")

MILLION = Decimal(1_000_000)


class PriceTableError(ValueError):
    """The prices file or records are malformed (not a number, negative, bad date)."""


def normalise_model_name(name: str) -> str:
    """The documented normalisation: strip, lower-case, drop one known provider
    prefix (``anthropic/example-sonnet`` -> ``example-sonnet``)."""
    text = name.strip().lower()
    for prefix in PROVIDER_PREFIXES:
        for sep in ("/", ":"):
            if text.startswith(prefix + sep) and len(text) > len(prefix) + 1:
                return text[len(prefix) + 1:]
    return text


def format_usd(amount: Decimal) -> str:
    """A Decimal as fixed-point text without exponent or trailing zeros
    (``Decimal('0.002520')`` -> ``'0.00252'``, zero -> ``'0'``)."""
    text = format(amount, "f")
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return "0" if text in ("", "-0") else text


def _decimal(value: Any, what: str) -> Decimal | None:
    if value is None:
        return None
    if isinstance(value, bool):
        raise PriceTableError(f"{what}: not a number: {value!r}")
    try:
        # str() first: a float's shortest repr is the decimal that was written (0.3 -> '0.3'),
        # whereas Decimal(0.3) would be 0.29999999999999998889...
        number = Decimal(str(value))
    except InvalidOperation as exc:
        raise PriceTableError(f"{what}: not a number: {value!r}") from exc
    if not number.is_finite() or number < 0:
        raise PriceTableError(f"{what}: must be a finite non-negative number: {value!r}")
    return number


def _date(value: Any, what: str) -> dt.date | None:
    if value is None or value == "":
        return None
    if isinstance(value, dt.datetime):
        return value.date()
    if isinstance(value, dt.date):
        return value
    try:
        return dt.date.fromisoformat(str(value))
    except ValueError as exc:
        raise PriceTableError(f"{what}: not an ISO date: {value!r}") from exc


@dataclass(frozen=True)
class ModelRate:
    """Prices of one model from ``effective_from`` (None: always), USD per
    million tokens per bucket (None: no price for that bucket)."""

    model: str
    effective_from: dt.date | None = None
    input: Decimal | None = None
    output: Decimal | None = None
    cache_read: Decimal | None = None
    cache_write_5m: Decimal | None = None
    cache_write_1h: Decimal | None = None

    def per_million(self, bucket: str) -> Decimal | None:
        """Price of ``bucket`` (a key of :data:`BUCKETS`), USD per million tokens."""
        return getattr(self, bucket)


@dataclass
class PriceResult:
    """The price of one usage: ``cost_usd`` (Decimal USD, None when unpriced),
    ``priced_as`` (the table's model name), ``via`` (``response_model``,
    ``alias``, ``requested_model``, ``requested_alias``, ``normalised``), the
    ``rate`` used, ``cost_by_bucket`` and ``flags``."""

    cost_usd: Decimal | None
    priced_as: str | None = None
    via: str | None = None
    rate: ModelRate | None = None
    cost_by_bucket: dict[str, Decimal] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)

    @property
    def cost_text(self) -> str | None:
        """``cost_usd`` as :func:`format_usd` text, or None."""
        return None if self.cost_usd is None else format_usd(self.cost_usd)


class PriceTable:
    """Rates per model (several, by effective date) and aliases (alias -> model)."""

    def __init__(self, rates: Iterable[ModelRate] = (), aliases: Mapping[str, str] | None = None) -> None:
        self._rates: dict[str, list[ModelRate]] = {}
        for rate in rates:
            self._rates.setdefault(rate.model, []).append(rate)
        for entries in self._rates.values():
            entries.sort(key=lambda r: r.effective_from or dt.date.min)
        self.aliases: dict[str, str] = dict(aliases or {})
        # Normalised indexes; a normalised name two entries share is ambiguous and matches neither.
        self._norm_models = self._index(self._rates)
        self._norm_aliases = self._index(self.aliases)

    @staticmethod
    def _index(names: Iterable[str]) -> dict[str, str | None]:
        index: dict[str, str | None] = {}
        for name in names:
            key = normalise_model_name(name)
            index[key] = None if key in index and index[key] != name else name
        return index

    # -- building

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> "PriceTable":
        """Build from the prices file format (module doc). Raises PriceTableError."""
        if not isinstance(data, Mapping):
            raise PriceTableError("prices: expected a JSON object")
        rates = []
        aliases = data.get("aliases") or {}
        if not isinstance(aliases, Mapping) or not all(isinstance(v, str) for v in aliases.values()):
            raise PriceTableError("aliases: expected an object of alias -> model name")
        for model, entry in data.items():
            if model == "aliases":
                continue
            for item in entry if isinstance(entry, list) else [entry]:
                if not isinstance(item, Mapping):
                    raise PriceTableError(f"{model}: expected an object of bucket -> USD per million tokens")
                unknown = set(item) - set(BUCKETS) - {"effective_from", "currency"}
                if unknown:
                    raise PriceTableError(f"{model}: unknown keys {sorted(unknown)}")
                if item.get("currency", "USD") != "USD":
                    raise PriceTableError(f"{model}: only USD prices are supported")
                rates.append(ModelRate(
                    model=model,
                    effective_from=_date(item.get("effective_from"), f"{model}.effective_from"),
                    **{b: _decimal(item.get(b), f"{model}.{b}") for b in BUCKETS},
                ))
        return cls(rates, dict(aliases))

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "PriceTable":
        """Build from a prices JSON file. Raises OSError, PriceTableError."""
        with open(path, "rb") as fh:
            try:
                data = json.loads(fh.read(), parse_float=Decimal)
            except ValueError as exc:
                raise PriceTableError(f"{path}: not JSON: {exc}") from exc
        return cls.from_mapping(data)

    @classmethod
    def from_records(cls, prices: Iterable[Any], aliases: Iterable[Any] = ()) -> "PriceTable":
        """Build from objects shaped like the Django models: prices with
        ``model``, ``effective_from``, ``input_per_mtok``, ``output_per_mtok``,
        ``cache_read_per_mtok``, ``cache_write_5m_per_mtok``,
        ``cache_write_1h_per_mtok``; aliases with ``alias`` and ``model``."""
        rates = [
            ModelRate(model=p.model, effective_from=_date(p.effective_from, f"{p.model}.effective_from"),
                      **{b: _decimal(getattr(p, f"{b}_per_mtok"), f"{p.model}.{b}") for b in BUCKETS})
            for p in prices
        ]
        return cls(rates, {a.alias: a.model for a in aliases})

    def to_mapping(self) -> dict:
        """The table in the prices file format (prices as decimal strings, a
        list of dated entries per model), e.g. for the launcher to write the
        database's table into the spool for runners, which have no Django.
        ``from_mapping(to_mapping())`` gives an equal table."""
        data: dict[str, Any] = {}
        for model, entries in sorted(self._rates.items()):
            data[model] = [
                {**({"effective_from": r.effective_from.isoformat()} if r.effective_from else {}),
                 **{b: format_usd(r.per_million(b)) for b in BUCKETS if r.per_million(b) is not None}}
                for r in entries
            ]
        if self.aliases:
            data["aliases"] = dict(sorted(self.aliases.items()))
        return data

    # -- lookup

    @property
    def models(self) -> list[str]:
        """The model names that have prices."""
        return sorted(self._rates)

    def rate_for(self, model: str, at: dt.date | dt.datetime | None = None) -> ModelRate | None:
        """The rate of ``model`` (exact table name) effective at ``at`` (a date,
        or an aware datetime taken in UTC; None: the latest). None if none."""
        entries = self._rates.get(model)
        if not entries:
            return None
        if at is None:
            return entries[-1]
        if isinstance(at, dt.datetime):
            at = (at.astimezone(dt.timezone.utc) if at.tzinfo else at).date()
        effective = [r for r in entries if r.effective_from is None or r.effective_from <= at]
        return effective[-1] if effective else None

    def resolve(self, response_model: str | None, requested_model: str | None = None) -> tuple[str | None, str | None]:
        """``(table model name, via)`` by the lookup order of the module doc,
        or ``(None, None)``. Dates are not considered here."""
        for name, exact, via_alias in ((response_model, "response_model", "alias"),
                                       (requested_model, "requested_model", "requested_alias")):
            if not name:
                continue
            if name in self._rates:
                return name, exact
            target = self.aliases.get(name)
            if target in self._rates:
                return target, via_alias
        for name in (requested_model, response_model):
            if not name:
                continue
            key = normalise_model_name(name)
            hit = self._norm_models.get(key)
            if hit:
                return hit, "normalised"
            alias = self._norm_aliases.get(key)
            target = self.aliases.get(alias) if alias else None
            if target in self._rates:
                return target, "normalised"
        return None, None

    def price(self, usage: Any, requested_model: str | None = None,
              at: dt.date | dt.datetime | None = None) -> PriceResult:
        """Price ``usage`` (a :class:`~execution.metering.usage.Usage`, or any
        object with its bucket attributes and ``model``). ``requested_model``:
        the model the request asked for; ``at``: when it was used (None: the
        latest prices). Returns a :class:`PriceResult`; never raises for an
        unknown model."""
        response_model = getattr(usage, "model", None)
        name, via = self.resolve(response_model, requested_model)
        flags: list[str] = []
        if name is None:
            return PriceResult(cost_usd=None, flags=["unpriced_model"])
        if via not in ("response_model", "alias"):
            flags.append("response_model_unknown")
        rate = self.rate_for(name, at)
        if rate is None:
            flags.append("unpriced_model")  # known model, but no price effective yet at that date
            return PriceResult(cost_usd=None, priced_as=name, via=via, flags=flags)
        by_bucket: dict[str, Decimal] = {}
        unpriced = False
        for bucket, attr in BUCKETS.items():
            tokens = int(getattr(usage, attr, 0) or 0)
            per_million = rate.per_million(bucket)
            if per_million is None:
                unpriced = unpriced or tokens > 0
                continue
            by_bucket[bucket] = Decimal(tokens) * per_million / MILLION
        if unpriced:
            flags.append("unpriced_bucket")
            return PriceResult(cost_usd=None, priced_as=name, via=via, rate=rate, cost_by_bucket=by_bucket,
                               flags=flags)
        return PriceResult(cost_usd=sum(by_bucket.values(), Decimal(0)), priced_as=name, via=via, rate=rate,
                           cost_by_bucket=by_bucket, flags=flags)


class BillTotals:
    """Sums of usage and cost over many requests, keeping unpriced usage apart.

    ``cost_usd`` is the sum of the priced requests only; tokens of requests
    that could not be priced are counted in ``unpriced_tokens`` with their
    model names, so a report shows them on a line of their own (BUG-18)
    instead of a silent 0.
    """

    TOKEN_FIELDS = SPOOL_TOKEN_FIELDS

    def __init__(self) -> None:
        self.tokens = {name: 0 for name in self.TOKEN_FIELDS}
        self.cost_usd = Decimal(0)
        self.priced_requests = 0
        self.unpriced_tokens = 0
        self.unpriced_models: set[str] = set()

    def add(self, usage: Any, price: PriceResult | None, requested_model: str | None = None) -> None:
        """Add one request's ``usage`` and its ``price`` (None: no price table)."""
        for name in self.TOKEN_FIELDS:
            self.tokens[name] += int(getattr(usage, name, 0) or 0)
        if price is not None and price.cost_usd is not None:
            self.cost_usd += price.cost_usd
            self.priced_requests += 1
        else:
            self.unpriced_tokens += int(getattr(usage, "total_tokens", 0) or 0)
            name = (price.priced_as if price is not None else None) or getattr(usage, "model", None) \
                or requested_model or "(no model named)"
            self.unpriced_models.add(name)

    @property
    def total_tokens(self) -> int:
        """All disjoint buckets (reasoning is part of output)."""
        return sum(v for k, v in self.tokens.items() if k != "reasoning_tokens")

    def unpriced_line(self) -> str | None:
        """``'110 tokens on 1 unpriced model (totally-unknown-model)'``, or None."""
        if not self.unpriced_models:
            return None
        count = len(self.unpriced_models)
        return (f"{self.unpriced_tokens} tokens on {count} unpriced model{'s' if count != 1 else ''} "
                f"({', '.join(sorted(self.unpriced_models))})")

    def to_dict(self) -> dict:
        """JSON-ready: token buckets, ``total_tokens``, ``cost_usd`` (text, the
        priced part), ``priced_requests``, ``unpriced_tokens``, ``unpriced_models``."""
        return {**self.tokens, "total_tokens": self.total_tokens, "cost_usd": format_usd(self.cost_usd),
                "priced_requests": self.priced_requests, "unpriced_tokens": self.unpriced_tokens,
                "unpriced_models": sorted(self.unpriced_models)}
