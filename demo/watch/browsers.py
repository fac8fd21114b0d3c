"""The watch's browser side: WebSocket clients of tco's live pages, logged in as real users.

One event loop in a thread of its own runs every socket (:class:`Browsers`);
each user's arrivals go to its :class:`Client`.
"""
from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import re
import threading
import time
from typing import Sequence

from demo.watch.lags import ENDED, NOT_STARTED, Key, Sightings

__all__ = ["Client", "Browsers", "wait_all", "raise_open_files"]


def raise_open_files() -> int:
    """Raise this process's open-file limit (``RLIMIT_NOFILE``) to its hard limit (its children inherit it):
    500 clients hold 1,000 sockets and more, past the usual soft limit of 1,024. Returns the limit."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


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
        """Take a queue page snapshot (``data``) that arrived at ``at`` (epoch s)."""
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
        """Take a campaign page snapshot (``data``, with its ``as_of`` instants) that arrived at ``at``."""
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


def _unpacked(message: dict) -> dict:
    """A live message with its data's tables unpacked (``dashboards.live.snapshots.unpack``)."""
    from dashboards.live.snapshots import unpack

    if isinstance(message, dict) and isinstance(message.get("data"), dict):
        unpack(message["data"])
    return message



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
        """``json.loads(text)``, once per distinct snapshot (its view, seq and epoch), its tables unpacked as
        the browser's live.js unpacks them (``live.snapshots.unpack``)."""
        head = _SNAPSHOT_HEAD.match(text, 0, 400)
        if head is None:
            return _unpacked(json.loads(text))
        key = head.group(0)
        found = self._parsed.get(key)
        if found is None:
            found = self._parsed[key] = _unpacked(json.loads(text))
            if len(self._parsed) > 1024:
                self._parsed.popitem(last=False)
        return found

    def start(self) -> None:
        """Start the event loop's thread and open the HTTP session (waits up to 30 s); the open-file limit is
        raised first (:func:`raise_open_files`)."""
        raise_open_files()
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
        """Cancel every socket, close the session and end the loop's thread."""
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


def wait_all(events: Sequence[threading.Event], wait_s: float) -> None:
    """Wait for every event, ``wait_s`` seconds at most in all."""
    deadline = time.monotonic() + wait_s
    for event in events:
        event.wait(max(0.0, deadline - time.monotonic()))
