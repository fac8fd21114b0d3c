"""Live lag and load during the seed replay (issue 15 items 4 and 5).

While run 1 of the replay goes (:mod:`demo.replay`), this module watches it
from both ends and compares:

- **the scheduler**: :class:`QstatSampler`, a thread that runs ``qstat -xml
  -u '*'`` (the adapter's :meth:`list_tasks`) every ``period_s`` seconds and
  keeps, per task ``(job number, task number)``, the instant of the first
  sample that showed it started (any state past ``pending``/``held``/``error``)
  and the first that no longer listed it (it ended). The instant is when the
  qstat call *began*: a change qstat reports happened before it returned, so
  the lag is never understated by qstat's own run time.
- **the browser**: WebSocket clients (aiohttp, in a thread with its own event
  loop) of tco's live pages, logged in as real users through a session
  cookie: one socket on the queue page (``/ws/queue/``) and one per page of
  each campaign it may see (``/ws/campaigns/<id>/``, 100 tasks a page), each
  message timestamped on arrival. A campaign page's task rows give, per task,
  the arrival of the first snapshot showing it started and the first showing
  it ended (``finishing`` or a terminal state); the queue page's campaign rows
  give counts (started, ended) per campaign.
- **the lag** of a change: its arrival minus its first qstat sighting
  (:func:`task_lags`; for the queue page's counts, the k-th sighting against
  the first snapshot counting k, :func:`count_lags`).
- **scoping** (:func:`scope_check`): what each client may see is computed here
  from the database's memberships (not the selectors the pages use): the
  campaigns of its teams. Every change of those that qstat saw must have
  arrived; no task, campaign or project of another team may have arrived; a
  socket on another team's campaign must be refused (4403).
- **load**: resident memory (``VmRSS`` of ``/proc/<pid>/status``, children
  included) of the web server and worker processes, sampled every second, and
  the time of a few GETs of the queue page and a campaign page during the run.

Clients are :func:`watcher_users` (``replay-watch-<project>-NN``, viewers and
launchers of one team each, created as needed) plus the admin, whose socket
gives the item-4 lag (it sees every task).
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import math
import re
import threading
import time
import urllib.request
from importlib import import_module
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

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
WATCHER_PREFIX = "replay-watch-"

Key = tuple  # (job number, task number, STARTED | GONE)


# --------------------------------------------------------------------------- pure logic

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


# --------------------------------------------------------------------------- the scheduler side

class QstatSampler(threading.Thread):
    """Samples ``list_tasks()`` every ``period_s`` seconds into :class:`Sightings` (module doc).
    ``errors`` counts failed samples; ``samples`` the good ones."""

    def __init__(self, list_tasks: Callable[[], list], *, period_s: float = 0.25) -> None:
        super().__init__(name="tco-qstat-sampler", daemon=True)
        self.list_tasks, self.period_s = list_tasks, period_s
        self.sightings = Sightings()
        self.samples = self.errors = 0
        self.durations: list[float] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        while not self._stop_event.is_set():
            began = time.time()
            try:
                tasks = self.list_tasks()
            except Exception:  # noqa: BLE001 - a failed sample is counted, the next one goes on
                self.errors += 1
            else:
                states = {(t.job_number, t.task_number or 0): t.state for t in tasks}
                self.sightings.observe(began, states, complete_jobs=self.sightings.jobs())
                self.samples += 1
                self.durations.append(time.time() - began)
            self._stop_event.wait(max(0.0, self.period_s - (time.time() - began)))

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=30)


# --------------------------------------------------------------------------- the browser side

@dataclasses.dataclass
class Client:
    """One logged-in user's sockets and what arrived on them."""

    username: str
    session_key: str
    admin: bool = False
    arrivals: Sightings = dataclasses.field(default_factory=Sightings)
    # campaign id -> [(arrival, started count, ended count)] from the queue page
    queue_counts: dict[int, list[tuple[float, int, int]]] = dataclasses.field(default_factory=dict)
    seen_campaigns: set[int] = dataclasses.field(default_factory=set)
    seen_projects: set[str] = dataclasses.field(default_factory=set)
    connected_at: dict[str, float] = dataclasses.field(default_factory=dict)   # socket path -> first snapshot
    pages: set[tuple[int, int]] = dataclasses.field(default_factory=set)      # (campaign id, page) opened
    probes: dict[int, int | None] = dataclasses.field(default_factory=dict)
    # change -> the "as_of" of the first snapshot showing it (lag_breakdown)
    news: dict[Key, dict] = dataclasses.field(default_factory=dict)
    messages: int = 0
    errors: list[str] = dataclasses.field(default_factory=list)
    # (arrival, kind, the snapshot's generated_at): where a delivery's time went
    timeline: list[tuple[float, str, str]] = dataclasses.field(default_factory=list)

    def on_queue(self, at: float, data: dict) -> None:
        for row in data.get("campaigns") or []:
            self.seen_campaigns.add(row["id"])
            self._project(row)
            states = row.get("states") or {}
            started = sum(n for s, n in states.items() if s not in NOT_STARTED)
            ended = sum(n for s, n in states.items() if s in ENDED)
            series = self.queue_counts.setdefault(row["id"], [])
            if not series or series[-1][1:] != (started, ended):
                series.append((at, started, ended))
        for row in data.get("by_team") or []:
            self._project(row)
        for row in data.get("recent_finished") or []:
            if row.get("campaign_id") is not None:
                self.seen_campaigns.add(row["campaign_id"])
            self._project(row)

    def _project(self, row: dict) -> None:
        if row.get("project"):
            self.seen_projects.add(row["project"])

    def on_campaign(self, at: float, data: dict, as_of: dict | None = None) -> None:
        campaign = data.get("campaign") or {}
        if campaign.get("id") is not None:
            self.seen_campaigns.add(campaign["id"])
        self._project(campaign)
        job = campaign.get("job_number")
        if job:
            new = self.arrivals.observe(at, {(job, row["task_number"]): row["state"] for row in data.get("tasks") or []})
            for key in new:
                self.news[key] = as_of or {}


