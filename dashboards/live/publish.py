"""The one producer of the live views: after each change, each watched view is built once, per audience,
as finished JSON with its sequence number, stored as the view's latest snapshot and published.

It runs in a process of its own (``manage.py tco_live_publish``: scripts/services, the site's
``tco-live.service``), woken by the writers' change marks (``core.realtime.changed``, after their
commits: the poll, the launch, the submit worker, runner records, accounting, the depth samples).
One pass (:func:`publish_pass`):

1. the views someone watches (``core.live_bus``: registered by the web processes for their sockets,
   and by page GETs), and those whose snapshot is older than their source's generation;
2. per source, oldest change first: its generation and its oldest change's instants are *taken*
   (then the database is read, so the snapshot holds every change counted), each of its views is
   built (``snapshots.build``) and encoded once, and all are stored and published in one round trip.

Changes that arrive during a pass wake the next one; a burst of them costs one build per view.
Web processes only forward the bytes (``dashboards.live.hub``), whatever the number of sockets.
"""
from __future__ import annotations

import collections
import dataclasses
import logging
import os
import signal
import threading
import time

from dashboards.core import live_bus, live_histogram
from dashboards.live import snapshots

log = logging.getLogger(__name__)

#: The producer's own lags (seconds since the change's qstat began, when published) over this window
#: are shown to admins (p95 and the latest): ``tco:live:status``.
WINDOW_S = 300.0


@dataclasses.dataclass
class PassResult:
    views: int = 0            # registered views
    built: int = 0            # views built and published
    failed: int = 0
    sources: int = 0
    seconds: float = 0.0
    lags: list[float] = dataclasses.field(default_factory=list)


