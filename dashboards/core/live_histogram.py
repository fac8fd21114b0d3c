"""The live path's lag histogram (``tco_live_lag_seconds``): observations in each process, drained into the
live store's shared hash (``core.live_bus``) and read back for /metrics, with Prometheus' cumulative buckets
(``le``, seconds, ``+Inf`` last)."""
from __future__ import annotations

import bisect
import threading
from typing import Any

#: Lag histogram buckets (seconds), ``tco_live_lag_seconds``.
LAG_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0)


class Histogram:
    """Lag observations in this process, handed to the store's shared histogram by :meth:`drain`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: dict[str, list[int]] = {}
        self._sums: dict[str, float] = {}

    def observe(self, stage: str, value: float) -> None:
        with self._lock:
            counts = self._counts.setdefault(stage, [0] * (len(LAG_BUCKETS) + 1))
            counts[bisect.bisect_left(LAG_BUCKETS, value)] += 1
            self._sums[stage] = self._sums.get(stage, 0.0) + value

    def drain(self) -> dict[str, tuple[list[int], float]]:
        """``{stage: (count per bucket, not cumulative; the last is above every bucket), sum)}`` since the
        last drain."""
        with self._lock:
            out = {stage: (counts, self._sums.get(stage, 0.0)) for stage, counts in self._counts.items()}
            self._counts, self._sums = {}, {}
        return out


def histogram_fields(drained: dict[str, tuple[list[int], float]]) -> tuple[dict[str, int], dict[str, float]]:
    """The ``lag`` hash increments of :meth:`Histogram.drain`: ``({"<stage>|<le>": n, "<stage>|count": n},
    {"<stage>|sum": s})``, cumulative per bucket as Prometheus counts them (``le`` ``+Inf`` last)."""
    counts: dict[str, int] = {}
    sums: dict[str, float] = {}
    for stage, (per_bucket, total) in drained.items():
        running = 0
        for le, n in zip((*LAG_BUCKETS, "+Inf"), per_bucket):
            running += n
            if running:
                counts[f"{stage}|{le}"] = running
        if running:
            counts[f"{stage}|count"] = running
            sums[f"{stage}|sum"] = total
    return counts, sums


def parse_histograms(fields: dict) -> dict[str, dict[str, Any]]:
    """The ``lag`` hash as ``{stage: {"buckets": [(le, cumulative n)], "count": n, "sum": s}}``."""
    out: dict[str, dict[str, Any]] = {}
    for raw_key, raw_value in fields.items():
        key = raw_key.decode() if isinstance(raw_key, bytes) else raw_key
        value = raw_value.decode() if isinstance(raw_value, bytes) else raw_value
        stage, _, what = key.partition("|")
        h = out.setdefault(stage, {"buckets": {}, "count": 0, "sum": 0.0})
        if what == "count":
            h["count"] = int(value)
        elif what == "sum":
            h["sum"] = float(value)
        else:
            h["buckets"][what] = int(value)
    for h in out.values():
        h["buckets"] = [(str(le), h["buckets"].get(str(le), 0)) for le in (*LAG_BUCKETS, "+Inf")]
    return out