#: The head of a live snapshot (dashboards.live.snapshots.body): its view, sequence and epoch name it.
_SNAPSHOT_HEAD = re.compile(r'\{"kind":"[^"]*","view":"(?:[^"\\]|\\.)*","seq":\d+,"epoch":"[^"]*"')


class Browsers:
    """The clients' sockets, run by an event loop in a thread of their own (module doc).

    Every socket of a view gets the very same text: each distinct snapshot is parsed once here and
    shared (:meth:`parse`), as each browser would parse its own on its own machine; hundreds of
    clients on this host would otherwise spend the cores the server is measured on."""

    def __init__(self, base_url: str, clients: Sequence[Client]) -> None:
        self.base = base_url.rstrip("/")
        self.ws_base = "ws" + self.base[len("http"):]
        self.clients = list(clients)
        self._parsed: collections.OrderedDict[str, dict] = collections.OrderedDict()
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="tco-watchers", daemon=True)
        self._tasks: list[asyncio.Future] = []
        self._session = None

    def parse(self, text: str) -> dict:
        """``json.loads(text)``, once per distinct snapshot (its view, seq and epoch)."""
        head = _SNAPSHOT_HEAD.match(text, 0, 400)
        if head is None:
            return json.loads(text)
        key = head.group(0)
        found = self._parsed.get(key)
        if found is None:
            found = self._parsed[key] = json.loads(text)
            if len(self._parsed) > 1024:
                self._parsed.popitem(last=False)
        return found

    def start(self) -> None:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._open_session(), self.loop).result(timeout=30)

    async def _open_session(self) -> None:
        import aiohttp

        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                              cookie_jar=aiohttp.DummyCookieJar())

    def watch(self, client: Client, path: str, *, page: int = 1) -> threading.Event:
        """Open ``path`` for ``client`` (choosing ``page``); the event is set once its first snapshot
        of that page arrived or the socket ended."""
        ready = threading.Event()
        self._tasks.append(asyncio.run_coroutine_threadsafe(self._socket(client, path, page, ready), self.loop))
        return ready

    def probe(self, client: Client, campaign_id: int) -> threading.Event:
        """Try to open another team's campaign page; its close code goes to ``client.probes``."""
        ready = threading.Event()
        self._tasks.append(asyncio.run_coroutine_threadsafe(
            self._socket(client, f"/ws/campaigns/{campaign_id}/", 1, ready, probe=campaign_id), self.loop))
        return ready

    async def _socket(self, client: Client, path: str, page: int, ready: threading.Event,
                      probe: int | None = None) -> None:
        import aiohttp
        from django.conf import settings

        headers = {"Origin": self.base, "Cookie": f"{settings.SESSION_COOKIE_NAME}={client.session_key}"}
        label = f"{path}?page={page}"
        try:
            async with self._session.ws_connect(self.ws_base + path, headers=headers, max_msg_size=0,
                                                heartbeat=None, timeout=aiohttp.ClientWSTimeout(ws_close=5)) as ws:
                if page != 1:
                    await ws.send_json({"page": page})
                async for msg in ws:
                    at = time.time()
                    if msg.type != aiohttp.WSMsgType.TEXT:
                        break
                    if probe is not None:
                        client.probes[probe] = None
                        client.errors.append(f"{label}: a snapshot arrived on another team's campaign")
                    data = self.parse(msg.data)
                    client.messages += 1
                    kind, body = data.get("kind"), data.get("data") or {}
                    client.timeline.append((at, f"{kind} {label}", body.get("generated_at") or ""))
                    if kind == "queue.snapshot":
                        client.on_queue(at, body)
                    elif kind == "campaign.snapshot":
                        client.on_campaign(at, body, data.get("as_of"))
                        if body.get("page") != page:
                            continue
                    else:
                        continue
                    if label not in client.connected_at:
                        client.connected_at[label] = at
                        ready.set()
                if probe is not None:
                    client.probes.setdefault(probe, ws.close_code)
                elif not ready.is_set():
                    client.errors.append(f"{label}: closed ({ws.close_code}) before its first snapshot")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - recorded and reported
            client.errors.append(f"{label}: {type(exc).__name__}: {exc}")
        finally:
            ready.set()

    def stop(self) -> None:
        async def close() -> None:
            for task in self._tasks:
                task.cancel()
            await asyncio.sleep(0.2)
            await self._session.close()

        try:
            asyncio.run_coroutine_threadsafe(close(), self.loop).result(timeout=30)
        finally:
            self.loop.call_soon_threadsafe(self.loop.stop)
            self.thread.join(timeout=30)