class Producer:
    """The state one producer keeps between passes: its lag window and its histogram."""

    def __init__(self, store=None) -> None:
        self.store = store or live_bus.bus()
        self.histogram = live_histogram.Histogram()
        self.recent: collections.deque[tuple[float, float]] = collections.deque()
        self.passes = 0
        self.last: PassResult | None = None

    def epoch(self) -> str:
        """The store's epoch, read at each pass that builds: a Redis that lost its data (restarted, flushed)
        makes a new one, and the sequence numbers counted afresh from 1 then never look older than the
        records the web processes and browsers hold."""
        return self.store.epoch()

    def publish_pass(self) -> PassResult:
        began = time.monotonic()
        store = self.store
        result = PassResult()
        views = store.registered()
        result.views = len(views)
        if views:
            parsed: dict[str, snapshots.View] = {}
            for key in views:
                try:
                    parsed[key] = snapshots.View.parse(key)
                except ValueError:
                    log.warning("forgetting %r: not a live view", key)
                    store.forget(key)
            gens, built = store.gens(), store.built(list(parsed))
            by_source: dict[str, list[snapshots.View]] = {}
            for key, view in parsed.items():
                by_source.setdefault(view.source, []).append(view)
            dirty = {source for source, vs in by_source.items()
                     if any(built.get(v.key) is None or built[v.key] < gens.get(source, 0) for v in vs)}
            if dirty:
                pending = store.pending()
                # The oldest change first (a source without one pending: a view just registered).
                order = sorted(dirty, key=lambda s: (pending.get(s, float("inf")), s))
                ctx = snapshots.BuildContext()
                epoch = self.epoch()
                for source in order:
                    self._source(source, by_source[source], built, ctx, epoch, result)
        result.seconds = time.monotonic() - began
        self.passes += 1
        self.last = result
        return result

    def _source(self, source: str, views: list[snapshots.View], built: dict[str, int],
                ctx: snapshots.BuildContext, epoch: str, result: PassResult) -> None:
        from django.db import DatabaseError

        gen, observed_at, committed_at = self.store.take(source)   # before the database is read
        stale = [v for v in views if built.get(v.key) is None or built[v.key] < gen]
        if not stale:
            return
        result.sources += 1
        read_at = time.time()
        done: list[tuple[snapshots.View, dict]] = []
        for view in stale:
            try:
                done.append((view, snapshots.build(view, ctx)))
            except snapshots.Gone:
                self.store.forget(view.key)
            except DatabaseError:
                raise     # the pass stops; the marks are taken, but the generations say what to rebuild
            except Exception:  # noqa: BLE001 - one view's bug does not stop the others
                result.failed += 1
                log.exception("could not build live view %s", view.key)
        if not done:
            return
        seqs = self.store.next_seqs([v.key for v, _ in done])
        published_at = time.time()
        as_of = {"observed_at": observed_at, "committed_at": committed_at, "read_at": read_at,
                 "published_at": published_at}
        items = []
        for (view, data), seq in zip(done, seqs):
            record = live_bus.Record(seq, gen, epoch, observed_at,
                                     snapshots.body(view, data, seq=seq, epoch=epoch, as_of=as_of))
            items.append((view.key, gen, record.encode()))
        self.store.publish(items)
        result.built += len(items)
        # A lag is how late a view someone watched showed a change. A view built for the first time
        # (just registered: a page opened, the demo's first socket) shows changes nobody watched,
        # the oldest of them maybe minutes old: counted, they made the admins' lag line read "p95 57 s"
        # right after `make demo`.
        watched = any(built.get(view.key) is not None for view, _ in done)
        if observed_at is not None and watched:
            lag = published_at - observed_at
            result.lags.append(lag)
            self.histogram.observe("published", lag)
            self.recent.append((published_at, lag))

    def status(self) -> dict:
        now = time.time()
        while self.recent and self.recent[0][0] < now - WINDOW_S:
            self.recent.popleft()
        lags = sorted(lag for _, lag in self.recent)
        last = self.last or PassResult()
        return {"at": now, "pid": os.getpid(), "passes": self.passes, "views": last.views,
                "pass_s": round(last.seconds, 4), "window_s": WINDOW_S, "published": len(lags),
                "lag_last_s": round(self.recent[-1][1], 3) if self.recent else None,
                "lag_p95_s": round(lags[max(0, -(-95 * len(lags) // 100) - 1)], 3) if lags else None,
                "lag_max_s": round(lags[-1], 3) if lags else None}

    def flush(self) -> None:
        """Hand the lag histogram and the status (the heartbeat) to the store."""
        self.store.observe(self.histogram)
        self.store.set_status(self.status())


def live_status() -> dict:
    """The live path as admins see it (the ops pages): ``{"ok", "producer": its latest report or None,
    "producer_age_s", "web": [each web process's report], "sockets", "sent_p95_s", "error"}``."""
    store = live_bus.bus()
    try:
        status, web = store.status(), store.web_statuses()
    except Exception as exc:  # noqa: BLE001 - shown as it is
        return {"ok": False, "producer": None, "producer_age_s": None, "web": [], "sockets": 0,
                "sent_p95_s": None, "error": f"{type(exc).__name__}: {exc}"}
    age = None if not status else max(0.0, time.time() - float(status.get("at") or 0))
    sent = [w["lag_p95_s"] for w in web if w.get("lag_p95_s") is not None]
    return {"ok": status is not None and age is not None and age < 10, "producer": status,
            "producer_age_s": age, "web": web, "sockets": sum(w.get("sockets") or 0 for w in web),
            "sent_p95_s": max(sent) if sent else None, "error": ""}


def publish_pass() -> PassResult:
    """One pass of this process's producer (:class:`Producer`)."""
    return _producer().publish_pass()


_PRODUCERS: dict[int, Producer] = {}


def _producer() -> Producer:
    store = live_bus.bus()
    producer = _PRODUCERS.get(id(store))
    if producer is None or producer.store is not store:
        producer = _PRODUCERS[id(store)] = Producer(store)
    return producer


def run(stop: threading.Event | None = None, *, idle_s: float = 1.0) -> None:
    """Pass after pass until ``stop`` is set (or SIGTERM): woken by each change, and every ``idle_s``
    seconds anyway (a wake-up lost while Redis was away, a view registered without one)."""
    from django.db import close_old_connections

    stop = stop or threading.Event()
    producer = _producer()
    flushed = 0.0
    log.info("live producer started (pid %s)", os.getpid())
    while not stop.is_set():
        try:
            producer.store.wait_wake(idle_s)
            close_old_connections()
            result = producer.publish_pass()
            if result.built:
                log.debug("live pass: %d views built in %.3f s", result.built, result.seconds)
            if time.monotonic() - flushed >= 1.0:
                producer.flush()
                flushed = time.monotonic()
        except Exception:  # noqa: BLE001 - Redis or the database away: the next pass rebuilds what moved
            log.warning("live producer pass failed; retrying", exc_info=True)
            close_old_connections()
            stop.wait(1.0)
    log.info("live producer stopped")


def serve() -> None:
    """:func:`run` until SIGTERM or SIGINT (the management command)."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    run(stop)


def _memory_pass() -> PassResult:
    producer = _PRODUCERS.get(id(live_bus.MEMORY))
    if producer is None:
        producer = _PRODUCERS[id(live_bus.MEMORY)] = Producer(live_bus.MEMORY)
    return producer.publish_pass()


# The in-memory store (one process: the unit tests) runs the producer at each wake-up.
live_bus.MEMORY.runner = _memory_pass
