"""The arithmetic of the live watch: first sightings, lags, their breakdown, and scoping.

Pure: epoch seconds in, figures out (demo/watch/__init__.py says what is
compared). Every figure here has a hand-worked test (tests/unit/test_watch.py).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Mapping, Sequence

__all__ = ["NOT_STARTED", "ENDED", "STARTED", "GONE", "LAG_GOAL_S", "PAGE_GOAL_S", "TASKS_PER_PAGE", "Key",
           "percentile", "lag_summary", "Sightings", "task_lags", "LAG_PARTS", "lag_breakdown", "count_lags",
           "shown_changes", "scope_check"]

#: qstat states that mean "not started yet" (schedulers.base.SCHEDULER_STATES).
NOT_STARTED = frozenset({"pending", "held", "error", "unknown"})
#: Database states that mean "gone from qstat": finishing, then a terminal state (schedulers.base).
ENDED = frozenset({"finishing", "done", "failed", "deleted", "lost"})
STARTED, GONE = "started", "ended"
#: The goal of items 4 and 5 (seconds) and of a page's server time (bench/bench_pages.py; seconds).
LAG_GOAL_S = 2.0
PAGE_GOAL_S = 0.3
#: Tasks per campaign page (dashboards.live.campaign.TASKS_PER_PAGE): one socket per page.
TASKS_PER_PAGE = 100

Key = tuple  # (job number, task number, STARTED | GONE)


def percentile(values: Sequence[float], q: float) -> float | None:
    """The nearest-rank ``q`` percentile (0 < q <= 1) of ``values``: the smallest value with at least
    ``q`` of them at or below it; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def lag_summary(lags: Sequence[float]) -> dict[str, Any]:
    """``{"n", "p50", "p95", "max", "min"}`` of lags in seconds (None when there are none)."""
    return {"n": len(lags), "p50": percentile(lags, 0.5), "p95": percentile(lags, 0.95),
            "max": max(lags) if lags else None, "min": min(lags) if lags else None}


class Sightings:
    """First instants of each task's changes in a stream of observations (qstat samples or page rows).

    :meth:`observe` takes one complete observation of some jobs' tasks; a task of
    a watched job seen before and missing from a complete observation has
    ended. ``first[(job, task, STARTED|GONE)]`` is the instant (epoch seconds)
    of the first observation that showed it. A task seen ended without having
    been seen started (it ran between two samples) gets both at that instant.
    """

    def __init__(self) -> None:
        self.first: dict[Key, float] = {}
        self._seen: set[tuple[int, int]] = set()

    def observe(self, at: float, states: Mapping[tuple[int, int], str], *,
                complete_jobs: Iterable[int] = ()) -> list[Key]:
        """``states``: ``{(job, task): state}`` observed at ``at``. ``complete_jobs``: jobs of which
        ``states`` lists every task still there (qstat lists all jobs: pass every job seen before).
        Returns the changes this observation showed first."""
        self._new: list[Key] = []
        for (job, task), state in states.items():
            self._seen.add((job, task))
            if state in ENDED:
                self._mark(job, task, STARTED, at)
                self._mark(job, task, GONE, at)
            elif state not in NOT_STARTED:
                self._mark(job, task, STARTED, at)
        complete = set(complete_jobs)
        if complete:
            for job, task in self._seen:
                if job in complete and (job, task) not in states:
                    self._mark(job, task, STARTED, at)
                    self._mark(job, task, GONE, at)
        return self._new

    def _mark(self, job: int, task: int, kind: str, at: float) -> None:
        if (job, task, kind) not in self.first:
            self.first[(job, task, kind)] = at
            self._new.append((job, task, kind))

    def jobs(self) -> set[int]:
        """The job numbers of every task observed so far."""
        return {job for job, _ in self._seen}


def task_lags(sighted: Mapping[Key, float], arrived: Mapping[Key, float], *, jobs: Iterable[int],
              since: float | Callable[[Key], float | None] | None = None) -> dict[str, Any]:
    """Match qstat's first sightings to a client's first arrivals, change by change.

    ``sighted``/``arrived``: ``{(job, task, kind): epoch s}``; only changes of ``jobs`` count.
    ``since``: changes sighted before it (the client was not yet connected) are left out of the
    lags (still counted as received when they arrived); a function of the change gives the
    instant for each (its page's socket), None leaving it out. Returns ``{"lags": [s], "keys": [the
    lags' changes, in order], "received": n,
    "expected": n, "missed": [keys], "unexpected": [keys arrived that qstat never saw]}``.
    A lag is ``arrival - sighting`` and is negative when the page showed the change before
    the sampler's next qstat did (tco's own poll ran in between).
    """
    jobs = set(jobs)
    expected = {k for k in sighted if k[0] in jobs}
    start = since if callable(since) else (lambda _k: since if since is not None else -math.inf)
    lags, keys = [], []
    for k in sorted(expected & set(arrived)):
        began = start(k)
        if began is not None and sighted[k] >= began:
            lags.append(arrived[k] - sighted[k])
            keys.append(k)
    return {"lags": lags, "keys": keys, "received": len(expected & set(arrived)), "expected": len(expected),
            "missed": sorted(expected - set(arrived)),
            "unexpected": sorted(k for k in arrived if k[0] in jobs and k not in sighted)}


