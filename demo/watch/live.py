"""The whole watch around run 1 of the seed replay: :class:`LiveWatch` (demo/watch/__init__.py).
"""
from __future__ import annotations

import math
import time
import urllib.request
from typing import Any, Callable, Mapping, Sequence

from demo.watch.browsers import Browsers, Client, wait_all
from demo.watch.lags import (GONE, STARTED, TASKS_PER_PAGE, Key, count_lags, lag_breakdown, lag_summary, percentile,
                             scope_check, shown_changes, task_lags)
from demo.watch.samplers import LoadSampler, QstatSampler
from demo.watch.users import allowed_campaigns, session_for, team_projects, watcher_users

__all__ = ["LiveWatch"]


class LiveWatch:
    """Items 4 and 5 around run 1 (module doc). Use: :meth:`start` before the launch (qstat sampler,
    queue sockets, load sampler), :meth:`follow` with the campaigns once launched (their pages' sockets
    and the probes), :meth:`stop` when the run is over, then :meth:`results`."""

    def __init__(self, *, base_url: str, watchers: int, list_tasks: Callable[[], list], admin,
                 qstat_period_s: float = 0.25, pids: Mapping[str, int] | None = None,
                 log: Callable[[str], None] = print) -> None:
        self.base_url, self.log = base_url, log
        self.sampler = QstatSampler(list_tasks, period_s=qstat_period_s)
        self.users = [admin, *watcher_users(watchers)] if watchers else [admin]
        self.clients = [Client(username=u.username, session_key=session_for(u), admin=u.is_superuser)
                        for u in self.users]
        self.browsers = Browsers(base_url, self.clients)
        self.campaigns: dict[int, dict] = {}   # id -> {"job", "tasks"}
        self.load = LoadSampler(pids=pids or {}, base_url=base_url, session_key=self.clients[0].session_key,
                                pages=lambda: ["/", *(f"/campaigns/{c}/" for c in list(self.campaigns)[:1])])
        self.started_at = self.stopped_at = None

    def start(self, wait_s: float = 60.0) -> None:
        """Start the samplers and open every client's queue socket (waits up to ``wait_s`` seconds for
        their first snapshots). Raises OSError when the web server does not answer."""
        urllib.request.urlopen(self.base_url.rstrip("/") + "/healthz", timeout=5).close()
        self.started_at = time.time()
        self.sampler.start()
        self.browsers.start()
        wait_all([self.browsers.watch(client, "/ws/queue/") for client in self.clients], wait_s)
        self.load.start()

    def follow(self, campaigns: Sequence, wait_s: float = 30.0) -> None:
        """Open the pages of ``campaigns`` (Campaign rows) for the clients that may see them: the
        admin every page of each (waited for, up to ``wait_s`` s; its sockets give the item-4 lag),
        every other client, as a browser would, page 1 of one campaign of its team (the first it
        may see; none more once it has one open), without waiting (they connect while the run
        goes); every other client also probes one campaign it may not see."""
        ids = [c.pk for c in campaigns]
        self.followed_at = getattr(self, "followed_at", None) or time.time()
        for c in campaigns:
            self.campaigns[c.pk] = {"tasks": c.task_count}
        for n, (user, client) in enumerate(zip(self.users, self.clients)):
            allowed = allowed_campaigns(user, ids)
            opened = []
            for c in campaigns:
                if c.pk not in allowed or (n and client.pages):
                    continue
                pages = range(1, max(1, math.ceil(c.task_count / TASKS_PER_PAGE)) + 1) if n == 0 else [1]
                for page in pages:
                    client.pages.add((c.pk, page))
                    opened.append(self.browsers.watch(client, f"/ws/campaigns/{c.pk}/", page=page))
            others = [i for i in ids if i not in allowed]
            if others:
                opened.append(self.browsers.probe(client, others[0]))
            if n == 0:
                wait_all(opened, wait_s)

    def stop(self, linger_s: float = 10.0) -> None:
        """Stop the qstat sampler, give the clients up to ``linger_s`` seconds to receive every change
        it saw of the campaigns they may see (a change later than that counts as missed), then stop
        the rest and close the sockets (once; later calls do nothing)."""
        if self.stopped_at is not None:
            return
        self.stopped_at = time.time()
        self.sampler.stop()
        try:
            from dashboards.models import Campaign

            jobs = dict(Campaign.objects.filter(pk__in=self.campaigns).values_list("pk", "job_number"))
            sighted = dict(self.sampler.sightings.first)
            wanted = [(shown_changes(sighted, {jobs[c]: c for c in allowed_campaigns(user, jobs) if jobs[c]},
                                     client.pages), client)
                      for user, client in zip(self.users, self.clients)]
        except Exception:  # noqa: BLE001 - no lingering then; the results say what arrived
            wanted = []
        deadline = time.monotonic() + linger_s
        while time.monotonic() < deadline and any(
                k not in client.arrivals.first for shown, client in wanted for k in shown):
            time.sleep(0.2)
        self.load.stop()
        self.browsers.stop()

    def results(self) -> dict[str, Any]:
        """Figures for the report (call after :meth:`stop`; reads the campaigns' job numbers)."""
        from dashboards.models import Campaign

        rows = {c.pk: c for c in Campaign.objects.filter(pk__in=self.campaigns).select_related("team")}
        jobs = {c.job_number: c for c in rows.values() if c.job_number}
        sighted = {k: v for k, v in self.sampler.sightings.first.items() if k[0] in jobs}
        first_gone = min((v for k, v in sighted.items() if k[2] == GONE), default=math.inf)
        wave = {k for k, v in sighted.items() if k[2] == STARTED and v < first_gone}
        per_client = []
        for user, client in zip(self.users, self.clients):
            allowed = allowed_campaigns(user, rows)
            allowed_jobs = {rows[c].job_number for c in allowed}
            label_of = {rows[c].job_number: f"/ws/campaigns/{c}/" for c in allowed}

            def since(key: Key, client=client, label_of=label_of) -> float | None:
                # From the first snapshot of the socket showing the task's page (no failures reorder it).
                page = max(1, math.ceil(key[1] / TASKS_PER_PAGE))
                return client.connected_at.get(f"{label_of.get(key[0])}?page={page}")

            # What its open pages show: the task rows of those pages (the queue page's counts below).
            shown = shown_changes(sighted, {rows[c].job_number: c for c in allowed}, client.pages)
            matched = task_lags(shown, client.arrivals.first, jobs=allowed_jobs, since=since)
            wave_lags = [client.arrivals.first[k] - sighted[k] for k in sorted(wave)
                         if k in client.arrivals.first and k[0] in allowed_jobs
                         and since(k) is not None and sighted[k] >= since(k)]
            queue_since = client.connected_at.get("/ws/queue/?page=1")
            queue_lags = []
            for c in allowed:
                series = client.queue_counts.get(c, [])
                for kind, index in ((STARTED, 1), (GONE, 2)):
                    times = [v for k, v in sighted.items() if k[0] == rows[c].job_number and k[2] == kind]
                    queue_lags += count_lags(times, [(s[0], s[index]) for s in series], since=queue_since)["lags"]
            if user.is_superuser:
                violations = []   # an admin may see everything
            else:
                violations = scope_check(
                    allowed_campaigns=allowed_campaigns(user, client.seen_campaigns | set(rows)),
                    allowed_jobs=allowed_jobs, allowed_projects=team_projects(user),
                    seen_campaigns=client.seen_campaigns, seen_projects=client.seen_projects,
                    arrived=client.arrivals.first, probes=client.probes)
            per_client.append({"user": user.username, "admin": user.is_superuser, "lag": matched,
                               "breakdown": lag_breakdown(sighted, client.arrivals.first, client.news,
                                                          matched["keys"]),
                               "arrived": sorted(client.arrivals.first),
                               "wave_lags": wave_lags, "queue_lags": queue_lags, "violations": violations,
                               "errors": client.errors, "messages": client.messages,
                               "probes": dict(client.probes)})
        rss = {name: {"start": v[0], "peak": max(v), "end": v[-1]} for name, v in self.load.rss.items() if v}
        pages = [at for c in self.clients for label, at in c.connected_at.items() if label.startswith("/ws/campaigns/")]
        opened = sum(1 for c in self.clients for _ in c.connected_at) + sum(
            len(c.errors) for c in self.clients)
        return {"clients": per_client, "sighted": len(sighted), "wave": len(wave),
                "qstat_samples": self.sampler.samples, "qstat_errors": self.sampler.errors,
                "qstat_period_s": self.sampler.period_s,
                "qstat_p50_s": percentile(self.sampler.durations, 0.5),
                "sockets": {"campaign_pages": len(pages), "opened": opened,
                            "last_s": max(pages) - self.followed_at if pages and getattr(self, "followed_at", None)
                            else None},
                "rss": rss, "cpu": {name: v[1] - v[0] for name, v in self.load.cpu.items() if len(v) == 2},
                "cpu_top": self.load.top_commands(),
                "pages": {k: lag_summary(v) for k, v in self.load.page_times.items()},
                "page_errors": self.load.page_errors, "duration_s": (self.stopped_at or time.time()) - self.started_at}
