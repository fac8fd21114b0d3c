"""The cache's serializer: JSON, never pickle.

Django's ``RedisCache`` pickles values by default (``RedisSerializer``), so
anyone who can write a key runs code in every process that reads it. This
serializer keeps cached values as data: JSON (RFC 8259) with two tagged
types tco caches, ``Decimal`` (dollars) and aware ``datetime``; tuples come
back as lists. A value that is not such JSON (anything another writer put
there) reads as a cache miss (``None``), never as code.
"""
from __future__ import annotations

import datetime as dt
import json
import logging
from decimal import Decimal, InvalidOperation
from typing import Any

log = logging.getLogger(__name__)

_DECIMAL = "__decimal__"
_DATETIME = "__datetime__"


def _encode(value: Any) -> Any:
    if isinstance(value, Decimal):
        return {_DECIMAL: str(value)}
    if isinstance(value, dt.datetime):
        return {_DATETIME: value.isoformat()}
    raise TypeError(f"{type(value).__name__} cannot be cached as JSON")


def _decode(obj: dict) -> Any:
    if len(obj) == 1:
        if _DECIMAL in obj and isinstance(obj[_DECIMAL], str):
            return Decimal(obj[_DECIMAL])
        if _DATETIME in obj and isinstance(obj[_DATETIME], str):
            return dt.datetime.fromisoformat(obj[_DATETIME])
    return obj


class JSONSerializer:
    """``dumps(value) -> bytes | int`` and ``loads(bytes) -> value``, the interface of Django's ``RedisSerializer``.

    Integers stay plain Redis integers (``incr``/``decr`` work on them, as in
    Django's own serializer). ``dumps`` raises ``TypeError`` for a value JSON
    cannot hold (a model instance, a set): cache data, not objects.
    """

    def dumps(self, value: Any) -> bytes | int:
        if type(value) is int:
            return value
        return json.dumps(value, default=_encode, separators=(",", ":")).encode()

    def loads(self, data: bytes) -> Any:
        try:
            return int(data)
        except (TypeError, ValueError):
            pass
        try:
            return json.loads(data, object_hook=_decode)
        except (ValueError, UnicodeDecodeError, InvalidOperation, RecursionError):
            log.warning("cache: a value that is not tco's JSON was ignored (%d bytes)", len(data))
            return None
