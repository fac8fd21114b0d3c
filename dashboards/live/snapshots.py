"""The live views: what each one is (a key), which source feeds it, how it is built, and how a page
reads its latest snapshot.

A view is the same bytes for everyone who may open it:

- ``queue/<scope>/<page>``: the queue page (``queue.queue_summary``) for one audience scope
  (``core.scope.Scope.key``: ``admin`` or ``teams:1,4``), one page of its campaign list;
- ``depth/<scope>``: the queue page's depth history (``queue.queue_depth_history``);
- ``campaign/<id>/<page>[?state=&sort=&dir=desc&q=&host=]``: a campaign page
  (``campaign.campaign_detail``), the same for every user who may see the campaign;
- ``task/<id>/<campaign id or 0>``: an agent page (``task.task_detail``).

Who may open which view is checked once per socket (``dashboards.live.consumers``) and per page
GET, with the same selectors as every other read; a view's key names its audience, so a payload
built for one scope is never sent on another scope's socket.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import urllib.parse
from typing import Any

from django.conf import settings
from django.utils import timezone

from dashboards.core import live_bus
from dashboards.core.scope import EVERYTHING, Scope
from dashboards.live.counts import LiveCounts, live_counts
from dashboards.live.tiles import scope_tiles

log = logging.getLogger(__name__)

QUEUE, DEPTH, CAMPAIGN, TASK = "queue", "depth", "campaign", "task"
KINDS = {QUEUE: "queue.snapshot", DEPTH: "queue.depth", CAMPAIGN: "campaign.snapshot", TASK: "task.snapshot"}
#: Pages beyond this are shown as this one (a key per page number is a view to build).
MAX_PAGE = 10_000


class Gone(Exception):
    """What the view shows no longer exists (a deleted campaign or task)."""


@dataclasses.dataclass(frozen=True)
class View:
    kind: str
    scope: str = ""                  # queue, depth: the audience (core.scope.Scope.key)
    id: int = 0                      # campaign, task
    campaign: int = 0                # task: its campaign (0: a job tco did not launch)
    page: int = 1
    state: str | None = None         # campaign: the task table's choices (campaign.task_table_choice)
    sort: str | None = None
    descending: bool = False
    q: str = ""
    host: str | None = None

    @property
    def key(self) -> str:
        if self.kind == QUEUE:
            return f"queue/{self.scope}/{self.page}"
        if self.kind == DEPTH:
            return f"depth/{self.scope}"
        if self.kind == TASK:
            return f"task/{self.id}/{self.campaign}"
        choice = [(k, v) for k, v in (("state", self.state), ("sort", self.sort),
                                      ("dir", "desc" if self.descending else None), ("q", self.q or None),
                                      ("host", self.host)) if v is not None]
        return f"campaign/{self.id}/{self.page}" + ("?" + urllib.parse.urlencode(choice) if choice else "")

    @property
    def source(self) -> str:
        if self.kind in (QUEUE, TASK) and not (self.kind == TASK and self.campaign):
            return live_bus.QUEUE
        if self.kind == DEPTH:
            return live_bus.DEPTH
        return live_bus.campaign_source(self.campaign if self.kind == TASK else self.id)

    @classmethod
    def parse(cls, key: str) -> "View":
        """The view of ``key``; ValueError for anything that is not one."""
        path, _, query = key.partition("?")
        parts = path.split("/")
        kind = parts[0]
        if kind == QUEUE and len(parts) == 3:
            Scope.from_key(parts[1])
            return cls(QUEUE, scope=parts[1], page=_page(parts[2]))
        if kind == DEPTH and len(parts) == 2:
            Scope.from_key(parts[1])
            return cls(DEPTH, scope=parts[1])
        if kind == TASK and len(parts) == 3:
            return cls(TASK, id=int(parts[1]), campaign=int(parts[2]))
        if kind == CAMPAIGN and len(parts) == 3:
            choice = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
            return campaign_view(int(parts[1]), page=_page(parts[2]), state=choice.get("state"),
                                 sort=choice.get("sort"), direction=choice.get("dir"), q=choice.get("q"),
                                 host=choice.get("host"))
        raise ValueError(f"not a live view: {key!r}")


def _page(value: Any) -> int:
    page = int(value)
    if page < 1:
        raise ValueError("page < 1")
    return min(page, MAX_PAGE)


def queue_view(scope: Scope, page: int = 1) -> View:
    return View(QUEUE, scope=scope.key, page=max(1, min(int(page or 1), MAX_PAGE)))


def depth_view(scope: Scope) -> View:
    return View(DEPTH, scope=scope.key)


def campaign_view(campaign_id: int, *, page: int = 1, state: str | None = None, sort: str | None = None,
                  direction: str | None = None, q: str | None = None, host: str | None = None) -> View:
    """A campaign page's view from a request's or a socket's choices, checked as the page checks them."""
    from schedulers import base

    from dashboards.live import campaign, cluster

    if state == "waiting":   # the tasks waiting for the predecessor are held (campaign_detail)
        state = "held"
    if state not in base.LIFECYCLE_STATES:
        state = None
    table = campaign.task_table_choice(sort, direction, q)
    return View(CAMPAIGN, id=int(campaign_id), page=max(1, min(int(page or 1), MAX_PAGE)), state=state,
                sort=table["sort"], descending=table["descending"], q=table["q"], host=cluster.host_filter(host))