#: Where a change's lag goes: (label, from, to), instants of the change's qstat sighting, of the
#: ``as_of`` of the first snapshot showing it (dashboards.live.publish: when the poll's qstat began,
#: when its change was committed, when the producer's read began, when it published), and of its arrival.
LAG_PARTS = (
    ("qstat sighting -> poll's qstat start (cadence)", "sighted", "observed_at"),
    ("poll's qstat start -> committed (qstat, diff, write)", "observed_at", "committed_at"),
    ("committed -> read began (waiting for the producer)", "committed_at", "read_at"),
    ("read began -> published (the read, JSON, once)", "read_at", "published_at"),
    ("published -> arrival (Redis, web process, network)", "published_at", "arrived"),
)


def lag_breakdown(sighted: Mapping[Key, float], arrived: Mapping[Key, float], news: Mapping[Key, Mapping],
                  keys: Iterable[Key]) -> dict[str, Any]:
    """Split each change's lag (arrival - sighting, as :func:`task_lags`) into :data:`LAG_PARTS`.

    ``news``: ``{change: as_of}`` of the first snapshot that showed it (``observed_at``,
    ``committed_at``, ``read_at``, ``published_at``: epoch seconds, or None); ``keys``: the changes to split. A change
    whose snapshot answered no poll's event (a connect snapshot, a change no poll found) is
    ``unsplit``. The parts of a split change add up to its lag; a part is negative when, e.g., the
    poll's qstat began before the sampler's (the change was then seen by the poll first).
    Returns ``{"parts": {label: [s]}, "n": split changes, "unsplit": n}``.
    """
    parts: dict[str, list[float]] = {label: [] for label, _, _ in LAG_PARTS}
    n = unsplit = 0
    for key in keys:
        as_of = news.get(key) or {}
        at = {"sighted": sighted.get(key), "arrived": arrived.get(key),
              **{name: as_of.get(name) for _, name, _ in LAG_PARTS[1:]}}
        if any(v is None for v in at.values()):
            unsplit += 1
            continue
        n += 1
        for label, a, b in LAG_PARTS:
            parts[label].append(at[b] - at[a])
    return {"parts": parts, "n": n, "unsplit": unsplit}


def count_lags(sightings: Sequence[float], series: Sequence[tuple[float, int]], *,
               since: float | None = None) -> dict[str, Any]:
    """Lags of a page that shows counts: the k-th sighting (sorted) against the first arrival whose
    count reached k. ``series``: ``[(arrival epoch s, count)]`` in arrival order. ``since``: as in
    :func:`task_lags`. Returns ``{"lags": [s], "received": n, "expected": n}`` (received: the
    highest count shown, at most the sightings)."""
    times = sorted(sightings)
    lags: list[float] = []
    k = 0
    for at, count in series:
        while k < len(times) and count >= k + 1:
            if since is None or times[k] >= since:
                lags.append(at - times[k])
            k += 1
    return {"lags": lags, "received": k, "expected": len(times)}


def shown_changes(sighted: Mapping[Key, float], campaign_of: Mapping[int, int],
                  pages: set[tuple[int, int]]) -> dict[Key, float]:
    """Of ``sighted`` (``{(job, task, kind): s}``), the changes shown by the open campaign ``pages``
    (``{(campaign id, page)}``; ``TASKS_PER_PAGE`` tasks a page, by task number): the task rows a
    client has open. ``campaign_of``: ``{job: campaign id}`` of the campaigns it may see."""
    return {k: v for k, v in sighted.items()
            if k[0] in campaign_of and (campaign_of[k[0]], max(1, math.ceil(k[1] / TASKS_PER_PAGE))) in pages}


def scope_check(*, allowed_campaigns: set[int], allowed_jobs: set[int], allowed_projects: set[str],
                seen_campaigns: set[int], seen_projects: set[str], arrived: Iterable[Key],
                probes: Mapping[int, int | None]) -> list[str]:
    """What a client received that it may not see, as messages (empty: none).

    ``seen_*``: every campaign id and project named in its snapshots; ``arrived``: its task
    changes; ``probes``: ``{campaign of another team: close code}`` of the sockets it tried to
    open there (4403 expected)."""
    out = []
    for c in sorted(seen_campaigns - allowed_campaigns):
        out.append(f"campaign {c} of another team")
    for p in sorted(seen_projects - allowed_projects):
        out.append(f"project {p!r}")
    foreign = sorted({(job, task) for job, task, _ in arrived if job not in allowed_jobs})
    if foreign:
        out.append(f"{len(foreign)} task(s) of other jobs, e.g. {foreign[:3]}")
    for c, code in sorted(probes.items()):
        if code != 4403:
            out.append(f"campaign {c}'s socket was not refused (close code {code})")
    return out