def _wait(events: Sequence[threading.Event], wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    for event in events:
        event.wait(max(0.0, deadline - time.monotonic()))


# --------------------------------------------------------------------------- load: memory and pages

def rss_bytes(pid: int) -> int:
    """Resident memory of ``pid`` and all its descendants (bytes, ``VmRSS`` of /proc/<pid>/status);
    0 when it is gone."""
    total = 0
    stack = [pid]
    while stack:
        p = stack.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
            for task in Path(f"/proc/{p}/task").iterdir():
                stack += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return total


def service_pids(state_dir: Path) -> dict[str, int]:
    """``{name: pid}`` of the running web server and workers from scripts/services' pid files
    (``<state dir>/run/<name>.pid``)."""
    out = {}
    for name in ("web", "live", "worker", "ingest", "submit", "beat"):
        try:
            pid = int((Path(state_dir) / "run" / f"{name}.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            continue
        if Path(f"/proc/{pid}").exists():
            out[name] = pid
    return out


class LoadSampler(threading.Thread):
    """Every ``period_s`` seconds: the RSS of each process in ``pids``; every ``page_every_s``: one GET
    of each of ``pages()`` (paths) as ``session_key``, timed (seconds, request sent -> body read)."""

    def __init__(self, *, pids: Mapping[str, int], base_url: str, session_key: str,
                 pages: Callable[[], list[str]], period_s: float = 1.0, page_every_s: float = 5.0) -> None:
        super().__init__(name="tco-load-sampler", daemon=True)
        self.pids, self.base, self.session_key, self.pages = dict(pids), base_url.rstrip("/"), session_key, pages
        self.period_s, self.page_every_s = period_s, page_every_s
        self.rss: dict[str, list[int]] = {name: [] for name in self.pids}
        self.page_times: dict[str, list[float]] = {}
        self.page_errors: list[str] = []
        self._stop_event = threading.Event()

    def run(self) -> None:
        from django.conf import settings

        next_pages = time.monotonic()
        while not self._stop_event.is_set():
            for name, pid in self.pids.items():
                self.rss[name].append(rss_bytes(pid))
            if time.monotonic() >= next_pages:
                next_pages = time.monotonic() + self.page_every_s
                for path in self.pages():
                    req = urllib.request.Request(self.base + path, headers={
                        "Cookie": f"{settings.SESSION_COOKIE_NAME}={self.session_key}"})
                    began = time.perf_counter()
                    try:
                        with urllib.request.urlopen(req, timeout=30) as resp:
                            resp.read()
                    except OSError as exc:
                        self.page_errors.append(f"{path}: {exc}")
                        continue
                    kind = "queue page" if path == "/" else "campaign page"
                    self.page_times.setdefault(kind, []).append(time.perf_counter() - began)
            self._stop_event.wait(self.period_s)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=60)


# --------------------------------------------------------------------------- users and sessions

def watcher_users(count: int, projects: Sequence[str] = ("research", "engineering")) -> list:
    """``count`` users ``replay-watch-<project>-NN`` spread over ``projects`` in turn, each a viewer
    (even NN) or launcher (odd NN) of that one team, created or updated (no usable password: they
    log in through a session made here). Raises Team.DoesNotExist."""
    from django.contrib.auth import get_user_model

    from dashboards.models import Role, Team
    from dashboards.core.roles import membership_set

    User = get_user_model()
    teams = [Team.objects.get(project=p) for p in projects]
    users = []
    for i in range(count):
        team = teams[i % len(teams)]
        n = i // len(teams) + 1
        user, created = User.objects.get_or_create(username=f"{WATCHER_PREFIX}{team.project}-{n:02d}")
        if created:
            user.set_unusable_password()
            user.save()
        membership_set(user=user, team=team, role=Role.VIEWER if n % 2 == 0 else Role.LAUNCHER)
        users.append(user)
    return users


def session_for(user) -> str:
    """A new login session for ``user`` in the configured session store; returns its key."""
    from django.conf import settings
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY

    store = import_module(settings.SESSION_ENGINE).SessionStore()
    store[SESSION_KEY] = str(user.pk)
    store[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
    store[HASH_SESSION_KEY] = user.get_session_auth_hash()
    store.create()
    return store.session_key


def team_projects(user) -> set[str]:
    """The projects of the teams ``user`` has a membership of (from Membership)."""
    from dashboards.models import Membership

    return set(Membership.objects.filter(user=user).values_list("team__project", flat=True))


def allowed_campaigns(user, campaign_ids: Iterable[int]) -> set[int]:
    """Of ``campaign_ids``, those ``user`` may see: all for a superuser, else the campaigns whose team
    the user has a membership of (read from Membership, not from the selectors under test)."""
    from dashboards.models import Campaign, Membership

    ids = set(campaign_ids)
    if user.is_superuser:
        return ids
    teams = set(Membership.objects.filter(user=user).values_list("team_id", flat=True))
    return set(Campaign.objects.filter(pk__in=ids, team_id__in=teams).values_list("pk", flat=True))


# --------------------------------------------------------------------------- the whole watch

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
        _wait([self.browsers.watch(client, "/ws/queue/") for client in self.clients], wait_s)
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
                _wait(opened, wait_s)

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
                "rss": rss, "pages": {k: lag_summary(v) for k, v in self.load.page_times.items()},
                "page_errors": self.load.page_errors, "duration_s": (self.stopped_at or time.time()) - self.started_at}


def live_figures(results: dict[str, Any]) -> dict[str, Any]:
    """The report's figures from :meth:`LiveWatch.results`: ``lag`` (the admin's campaign pages,
    item 4), ``wave`` (its first-wave changes), ``queue`` (its queue page's counts), ``load`` (every
    other client's deliveries pooled, item 5), the clients that missed changes or saw too much."""
    clients = results["clients"]
    admin = next((c for c in clients if c["admin"]), None)
    others = [c for c in clients if not c["admin"]]
    out: dict[str, Any] = {"clients": len(others)}
    if admin:
        out["lag"] = {**lag_summary(admin["lag"]["lags"]), "received": admin["lag"]["received"],
                      "expected": admin["lag"]["expected"], "missed": len(admin["lag"]["missed"])}
        out["wave"] = lag_summary(admin["wave_lags"])
        out["queue"] = lag_summary(admin["queue_lags"])
        out["breakdown"] = admin["breakdown"]
    pooled = [x for c in others for x in c["lag"]["lags"]]
    out["load"] = {**lag_summary(pooled), "received": sum(c["lag"]["received"] for c in others),
                   "expected": sum(c["lag"]["expected"] for c in others),
                   "missed": sum(len(c["lag"]["missed"]) for c in others)}
    out["load_breakdown"] = pooled_breakdown([c["breakdown"] for c in others])
    out["load_queue"] = lag_summary([x for c in others for x in c["queue_lags"]])
    out["incomplete"] = [c["user"] for c in clients if c["lag"]["missed"]]
    out["violations"] = {c["user"]: c["violations"] for c in clients if c["violations"]}
    out["errors"] = {c["user"]: c["errors"][:3] for c in clients if c["errors"]}
    return out


def pooled_breakdown(breakdowns: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Several :func:`lag_breakdown` results as one (their parts' lists joined, counts summed)."""
    return {"parts": {label: [x for b in breakdowns for x in b["parts"][label]] for label, _, _ in LAG_PARTS},
            "n": sum(b["n"] for b in breakdowns), "unsplit": sum(b["unsplit"] for b in breakdowns)}


def _s(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def render_live(results: dict[str, Any]) -> list[str]:
    """The report's section "Live lag and load" (lines)."""
    f = live_figures(results)
    lines = ["", "Live lag (item 4): qstat -> browser, WebSocket (seconds; qstat sampled every "
                 f"{results['qstat_period_s']} s, {results['qstat_samples']} samples, median qstat "
                 f"{_s(results['qstat_p50_s'])} s, {results['qstat_errors']} failed)",
             f"{'what':<58} {'n':>6} {'p50':>7} {'p95':>7} {'max':>7} {'min':>7}"]

    def row(label: str, s: dict) -> None:
        lines.append(f"{label:<58} {s['n']:>6} {_s(s['p50']):>7} {_s(s['p95']):>7} {_s(s['max']):>7} "
                     f"{_s(s['min']):>7}")

    def breakdown_rows(b: dict, what: str) -> None:
        lines.append(f"  {what} ({b['n']} changes split; {b['unsplit']} shown first by a snapshot that "
                     "answered no poll's event):")
        for label, _, _ in LAG_PARTS:
            row(f"    {label}", lag_summary(b["parts"][label]))

    if "lag" in f:
        row("admin, campaign pages, every task change", f["lag"])
        row("  the first wave (started before any ended)", f["wave"])
        row("admin, queue page (campaign counts)", f["queue"])
        breakdown_rows(f["breakdown"], "where the admin's lag went")
        lines.append(f"changes qstat saw: {f['lag']['expected']} ({results['wave']} in the first wave); "
                     f"arrived: {f['lag']['received']}; missed: {f['lag']['missed']}")
        p95 = f["lag"]["p95"]
        if p95 is not None:
            lines.append(f"goal p95 <= {LAG_GOAL_S:.0f} s: " + ("met" if p95 <= LAG_GOAL_S else
                                                                 f"MISSED by {p95 - LAG_GOAL_S:.3f} s"))
    if f["clients"]:
        lines += ["", f"Load (item 5): {f['clients']} WebSocket clients of both teams (queue page + page 1 of "
                      f"a campaign of their team) for {results['duration_s']:.0f} s"]
        row("deliveries, campaign pages, all clients", f["load"])
        breakdown_rows(f["load_breakdown"], "where the clients' lag went")
        row("deliveries, queue page counts, all clients", f["load_queue"])
        lines.append(f"changes the clients may see: {f['load']['expected']}; received {f['load']['received']}; "
                     f"missed {f['load']['missed']} (clients missing any: {len(f['incomplete'])}"
                     + (f", e.g. {f['incomplete'][:3]}" if f["incomplete"] else "") + ")")
        lines.append(f"scoping: {len(f['violations'])} client(s) received what they may not see"
                     + (f": {dict(list(f['violations'].items())[:3])}" if f["violations"] else
                        " (other team's campaigns: every probe refused with 4403)"))
        p95 = f["load"]["p95"]
        if p95 is not None:
            lines.append(f"goal p95 delivery <= {LAG_GOAL_S:.0f} s: " + ("met" if p95 <= LAG_GOAL_S else
                                                                          f"MISSED by {p95 - LAG_GOAL_S:.3f} s"))
    sockets = results.get("sockets")
    if sockets:
        lines.append(f"sockets: {sockets['campaign_pages']} campaign-page sockets had their first snapshot, the last "
                     f"{_s(sockets['last_s'])} s after the launch; {sockets['opened']} sockets in all "
                     "(errors included)")
    if f["errors"]:
        lines.append(f"socket errors: {dict(list(f['errors'].items())[:3])}")
    if results["rss"]:
        lines.append("memory (RSS with children, MiB): " + "; ".join(
            f"{name} {v['start'] / 2**20:.0f} -> peak {v['peak'] / 2**20:.0f} -> end {v['end'] / 2**20:.0f}"
            for name, v in results["rss"].items()))
    for kind, s in results["pages"].items():
        lines.append(f"{kind} GET during the run: n {s['n']}, p50 {_s(s['p50'])} s, p95 {_s(s['p95'])} s, "
                     f"max {_s(s['max'])} s (goal <= {PAGE_GOAL_S} s: "
                     + ("met" if s["p95"] is not None and s["p95"] <= PAGE_GOAL_S else "MISSED") + ")")
    if results["page_errors"]:
        lines.append(f"page errors: {results['page_errors'][:3]}")
    return lines


__all__ = ["Sightings", "shown_changes", "task_lags", "count_lags", "lag_breakdown", "pooled_breakdown", "LAG_PARTS", "scope_check", "percentile", "lag_summary", "QstatSampler",
           "Client", "Browsers", "LoadSampler", "LiveWatch", "live_figures", "render_live", "watcher_users",
           "session_for", "allowed_campaigns", "team_projects", "rss_bytes", "service_pids"]
