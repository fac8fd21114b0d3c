"""Lists in chunks small enough for one SQL ``IN (...)``: SQLite binds at most 999 parameters."""
from __future__ import annotations

from collections.abc import Iterable

CHUNK = 900  # stays under SQLite's 999 bound parameters per IN (...)


def in_chunks(items: list, size: int = CHUNK) -> Iterable[list]:
    """``items`` in consecutive lists of at most ``size`` (default ``CHUNK``, 900)."""
    for i in range(0, len(items), size):
        yield items[i:i + size]
