"""Small value encoders shared by pages, API and live payloads: JSON-ready values, ISO times, USD text.

Money is ``Decimal`` USD everywhere inside tco; these turn it into text or
JSON numbers only at the edge.
"""
from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any, Iterable

from dashboards.core.stages import iso as _iso


def usd_places(amounts: Iterable[Decimal], *, over: tuple[Decimal, Decimal] | None = None,
               tolerance: Decimal = Decimal("0.01")) -> int:
    """Decimal places (2 to 8) to show USD ``amounts`` with: the fewest that put every amount
    within ``tolerance`` (a fraction, 1 %) of itself and, when ``over = (a, b)`` with ``a > b``,
    keep ``a`` visibly above ``b``. ``[0.0072, 0.009]`` -> 4 ("$0.0072", "$0.0090")."""
    amounts = [Decimal(a) for a in amounts if a is not None]
    for places in range(2, 9):
        step = Decimal(1).scaleb(-places)
        if any(a and abs(a.quantize(step) - a) > abs(a) * tolerance for a in amounts):
            continue
        if over is not None and over[0] > over[1] and not over[0].quantize(step) > over[1].quantize(step):
            continue
        return places
    return 8


def usd_text(amount: Decimal | None, places: int | None = None) -> str:
    """``amount`` as ``$1,234.56``; with ``places`` None, as many places as ``usd_places`` needs
    for it alone (``$0.0072``, never a rounded ``$0.01``). ``"?"`` for None."""
    if amount is None:
        return "?"
    amount = Decimal(amount)
    if places is None:
        places = usd_places([amount])
    return f"${amount.quantize(Decimal(1).scaleb(-places)):,}"



# --------------------------------------------------------------------------- helpers

def money_text(value: Decimal | None) -> str | None:
    """USD as a string with 8 decimals (the models' precision); sums from SQLite carry more."""
    return None if value is None else format(Decimal(value).quantize(Decimal("1e-8")), "f")


def jsonable(value: Any) -> Any:
    """``value`` with datetimes as ISO strings (UTC, ``Z``), Decimals as strings, tuples and sets as lists."""
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if isinstance(value, dt.datetime):
        return _iso(value.astimezone(dt.timezone.utc) if value.tzinfo else value)
    if isinstance(value, dt.date):
        return value.isoformat()
    if isinstance(value, Decimal):
        return format(value, "f")
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return value
