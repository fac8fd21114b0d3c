"""The runner's stage clock: UTC times from the monotonic clock, anchored once.

The anchor is taken when this module is first imported; ``__main__.py`` imports
it before anything else, so ``task_started_at`` is the runner's first timestamp
(queue wait is measured up to it). Standard library only.
"""
from __future__ import annotations

import time

#: The wall clock (ns since the epoch, UTC) and CLOCK_MONOTONIC (ns) read together at import.
ANCHOR_WALL_NS = time.time_ns()
ANCHOR_MONO_NS = time.monotonic_ns()


class StageClock:
    """UTC timestamps from the monotonic clock, anchored once to the wall clock.

    ``wall_ns``/``mono_ns``: the anchor, nanoseconds (default: this module's import).
    Times stay ordered even if the wall clock steps after the anchor.
    """

    def __init__(self, wall_ns: int = ANCHOR_WALL_NS, mono_ns: int = ANCHOR_MONO_NS) -> None:
        self._wall_ns = wall_ns
        self._mono_ns = mono_ns

    def now_ns(self) -> int:
        """Nanoseconds since the epoch, UTC."""
        return self.wall_of(time.monotonic_ns())

    def wall_of(self, mono_ns: int) -> int:
        """The UTC time (ns since the epoch) of a CLOCK_MONOTONIC reading (ns)."""
        return self._wall_ns + (mono_ns - self._mono_ns)

    def anchor_iso(self) -> str:
        """The anchor itself as ISO text (``task_started_at``)."""
        return self.iso(self._wall_ns)

    def iso(self, ns: int | None = None) -> str:
        """``2025-01-02T03:04:05.123456Z`` for ``ns`` (ns since the epoch; default now)."""
        ns = self.now_ns() if ns is None else ns
        seconds, rest = divmod(ns, 1_000_000_000)
        return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(seconds)) + f".{rest // 1000:06d}Z"

    def iso_mono(self, mono_ns: int | None) -> str | None:
        """:meth:`iso` of a monotonic reading (ns; None stays None)."""
        return None if mono_ns is None else self.iso(self.wall_of(mono_ns))