def task_view(task_id: int, campaign_id: int | None) -> View:
    return View(TASK, id=int(task_id), campaign=int(campaign_id or 0))


class BuildContext:
    """What the views of one producer pass share: the unscoped live counts, read once."""

    def __init__(self) -> None:
        self._counts: LiveCounts | None = None
        self._campaigns: dict[int, dict[str, Any]] = {}
        self._tiles: dict[str, list[dict[str, Any]]] = {}

    def counts(self) -> LiveCounts:
        if self._counts is None:
            self._counts = live_counts()
        return self._counts

    def tiles(self, scope_key: str) -> list[dict[str, Any]]:
        """The landing tiles of audience ``scope_key`` (``live.tiles.scope_tiles``), built once per pass for all
        the queue pages of that audience."""
        found = self._tiles.get(scope_key)
        if found is None:
            found = self._tiles[scope_key] = scope_tiles(Scope.from_key(scope_key),
                                                         seat_resource=settings.TCO_SEAT_RESOURCE, now=timezone.now())
        return found

    def campaign(self, campaign_id: int) -> dict[str, Any]:
        """A campaign's page-independent parts (``campaign.campaign_whole``), read once per pass for all the
        views of that campaign (its pages, filters and sorts). Raises ``Campaign.DoesNotExist``."""
        from dashboards.live import campaign

        whole = self._campaigns.get(campaign_id)
        if whole is None:
            whole = self._campaigns[campaign_id] = campaign.campaign_whole(EVERYTHING, campaign_id)
        return whole


def build(view: View, ctx: BuildContext | None = None) -> dict[str, Any]:
    """What ``view`` shows now (JSON-ready). Raises :class:`Gone`."""
    from dashboards.live import campaign, queue
    from dashboards.live import task as live_task
    from dashboards.models import Campaign, Task

    ctx = ctx or BuildContext()
    if view.kind == QUEUE:
        return queue.queue_summary(Scope.from_key(view.scope), seat_resource=settings.TCO_SEAT_RESOURCE,
                                   page=view.page, counts=ctx.counts(), tiles=ctx.tiles(view.scope))
    if view.kind == DEPTH:
        scope = Scope.from_key(view.scope)
        return {"hour": queue.queue_depth_history(scope, "hour"), "day": queue.queue_depth_history(scope, "day")}
    if view.kind == CAMPAIGN:
        try:
            return campaign.campaign_detail(EVERYTHING, view.id, page=view.page, state=view.state, sort=view.sort,
                                            descending=view.descending, q=view.q, host=view.host,
                                            whole=ctx.campaign(view.id))
        except Campaign.DoesNotExist:
            raise Gone(view.key) from None
    if view.kind == TASK:
        try:
            return live_task.task_detail(EVERYTHING, view.id)
        except Task.DoesNotExist:
            raise Gone(view.key) from None
    raise ValueError(view.kind)


#: The keys of a view's data whose list of rows (dicts with the same keys) travels as a table:
#: ``{"columns": [key, ...], "rows": [[value, ...], ...]}``. A campaign page's 100 task rows were 40 of
#: its 42 KB as dicts, each repeating its 23 keys; as a table they are about a third of that, to encode
#: once, to send on every socket and to parse in every browser (issue 22: 500 sockets on one view).
TABLES = ("tasks",)


def pack_rows(rows: list[dict]) -> dict[str, list]:
    """``rows`` (dicts with the same keys, in the same order) as ``{"columns", "rows"}``; :func:`unpack_rows`
    gives them back."""
    columns = list(rows[0]) if rows else []
    return {"columns": columns, "rows": [[row[c] for c in columns] for row in rows]}


def unpack_rows(table: Any) -> Any:
    """The list of dicts that :func:`pack_rows` packed (anything else is returned as it is). The browser's
    ``TCO.unpack`` (static/js/live.js) does the same."""
    if isinstance(table, dict) and set(table) == {"columns", "rows"}:
        columns = table["columns"]
        return [dict(zip(columns, row)) for row in table["rows"]]
    return table


def unpack(data: dict) -> dict:
    """A view's ``data`` as its builder returned it: the :data:`TABLES` unpacked (in place; returns it)."""
    for key in TABLES:
        if key in data:
            data[key] = unpack_rows(data[key])
    return data


def body(view: View, data: dict, *, seq: int, epoch: str, as_of: dict) -> bytes:
    """The JSON text a browser gets: ``{"kind", "view", "seq", "epoch", "as_of", "data"}``; ``seq`` counts
    the view's snapshots (1, 2, ...; a new ``epoch`` when the store lost them). The :data:`TABLES` in
    ``data`` travel packed (:func:`pack_rows`)."""
    data = {k: pack_rows(v) if k in TABLES and isinstance(v, list) else v for k, v in data.items()}
    return json.dumps({"kind": KINDS[view.kind], "view": view.key, "seq": seq, "epoch": epoch, "as_of": as_of,
                       "data": data}, separators=(",", ":")).encode()


# --------------------------------------------------------------------------- page GETs

def current(view: View) -> dict[str, Any] | None:
    """The latest snapshot of ``view`` for a page GET, as the JSON message (``kind``, ``view``, ``seq``,
    ``epoch``, ``as_of``, ``data``), or None: the caller then reads the database itself.

    Registers the view (the page's socket follows) and, when it was not watched, wakes the producer to
    build it. A view someone already watches is served as stored: the producer keeps it, and a
    change committed a moment ago reaches the page through its socket as it reaches every other. A
    view nobody watched may be older than its source's latest change, or have no snapshot: None, and
    the page reads the database (sync views share one thread per web process: nothing here waits).
    None too when the live store does not answer (Redis down)."""
    store = live_bus.bus()
    # A campaign page searched or filtered by host is one user's view of the moment: a GET of it does
    # not ask the producer to keep it (its socket does, while it is open). Every distinct ?q= registered
    # by a GET was rebuilt at each change for a minute: a viewer's stream of GETs slowed every user's
    # live pages (the fresh attack's A2).
    personal = view.kind == CAMPAIGN and bool(view.q or view.host)
    try:
        record, gen, watched = store.snapshot(view.key, view.source, register=not personal)
        if personal and record is None:
            return None
        if not watched and not personal:
            store.wake()
    except Exception:  # noqa: BLE001 - the page reads the database instead
        log.warning("live store unavailable for %s; the page reads the database", view.key, exc_info=True)
        return None
    if record is None or (not watched and record.gen < gen):
        return None
    message = json.loads(record.body)
    unpack(message["data"])
    return message
